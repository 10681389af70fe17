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

int apply_cpu_defaults(const DistributedEnv& env, const EnvLookup& lookup) {
  int threads = 0;
  const bool omp_set = lookup("OMP_NUM_THREADS").value_or("") != "";
  if (env.threads_per_process > 0) {
    threads = env.threads_per_process;  // the launcher chose (ACCELERANT_THREADS_PER_PROCESS)
  } else if (omp_set || torch::get_num_threads() != kLibTorchDefaultThreads) {
    // OMP_NUM_THREADS, or the program changed the count since the library was loaded (e.g.
    // torch::set_num_threads before creating the Accelerator): keep that count.
    threads = torch::get_num_threads();
  } else {
    threads = std::max(1, usable_cpus() / std::max(1, env.local_world_size));
  }
  // Also when the count is unchanged: OpenBLAS's pool is separate and still at its own default.
  detail::set_compute_threads(threads);
  keep_freed_memory_in_heap();
  return threads;
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
