#include "base/cpu_settings.h"

#include <ATen/Parallel.h>
#include <dirent.h>
#include <dlfcn.h>
#include <malloc.h>
#include <sched.h>

#include <algorithm>
#include <thread>

namespace accelerant {
namespace {

// LibTorch's intra-op thread count before the program could change it, read when this library is
// loaded (after LibTorch's own initialisation). Not a constant: Debian's LibTorch starts with 1,
// other builds with the number of cores.
const int kLibTorchDefaultThreads = at::get_num_threads();

}  // namespace

int usable_cpus() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

void set_compute_threads(int threads) {
  if (threads < 1) return;
  at::set_num_threads(threads);
  // Looked up at run time: Debian's libtorch reaches OpenBLAS only through libblas.so.3, and
  // another BLAS may be selected.
  using SetThreads = void (*)(int);
  if (auto set = reinterpret_cast<SetThreads>(::dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) {
    set(threads);
  }
}

bool keep_freed_memory_in_heap() {
  constexpr int kMmapThresholdBytes = 32 * 1024 * 1024;  // glibc refuses more (HEAP_MAX_SIZE / 2)
  constexpr int kTrimThresholdBytes = 1024 * 1024 * 1024;
  // Both together: raising only the trim threshold was measured to make the faults far worse.
  return mallopt(M_MMAP_THRESHOLD, kMmapThresholdBytes) == 1 &&
         mallopt(M_TRIM_THRESHOLD, kTrimThresholdBytes) == 1;
}

int openblas_threads() {
  using GetThreads = int (*)();
  auto get = reinterpret_cast<GetThreads>(::dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
  return get ? get() : -1;
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

int other_thread_count() {
  DIR* dir = ::opendir("/proc/self/task");
  if (dir == nullptr) return 0;
  int count = 0;
  while (dirent* entry = ::readdir(dir)) {
    if (entry->d_name[0] != '.') ++count;
  }
  ::closedir(dir);
  return count > 0 ? count - 1 : 0;
}

int fork_unsafe_thread_count() {
  return std::max(0, other_thread_count() - std::max(0, openblas_threads() - 1));
}

}  // namespace detail
}  // namespace accelerant
