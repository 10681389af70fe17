// The CPU settings behind AcceleratorOptions::cpu_defaults, for programs that want them without
// an Accelerator (or want only one), and the count every thread pool is sized from. See
// docs/accelerator.md "CPU defaults".
#pragma once

namespace accelerant {

/// CPUs this process may run on: its affinity mask (taskset, cgroup cpusets, a Slurm
/// allocation), not the machine's total, which std::thread::hardware_concurrency() counts. At
/// least 1.
int usable_cpus();

/// Sets LibTorch's intra-op threads to `threads` and, when OpenBLAS is the BLAS in use, OpenBLAS's
/// threads (a separate pool that otherwise defaults to every core) to 1, or to `threads` when
/// that is 1: two busy-waiting pools of several threads each take each other's cores
/// (docs/accelerator.md "CPU defaults"). Counts below 1 are ignored.
void set_compute_threads(int threads);

/// Raises glibc's mmap threshold (to its largest allowed value, 32 MiB) and trim threshold
/// (1 GiB) together, so that step-sized buffers freed at the end of a training step stay in the
/// heap instead of being returned to the OS and page-faulted in again next step. Returns whether
/// glibc accepted both.
bool keep_freed_memory_in_heap();

/// OpenBLAS's thread count, or -1 when OpenBLAS is not the BLAS in use.
int openblas_threads();

}  // namespace accelerant
