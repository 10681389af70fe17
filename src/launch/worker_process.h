// One forked worker: its pipes, its environment, its thread settings, and the wrapper that runs
// the user's function, records its result or its uncaught exception, and leaves with _exit (the
// parent's atexit handlers and static destructors must not run twice).
#pragma once

#include <sys/types.h>

#include <map>
#include <string>
#include <vector>

#include "accelerant/launch_options.h"
#include "base/file_io.h"
#include "launch/agent.h"
#include "launch/output_relay.h"

namespace accelerant::detail {

struct WorkerSpec {
  int rank = 0;        // global
  int world_size = 1;  // ranks in the job, across machines
  int local_rank = 0;  // on this machine
  int threads = 1;
  std::map<std::string, std::string> environment;
  std::string result_path;  // the serialised return value, written on success
  std::string error_path;   // the uncaught exception's text, written on failure
};

struct WorkerProcess {
  WorkerSpec spec;
  pid_t pid = -1;
  bool running = false;
  int wait_status = 0;  // from waitpid, valid once !running
};

/// Exit code of a worker that found its parent gone before it started.
constexpr int kExitParentGone = 125;

/// Forks a worker running `body`, relaying its stdout/stderr through `relay`; the worker calls
/// hooks.prepare_worker before the body and hooks.finish_worker after it. The worker leads its own
/// session and process group (id = its pid, as torchrun's workers do), which what it starts joins
/// unless it leaves on purpose: signal_worker stops the worker and its background processes
/// together. Its own session rather than only its own group: a background group of the
/// launcher's session would be stopped (SIGTTIN) when it reads the terminal.
WorkerProcess start_worker(const WorkerSpec& spec, const WorkerBody& body, const AgentHooks& hooks,
                           OutputRelay& relay);

/// Sends `signal` to the process group of the worker `pid` (to the worker alone in the moment
/// before it made its group).
void signal_worker(pid_t pid, int signal);

/// What is left of a worker's process group: the processes not yet ended (zombies do not count),
/// the CPU time they used so far, in clock ticks, and with_io the bytes they read and wrote.
/// `members` identifies which processes those are (pids and start times): it changes when one
/// starts or ends, which is work too (a script's tools come and go, and take their counters along).
struct GroupUsage {
  int alive = 0;
  long long cpu_ticks = 0;
  long long io_bytes = 0;
  unsigned long long members = 0;
};

/// GroupUsage of each process group in `groups` (same order), from one pass over /proc.
std::vector<GroupUsage> process_group_usage(const std::vector<pid_t>& groups, bool with_io = false);
WorkerProcess start_worker(const WorkerSpec& spec, const WorkerBody& body, const AgentHooks& hooks,
                           OutputRelay& relay);

}  // namespace accelerant::detail
