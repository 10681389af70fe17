// Turns how a worker ended into the text users read: what happened (exit code or signal), the
// worker's own error, the tail of its stderr, the likely cause and the fix.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "accelerant/error.h"

namespace accelerant::detail {

/// "exit code 3", "signal 9 (SIGKILL)".
std::string describe_exit(const WorkerExit& exit);

/// True when the exit status means failure (non-zero code or any signal).
bool is_failure(const WorkerExit& exit);

/// WorkerExit from a waitpid status.
WorkerExit worker_exit_from_status(int rank, int local_rank, int pid, int wait_status);

/// The full report of the first failure, for LaunchError and restart notices. `flight_records`:
/// the contents of this machine's workers' flight record files (comm/flight_record.h; empty or
/// unreadable ones are skipped), merged into one table of each rank's last collective with a
/// verdict when any is there.
std::string failure_report(const WorkerExit& exit, int node_rank, int attempt, int max_restarts,
                           const std::vector<std::string>& flight_records = {});

/// The report of a worker that exited successfully (`exit`) while the ranks `waiting` still ran
/// and then stayed idle for `idle`: most likely waiting in a collective it skipped.
std::string early_exit_report(const WorkerExit& exit, const std::vector<int>& waiting,
                              std::chrono::seconds idle, int node_rank, int attempt,
                              int max_restarts);

}  // namespace accelerant::detail
