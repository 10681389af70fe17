#include "base/cpu_settings.h"

#include <ATen/Parallel.h>
#include <dlfcn.h>

#include <algorithm>
#include <thread>

namespace accelerant {
namespace {

// LibTorch's intra-op thread count before the program could change it, read when this library is
// loaded (after LibTorch's own initialisation). Not a constant: Debian's LibTorch starts with 1,
// other builds with the number of cores.
const int kLibTorchDefaultThreads = at::get_num_threads();

}  // namespace

void set_compute_threads(int threads) {
  if (threads < 1) return;
  at::set_num_threads(threads);
  // OpenBLAS runs on the calling thread only when the intra-op pool has several: both pools keep
  // their threads busy-waiting for the next task (libgomp spins, OpenBLAS loops on sched_yield),
  // so two pools of N threads on N cores take each other's cores between every operator.
  // Measured on 2 cores, one process, 100 iterations of the GPT example's PyTorch twin (the
  // same ATen and OpenBLAS kernels): 2 + 2 threads 20.1 s, 2 + 1 8.5 s (docs/accelerator.md
  // "CPU defaults"). Looked up at run time: Debian's libtorch reaches OpenBLAS only through
  // libblas.so.3, and another BLAS may be selected.
  using SetThreads = void (*)(int);
  if (auto set = reinterpret_cast<SetThreads>(::dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) {
    set(threads > 1 ? 1 : threads);
  }
}

namespace detail {

int default_thread_count(int usable_cpus, int local_processes, int cpus_per_process) {
  if (cpus_per_process > 0) return std::max(1, std::min(cpus_per_process, usable_cpus));
  return std::max(1, usable_cpus / std::max(1, local_processes));
}

int apply_cpu_defaults(const CpuDefaultsInput& input) {
  int threads = 0;
  if (input.launcher_threads > 0) {
    threads = input.launcher_threads;  // the launcher chose (ACCELERANT_THREADS_PER_PROCESS)
  } else if (input.omp_num_threads_set || at::get_num_threads() != kLibTorchDefaultThreads) {
    // OMP_NUM_THREADS, or the program changed the count since the library was loaded (e.g.
    // torch::set_num_threads before creating the Accelerator): keep that count.
    threads = at::get_num_threads();
  } else {
    threads = default_thread_count(usable_cpus(), input.local_processes, input.cpus_per_process);
  }
  // Also when the count is unchanged: OpenBLAS's pool is separate and still at its own default.
  set_compute_threads(threads);
  keep_freed_memory_in_heap();
  return threads;
}

}  // namespace detail
}  // namespace accelerant
