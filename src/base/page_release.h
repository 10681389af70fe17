// Zeroing a large range of a buffer by giving its memory back to the system.
//
// ZeRO stage 2 keeps a gradient bucket whole (autograd accumulates into it) but needs only this
// process's share of it between one backward and the next. Writing zeros over the rest would keep
// every page resident; madvise(MADV_DONTNEED) instead drops the pages of a private anonymous
// mapping, which then read as zeros and come back, zero-filled, when next written. So the range
// reads exactly as after a memset, and the resident memory falls by its size.
#pragma once
#include <cstddef>

namespace accelerant::detail {

/// Sets `bytes` bytes from `data` to zero, returning the whole pages among them to the system
/// (partial pages at either end, and ranges of only a few pages, are written instead). The
/// memory must be private anonymous memory (malloc's, as LibTorch's CPU allocator gives): a
/// shared or file-backed mapping would not read as zeros afterwards.
void zero_releasing_pages(void* data, size_t bytes);

/// Asks the kernel to back the whole pages of [data, data + bytes) with transparent huge pages
/// (madvise(MADV_HUGEPAGE); ignored where the kernel has them off). Memory that
/// zero_releasing_pages gives back on every step comes back through page faults: one per 2 MiB
/// instead of one per 4 KiB.
void prefer_huge_pages(void* data, size_t bytes);

}  // namespace accelerant::detail
