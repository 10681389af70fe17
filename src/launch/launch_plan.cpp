// accelerant::prepare_launch: what launch will make of this process, decided from the same
// launch contract that launch_serialized reads (fork_launcher.cpp), so that the two agree.
#include "accelerant/launch_plan.h"

#include <ATen/Parallel.h>

#include "accelerant/launch_contract.h"

namespace accelerant {

LaunchPlan prepare_launch(const LaunchOptions& options) {
  const LaunchContract outer = read_launch_contract();
  LaunchPlan plan;
  plan.forks_workers = !outer.launched();
  if (plan.forks_workers) {
    plan.world_size = options.processes_per_node() * options.num_nodes();
    plan.is_main_process = options.node_rank() == 0;
    // Keeps this process's thread pools unstarted until the fork (launch_plan.h).
    at::set_num_threads(1);
  } else {
    plan.world_size = outer.world_size;
    plan.is_main_process = outer.rank == 0;
  }
  return plan;
}

}  // namespace accelerant
