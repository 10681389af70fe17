// The CPU facts and settings that need no LibTorch (cpu_settings.h): usable CPUs, glibc's malloc
// thresholds, OpenBLAS's pool and this process's threads. The launcher's agent uses them, also in
// `accelerant launch`, which does not load LibTorch; cpu_settings.cpp has the LibTorch half.
#include <dirent.h>
#include <dlfcn.h>
#include <malloc.h>
#include <sched.h>

#include <algorithm>
#include <thread>

#include "base/cpu_settings.h"

namespace accelerant {

int usable_cpus() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
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
