#include "base/page_release.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>

namespace accelerant::detail {

namespace {

// Below this, a syscall and the page faults that bring the pages back cost more than a memset.
constexpr uintptr_t kMinReleasePages = 16;

}  // namespace

void zero_releasing_pages(void* data, size_t bytes) {
  if (bytes == 0) return;
  static const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  char* const first = static_cast<char*>(data);
  char* const last = first + bytes;
  const uintptr_t lo = (reinterpret_cast<uintptr_t>(first) + page - 1) / page * page;
  const uintptr_t hi = reinterpret_cast<uintptr_t>(last) / page * page;
  if (hi <= lo || hi - lo < kMinReleasePages * page) {
    std::memset(first, 0, bytes);
    return;
  }
  char* const lo_ptr = reinterpret_cast<char*>(lo);
  char* const hi_ptr = reinterpret_cast<char*>(hi);
  std::memset(first, 0, static_cast<size_t>(lo_ptr - first));
  std::memset(hi_ptr, 0, static_cast<size_t>(last - hi_ptr));
  if (madvise(lo_ptr, hi - lo, MADV_DONTNEED) != 0) {
    std::memset(lo_ptr, 0, hi - lo);  // not releasable (e.g. locked): zeros all the same
  }
}

void prefer_huge_pages(void* data, size_t bytes) {
  static const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const auto first = reinterpret_cast<uintptr_t>(data);
  const uintptr_t lo = (first + page - 1) / page * page, hi = (first + bytes) / page * page;
  if (hi > lo) madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_HUGEPAGE);  // a hint
}

}  // namespace accelerant::detail
