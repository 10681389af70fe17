#include "launch/failure_report.h"

#include <sys/wait.h>

#include <chrono>
#include <cstring>

#include "base/text.h"
#include "comm/flight_record.h"

namespace accelerant::detail {
namespace {

std::string signal_name(int sig) {
  const char* abbrev = ::sigabbrev_np(sig);
  return abbrev ? std::string("SIG") + abbrev : "unknown signal";
}

std::string indent(const std::string& text) {
  std::string out = "  | ";
  for (char c : text) {
    out += c;
    if (c == '\n') out += "  | ";
  }
  if (out.size() >= 4 && out.compare(out.size() - 4, 4, "  | ") == 0) out.resize(out.size() - 4);
  if (!out.empty() && out.back() != '\n') out += '\n';
  return out;
}

std::string cause_and_fix(const WorkerExit& exit) {
  if (exit.signal == SIGKILL) {
    return "Likely cause: the worker was killed from outside, often by the kernel's out-of-memory "
           "killer (see `dmesg`) or by a scheduler. Fix: lower memory per worker (batch size, "
           "processes per node) or set max_restarts to survive transient kills.";
  }
  // An uncaught exception ends an exec'd worker through std::terminate, i.e. SIGABRT, after the
  // worker recorded it: the exception, not a native crash, is the cause.
  if (exit.signal == SIGABRT && !exit.error_text.empty()) {
    return "Likely cause: an uncaught exception in the worker (its text is above; the process "
           "then aborted). Fix: correct what it names; with other ranks failing at the same time, "
           "the first rank's error is usually the real one.";
  }
  if (exit.signal == SIGSEGV || exit.signal == SIGBUS || exit.signal == SIGABRT ||
      exit.signal == SIGFPE || exit.signal == SIGILL) {
    return "Likely cause: a crash in native code (an invalid memory access or a failed assertion). "
           "Fix: run the worker function in a single process under gdb, or with "
           "ACCELERANT_DEBUG_MODE=1 to check collectives across ranks.";
  }
  if (exit.signal != 0) {
    return "Likely cause: the worker received a signal that ends it. Fix: find who sent it.";
  }
  if (!exit.error_text.empty()) {
    return "Likely cause: an uncaught exception in the worker function (its text is above). Fix: "
           "correct what it names; with other ranks failing at the same time, the first rank's "
           "error is usually the real one.";
  }
  return "Likely cause: the worker called exit() with this code. Fix: look at its output above.";
}

// One table of the ranks' last collectives, from the flight records their communicators wrote
// when a collective failed (none when no worker wrote one).
std::string merged_flight_records(const std::vector<std::string>& texts) {
  std::vector<RankFlightRecord> records;
  for (const auto& text : texts) {
    RankFlightRecord record;
    if (parse_flight_record(text, record)) records.push_back(std::move(record));
  }
  if (records.empty()) return "";
  const auto now = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::system_clock::now().time_since_epoch());
  return merged_flight_table(records, now.count());
}

}  // namespace

std::string describe_exit(const WorkerExit& exit) {
  if (exit.signal != 0) return str("signal ", exit.signal, " (", signal_name(exit.signal), ")");
  return str("exit code ", exit.exit_code);
}

bool is_failure(const WorkerExit& exit) { return exit.signal != 0 || exit.exit_code != 0; }

WorkerExit worker_exit_from_status(int rank, int local_rank, int pid, int wait_status) {
  WorkerExit exit;
  exit.rank = rank;
  exit.local_rank = local_rank;
  exit.pid = pid;
  if (WIFSIGNALED(wait_status)) {
    exit.signal = WTERMSIG(wait_status);
  } else if (WIFEXITED(wait_status)) {
    exit.exit_code = WEXITSTATUS(wait_status);
  }
  return exit;
}

std::string failure_report(const WorkerExit& exit, int node_rank, int attempt, int max_restarts,
                           const std::vector<std::string>& flight_records) {
  std::string report =
      str("worker rank ", exit.rank, " (local rank ", exit.local_rank, " on node ", node_rank,
          ", pid ", exit.pid, ") failed with ", describe_exit(exit), " in attempt ", attempt + 1,
          " of ", max_restarts + 1, " (max_restarts=", max_restarts, ").\n");
  if (!exit.error_text.empty()) report += "Its error:\n" + indent(exit.error_text);
  if (!exit.stderr_tail.empty()) report += "Last lines of its stderr:\n" + indent(exit.stderr_tail);
  report += merged_flight_records(flight_records);
  return report + cause_and_fix(exit);
}

std::string early_exit_report(const WorkerExit& exit, const std::vector<int>& waiting,
                              std::chrono::seconds idle, int node_rank, int attempt,
                              int max_restarts) {
  std::string report =
      str("worker rank ", exit.rank, " (local rank ", exit.local_rank, " on node ", node_rank,
          ", pid ", exit.pid, ") exited with ", describe_exit(exit), " while rank(s) ",
          join(waiting, ", "), " still ran, and those then sat idle for ", idle.count(),
          " s, in attempt ", attempt + 1, " of ", max_restarts + 1, " (max_restarts=", max_restarts,
          "): they were most likely waiting in a collective that rank ", exit.rank,
          " skipped, and would have waited until the collective timeout. The group was stopped.\n");
  if (!exit.stderr_tail.empty()) report += "Last lines of its stderr:\n" + indent(exit.stderr_tail);
  return report + str("Likely cause: rank ", exit.rank,
                      " returned before the others (an early return or exit on some ranks only, or "
                      "fewer steps or batches than the others), skipping collectives they run. "
                      "Fix: make every rank run the same collectives in the same order and return "
                      "together; when one rank does extra work at the end, finish it with a "
                      "wait_for_everyone() that every rank reaches.");
}

}  // namespace accelerant::detail
