// Thread pools and fork. See docs/launching.md "Threads and fork": once a process has run
// LibTorch ops on several threads, its OpenMP and OpenBLAS pools exist only as bookkeeping in a
// forked child, and the child's first multi-threaded op waits forever for threads that are not
// there. A child limited to one thread never touches the pool and runs fine.
#pragma once

namespace accelerant::detail {

/// Threads of this process other than the calling one (from /proc/self/task).
int other_thread_count();

/// Of those, the ones a forked child would miss (libgomp's OpenMP pool above all). OpenBLAS's
/// own pool is not counted: the pthreads build starts it when it is loaded, before main, and
/// registers a fork handler that stops it and lets the child start its own.
int fork_unsafe_thread_count();

/// Sets LibTorch's intra-op threads and, when OpenBLAS is the BLAS in use, OpenBLAS's threads.
void set_compute_threads(int threads);

/// OpenBLAS's thread count, or -1 when OpenBLAS is not loaded.
int openblas_threads();

}  // namespace accelerant::detail
