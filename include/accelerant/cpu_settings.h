// The two CPU settings behind AcceleratorOptions::cpu_defaults, for programs that want them
// without an Accelerator (or want only one). See docs/accelerator.md "CPU defaults".
#pragma once

namespace accelerant {

/// Sets LibTorch's intra-op threads and, when OpenBLAS is the BLAS in use, OpenBLAS's threads:
/// two separate pools that otherwise both default to every core.
void set_compute_threads(int threads);

/// Raises glibc's mmap threshold (to its largest allowed value, 32 MiB) and trim threshold
/// (1 GiB) together, so that step-sized buffers freed at the end of a training step stay in the
/// heap instead of being returned to the OS and page-faulted in again next step. Returns whether
/// glibc accepted both.
bool keep_freed_memory_in_heap();

}  // namespace accelerant
