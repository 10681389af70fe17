// CPU settings a LibTorch user rarely knows to make, applied by the Accelerator (on by default,
// AcceleratorOptions::cpu_defaults(false) or ACCELERANT_CPU_DEFAULTS=0 turns them off). Both were
// measured on these machines (docs/benchmarks.md "CPU defaults"):
// - Threads: each process's intra-op pool and OpenBLAS's pool sized cores / local processes,
//   unless a launcher, OMP_NUM_THREADS or the program itself (torch::set_num_threads before the
//   Accelerator, to a count other than LibTorch's start-up value) already chose a count; then both
//   pools get that count.
//   LibTorch's default is all cores per process, and the two pools are separate: 2 + 2 threads
//   on 2 cores ran an MLP at 0.41x of 1 + 1.
// - malloc: glibc returns large freed blocks to the OS (munmap, heap trimming), so a training step
//   that frees and reallocates the same step-sized buffers page-faults them in again every step
//   (~4,000 faults per step, 3-5x slower on a small CNN). Raising the mmap and trim thresholds
//   together keeps those blocks in the heap; raising only one makes it worse.
#pragma once

#include "accelerant/distributed_env.h"

namespace accelerant::detail {

/// Applies the thread and malloc defaults for a process that shares this machine with
/// env.local_world_size - 1 others (`lookup` reads OMP_NUM_THREADS). Returns the intra-op
/// threads now in force.
int apply_cpu_defaults(const DistributedEnv& env, const EnvLookup& lookup);

}  // namespace accelerant::detail
