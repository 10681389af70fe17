#include "thread_config.h"

#include <ATen/Parallel.h>
#include <dirent.h>
#include <dlfcn.h>

#include <algorithm>

namespace accelerant::detail {

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

int openblas_threads() {
  using GetThreads = int (*)();
  auto get = reinterpret_cast<GetThreads>(::dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
  return get ? get() : -1;
}

}  // namespace accelerant::detail
