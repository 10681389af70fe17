#include "cpu_defaults.h"

#include <malloc.h>
#include <sched.h>
#include <torch/torch.h>

#include <algorithm>
#include <thread>

#include "thread_config.h"

namespace accelerant::detail {
namespace {

// CPUs this process may run on (cgroup and taskset limits included), not the machine's total.
int usable_cpus() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

}  // namespace

CpuDefaults apply_cpu_defaults(const DistributedEnv& env, const EnvLookup& lookup) {
  CpuDefaults applied;
  if (env.threads_per_process > 0) {
    applied.threads = env.threads_per_process;
    applied.threads_from = "launcher (ACCELERANT_THREADS_PER_PROCESS)";
  } else if (auto omp = lookup("OMP_NUM_THREADS"); omp && !omp->empty()) {
    applied.threads = torch::get_num_threads();
    applied.threads_from = "OMP_NUM_THREADS";
  } else {
    applied.threads = std::max(1, usable_cpus() / std::max(1, env.local_world_size));
    applied.threads_from = "cores / local processes";
  }
  // Also when the count is unchanged: OpenBLAS's pool is separate and still at its own default.
  set_compute_threads(applied.threads);
  applied.malloc_tuned = mallopt(M_MMAP_THRESHOLD, static_cast<int>(kMmapThresholdBytes)) == 1 &&
                         mallopt(M_TRIM_THRESHOLD, static_cast<int>(kTrimThresholdBytes)) == 1;
  return applied;
}

}  // namespace accelerant::detail
