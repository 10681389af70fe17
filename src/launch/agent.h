// The launcher's agent (validate the options, host or join the job's store, fork the local group,
// watch it, restart it, report), for the two public entry points built on it: launch_serialized
// (which first checks for an outer launcher) and launch_program (`accelerant launch`, which always
// starts its own group). It needs no
// LibTorch: what only a LibTorch process must do around a fork comes in as AgentHooks, which
// launch_serialized fills (fork_launcher.cpp) and launch_program leaves empty, because its workers
// exec a fresh program.
#pragma once

#include <chrono>
#include <exception>
#include <functional>
#include <string>
#include <vector>

#include "accelerant/launch_options.h"

namespace accelerant::detail {

struct AgentHooks {
  /// Before anything is forked: throws LaunchError when this process cannot fork workers safely
  /// (CUDA already initialised). Default: nothing.
  std::function<void()> check_before_fork;
  /// Threads of this process that a forked worker's thread pools would miss (LibTorch's OpenMP
  /// pool); when there are any, forked workers run single-threaded. Default: 0.
  std::function<int()> fork_unsafe_threads;
  /// Debug mode: fork one throwaway worker with `threads` threads that does a worker's first
  /// steps; throws LaunchError when it hangs past `limit` or fails. Default: none.
  std::function<void(int threads, std::chrono::milliseconds limit)> dry_fork;
  /// In each forked worker, before its body: size its thread pools and forget the parent's process
  /// state. Default: nothing.
  std::function<void(int threads)> prepare_worker;
  /// In each forked worker, after its body returned: leave the group cleanly. Default: nothing.
  std::function<void()> finish_worker;
  /// The text of a worker's uncaught exception for the failure report. Default: what().
  std::function<std::string(std::exception_ptr)> describe_exception;
  /// Whether the workers will find a GPU (the banner says "GPUs" then). Default: a CUDA build of
  /// LibTorch and an NVIDIA device present.
  std::function<bool()> gpu_available;
};

/// Forks, watches and restarts the local group (launch_serialized without the in-place rule):
/// options.processes_per_node workers running `body`; returns each local worker's bytes in local
/// rank order; throws LaunchError (see launch_serialized).
std::vector<std::vector<char>> run_agent(const LaunchOptions& options, const WorkerBody& body,
                                         const AgentHooks& hooks);

/// The workers' collective timeout: options.collective_timeout(), else this process's
/// ACCELERANT_TIMEOUT_MS (the user's choice), else 30 minutes.
std::chrono::milliseconds resolved_timeout(const LaunchOptions& options);

}  // namespace accelerant::detail
