#include "cpu_defaults.h"

#include <malloc.h>
#include <sched.h>
#include <torch/torch.h>

#include <algorithm>
#include <thread>

#include "accelerant/cpu_settings.h"
#include "thread_config.h"

namespace accelerant::detail {
namespace {

// CPUs this process may run on (cgroup and taskset limits included), not the machine's total.
int usable_cpus() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

// LibTorch's intra-op thread count before the program could change it, read when this library is
// loaded (after LibTorch's own initialisation). Not a constant: Debian's LibTorch starts with 1,
// other builds with the number of cores.
const int kLibTorchDefaultThreads = torch::get_num_threads();

}  // namespace

CpuDefaults apply_cpu_defaults(const DistributedEnv& env, const EnvLookup& lookup) {
  CpuDefaults applied;
  if (env.threads_per_process > 0) {
    applied.threads = env.threads_per_process;
    applied.threads_from = "launcher (ACCELERANT_THREADS_PER_PROCESS)";
  } else if (auto omp = lookup("OMP_NUM_THREADS"); omp && !omp->empty()) {
    applied.threads = torch::get_num_threads();
    applied.threads_from = "OMP_NUM_THREADS";
  } else if (torch::get_num_threads() != kLibTorchDefaultThreads) {
    // Changed since the library was loaded: the program chose, e.g. with torch::set_num_threads
    // before creating the Accelerator.
    applied.threads = torch::get_num_threads();
    applied.threads_from = "the program (torch::set_num_threads)";
  } else {
    applied.threads = std::max(1, usable_cpus() / std::max(1, env.local_world_size));
    applied.threads_from = "cores / local processes";
  }
  // Also when the count is unchanged: OpenBLAS's pool is separate and still at its own default.
  detail::set_compute_threads(applied.threads);
  applied.malloc_tuned = keep_freed_memory_in_heap();
  return applied;
}

}  // namespace accelerant::detail

namespace accelerant {

void set_compute_threads(int threads) { detail::set_compute_threads(threads); }

bool keep_freed_memory_in_heap() {
  constexpr int kMmapThresholdBytes = 32 * 1024 * 1024;  // glibc refuses more (HEAP_MAX_SIZE / 2)
  constexpr int kTrimThresholdBytes = 1024 * 1024 * 1024;
  // Both together: raising only the trim threshold was measured to make the faults far worse
  // (../shared/DESIGN.md, platform facts).
  return mallopt(M_MMAP_THRESHOLD, kMmapThresholdBytes) == 1 && mallopt(M_TRIM_THRESHOLD, kTrimThresholdBytes) == 1;
}

}  // namespace accelerant
