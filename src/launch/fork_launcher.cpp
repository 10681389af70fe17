// accelerant::launch_serialized: the launcher's agent (agent.h) with what a LibTorch process must
// add around fork(): refuse when CUDA is initialised, count the thread pools a child would miss,
// the debug-mode dry fork, size each worker's pools and forget the parent's process state, and
// leave the group cleanly.
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <thread>

#include "accelerant/launch.h"
#include "accelerant/launch_contract.h"
#include "accelerant/process_state.h"
#include "base/cpu_settings.h"
#include "base/exit_hooks.h"
#include "base/text.h"
#include "base/torch_compat.h"
#include "base/uncaught_exception_recorder.h"
#include "comm/process_state_fork.h"
#include "launch/agent.h"
#include "launch/failure_report.h"
#include "launch/signal_guard.h"

namespace accelerant::detail {
namespace {

using Clock = std::chrono::steady_clock;

void refuse_if_cuda_initialized() {
  if (!cuda_initialized()) return;
  throw LaunchError(
      "accelerant::launch: CUDA has already been initialised in this process, and a forked child "
      "cannot use CUDA then (its first CUDA call would fail with an initialisation error or "
      "hang). Likely cause: a CUDA tensor, model.to(torch::kCUDA) or a CUDA query such as "
      "torch::cuda::is_available() or torch::manual_seed() (which seeds every GPU) ran before "
      "launch. Fix: do "
      "everything that touches CUDA inside the launched function, build models on the CPU before "
      "launch, or start the job with `accelerant launch` (separate processes).");
}

// Debug mode: fork one throwaway child that does what a worker's first steps do, so that a fork
// problem shows up as an error here instead of as N hung workers.
void dry_fork(int threads, std::chrono::milliseconds limit) {
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    SignalGuard::reset_in_child();
    set_compute_threads(threads);
    auto x = torch::ones({256, 256});
    volatile float sink = x.matmul(x).sum().item<float>();
    (void)sink;
    ::_exit(0);
  }
  const auto deadline = Clock::now() + limit;
  int status = 0;
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (Clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      throw LaunchError(str(
          "accelerant::launch (debug mode): a dry-run forked worker did not finish a small "
          "matrix product within ",
          limit.count(), " ms with ", threads,
          " thread(s). Likely cause: "
          "thread pools inherited from this process. Fix: set threads_per_process(1), or launch "
          "before running LibTorch ops in this process."));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  auto exit = worker_exit_from_status(-1, -1, pid, status);
  if (is_failure(exit)) {
    throw LaunchError(str("accelerant::launch (debug mode): a dry-run forked worker ended with ",
                          describe_exit(exit),
                          " before running any user code. Fix: run the "
                          "program under gdb with `set follow-fork-mode child`."));
  }
}

AgentHooks libtorch_hooks() {
  AgentHooks hooks;
  hooks.check_before_fork = refuse_if_cuda_initialized;
  hooks.fork_unsafe_threads = fork_unsafe_thread_count;
  hooks.dry_fork = dry_fork;
  hooks.prepare_worker = [](int threads) {
    set_compute_threads(threads);
    forget_process_state_after_fork();
  };
  hooks.finish_worker = [] { ProcessState::shutdown(); };
  hooks.describe_exception = exception_text;
  hooks.gpu_available = nvidia_gpu_present;
  return hooks;
}

}  // namespace
}  // namespace accelerant::detail

namespace accelerant {

std::vector<std::vector<char>> launch_serialized(const LaunchOptions& options,
                                                 const WorkerBody& body) {
  const LaunchContract outer = read_launch_contract();
  if (!outer.launched()) return detail::run_agent(options, body, detail::libtorch_hooks());
  // Started by a launcher: this process is one rank of the outer job. Forking a group here would
  // make a second, independent job per rank (both writing the same checkpoints), so fn runs here.
  if (options.verbose() && outer.rank == 0 &&
      options.processes_per_node() != outer.local_world_size) {
    std::fprintf(stderr,
                 "accelerant::launch: this process was started by %s as rank 0 of %d, so the "
                 "function runs in each of the job's processes (processes_per_node(%d) does not "
                 "apply: the outer launcher chose %d per machine).\n",
                 to_string(outer.source), outer.world_size, options.processes_per_node(),
                 outer.local_world_size);
  }
  // The outer launcher's failure report (ours, or torchrun's summary) quotes what fn threw.
  detail::record_uncaught_exceptions_to(outer.error_file, outer.torchelastic_error_file);
  try {
    return {body(outer.rank)};
  } catch (...) {
    // This process is the worker: it ends as a forked worker does, reporting what fn threw on
    // stderr and in the outer launcher's error file, with exit status 1. Rethrown, it would reach
    // a main without a try (docs/using.md's has none) and end in std::terminate's "terminate
    // called after throwing an instance of ...", and abort.
    const auto exception = std::current_exception();
    detail::record_exception(exception);
    std::fprintf(stderr, "%sworker failed with an uncaught exception: %s\n",
                 rank_prefix(outer.rank, outer.world_size).c_str(),
                 detail::exception_text(exception).c_str());
    detail::run_exit_hooks();  // _exit skips atexit, where they would run
    std::cout.flush();
    std::fflush(nullptr);
    // _exit, not exit: threads that fn started (a process group's) may still run, and static
    // destructors must not pull their state from under them.
    ::_exit(1);
  }
}

}  // namespace accelerant
