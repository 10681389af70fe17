// CPU settings a LibTorch user rarely knows to make, applied by the Accelerator (on by default,
// AcceleratorOptions::cpu_defaults(false) or ACCELERANT_CPU_DEFAULTS=0 turns them off), and the
// thread facts the fork launcher needs. Both defaults were measured on these machines
// (docs/benchmarks.md "CPU defaults"):
// - Threads: each process's intra-op pool sized usable CPUs / local processes, unless a
//   launcher, OMP_NUM_THREADS or the program itself (torch::set_num_threads before the
//   Accelerator, to a count other than LibTorch's start-up value) already chose a count; then
//   the pool gets that count. OpenBLAS's separate pool gets the same count when it is 1, else 1
//   (set_compute_threads): busy-waiting pools take each other's cores. LibTorch's default is all
//   cores per process for both: 2 + 2 threads on 2 cores ran an MLP at 0.41x of 1 + 1.
//   Under srun -c N (SLURM_CPUS_PER_TASK) each process gets N instead, at most its usable CPUs:
//   with Slurm's task/affinity plugin the mask already is the task's own N CPUs (dividing it
//   again would starve the task); with task/none it is the whole machine's, and N is the task's
//   share of the allocation.
// - malloc: glibc returns large freed blocks to the OS (munmap, heap trimming), so a training step
//   that frees and reallocates the same step-sized buffers page-faults them in again every step
//   (~4,000 faults per step, 3-5x slower on a small CNN). Raising the mmap and trim thresholds
//   together keeps those blocks in the heap; raising only one makes it worse.
// Threads and fork (docs/launching.md "Threads and fork"): once a process has run LibTorch ops on
// several threads, its OpenMP and OpenBLAS pools exist only as bookkeeping in a forked child, and
// the child's first multi-threaded op waits forever for threads that are not there. A child
// limited to one thread never touches the pool and runs fine.
#pragma once

#include "accelerant/cpu_settings.h"

namespace accelerant::detail {

/// What the thread default depends on besides the machine.
struct CpuDefaultsInput {
  int local_processes = 1;   ///< processes sharing this machine (the launcher's local world)
  int launcher_threads = 0;  ///< threads per process a launcher chose; 0 = none
  int cpus_per_process = 0;  ///< CPUs a launcher allotted each process (srun -c); 0 = none
  bool omp_num_threads_set = false;
};

/// The thread count of a process that nobody chose one for: `cpus_per_process` (0 = not
/// allotted) at most `usable_cpus`, else `usable_cpus` shared among `local_processes`; at least 1.
int default_thread_count(int usable_cpus, int local_processes, int cpus_per_process);

/// Applies the thread and malloc defaults; returns the intra-op threads now in force.
int apply_cpu_defaults(const CpuDefaultsInput& input);

/// Threads of this process other than the calling one (from /proc/self/task).
int other_thread_count();

/// Of those, the ones a forked child would miss (libgomp's OpenMP pool above all). OpenBLAS's
/// own pool is not counted: the pthreads build starts it when it is loaded, before main, and
/// registers a fork handler that stops it and lets the child start its own.
int fork_unsafe_thread_count();

}  // namespace accelerant::detail
