// accelerant::prepare_launch: the steps a program takes before accelerant::launch, in one call
// that returns what the program needs to know about the job (docs/launching.md "Before launch").
//
//   int main(int argc, char** argv) {
//     const auto options = accelerant::LaunchOptions().processes_per_node(2);
//     const auto plan = accelerant::prepare_launch(options);  // first, before any LibTorch op
//     auto data = load_data();                                // single-threaded when forking
//     auto results = accelerant::launch(train, std::cref(data), options);
//     if (plan.is_main_process)
//       std::printf("accuracy %.2f on %d processes\n", results.front(), plan.world_size);
//   }
//
// One binary runs under every launcher (launch.h): started by hand, launch forks the group;
// started by `accelerant launch`, torchrun, srun or mpirun, it runs the function here as this
// process's rank. What the program does around launch differs between the two, and the plan says
// which case this is.
#pragma once

#include "accelerant/launch_options.h"

namespace accelerant {

/// What accelerant::launch(fn, ..., options) will make of this process, known before it runs.
struct LaunchPlan {
  /// True when launch will fork options.processes_per_node workers here: no outer launcher
  /// started this process (read_launch_contract().launched() is false). False when an outer
  /// launcher did: launch then runs fn in this process as its rank.
  bool forks_workers = true;
  /// Processes in the whole job, across every machine: the outer launcher's world size
  /// (LaunchContract::world_size) when one started this process, else
  /// options.processes_per_node × options.num_nodes.
  int world_size = 1;
  /// True in the one process of the job that should report for it (print a summary, write the
  /// final result): rank 0 under an outer launcher; when forking, the process on node_rank 0 (its
  /// launch returns the results of ranks 0 to processes_per_node − 1, so front() is rank 0's).
  bool is_main_process = true;
};

/// Reads the launch contract (read_launch_contract) and, when launch will fork workers, sets this
/// process's intra-op threads to 1 (torch::set_num_threads(1)); returns the plan.
///
/// Why the threads: once this process has run LibTorch ops on several threads, its thread pools
/// exist in a forked worker only as bookkeeping and the worker's first multi-threaded op would
/// wait forever, so launch then makes every worker single-threaded (docs/launching.md "Threads
/// and fork"). What the program does before launch (reading the data, building the model) must
/// therefore run on one thread for the workers to get options.threads_per_process threads each.
/// launch cannot do this itself: by the time it is called, that work has run. Call
/// prepare_launch first, before any LibTorch op; this process keeps one thread afterwards.
/// Under an outer launcher nothing is forked and the thread count is left alone (the
/// Accelerator sizes it, cpu_settings.h).
///
/// Pass the options that will be passed to launch. Throws EnvironmentError when the launcher's
/// variables are invalid (as read_launch_contract does).
LaunchPlan prepare_launch(const LaunchOptions& options);

}  // namespace accelerant
