// The one file that knows the differences between LibTorch 1.13 (Debian, CI) and 2.x (pip,
// CUDA machines). Everything else includes this instead of testing TORCH_VERSION itself.
#pragma once

#include <torch/types.h>
#include <torch/version.h>

#ifndef USE_C10D_GLOO
#define USE_C10D_GLOO  // c10d's Gloo headers are guarded by it; LibTorch is always built with Gloo
#endif
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#ifdef USE_C10D_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

namespace accelerant::detail {

// 1.13: the Gloo and NCCL process groups derive from c10d::ProcessGroup.
// 2.x:  they derive from c10d::Backend, and ProcessGroup became a dispatcher over backends.
#if TORCH_VERSION_MAJOR >= 2
using CommBackend = c10d::Backend;
#else
using CommBackend = c10d::ProcessGroup;
#endif

/// Autocast state per device type (kCPU or kCUDA), over the 1.13 / 2.4 renaming.
bool autocast_enabled(c10::DeviceType device);
void set_autocast_enabled(c10::DeviceType device, bool enabled);
c10::ScalarType autocast_dtype(c10::DeviceType device);
void set_autocast_dtype(c10::DeviceType device, c10::ScalarType dtype);
/// Autocast's nesting counter; leaving the outermost region clears its cast cache.
void enter_autocast();
void leave_autocast();

/// True when this process has initialised CUDA (cuInit): forking it would break the children's
/// CUDA. Asking does not initialise it.
bool cuda_initialized();

/// True when LibTorch was built with CUDA and the driver (NVML) sees a GPU, whatever
/// CUDA_VISIBLE_DEVICES hides. Asking does not initialise CUDA, so a launcher may ask before it
/// forks (a worker asks torch::cuda::is_available()).
bool nvidia_gpu_present();

/// `t` (on the CPU) as `dtype` on `device`, for a loader's worker thread. To a GPU: staged in
/// page-locked memory when `pin`, copied on a side stream of the worker's own, and waited for by
/// the worker, so that the copy overlaps the training step and the batch is complete when the
/// loop receives it; the memory is recorded for the device's default stream, which uses it.
torch::Tensor to_device_from_worker(const torch::Tensor& t, torch::Device device,
                                    torch::ScalarType dtype, bool pin);

}  // namespace accelerant::detail
