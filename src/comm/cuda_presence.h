// How many GPUs this process may use, asked in one place so that tests can pretend a GPU is
// there: the code that picks a process's device (and so whether it makes a CUDA context and an
// NCCL group) is then exercised on a machine without one.
#pragma once
#include <cstdint>
#include <optional>

namespace accelerant::detail {

/// torch::cuda::device_count() when CUDA is available, else 0; or the count set by
/// pretend_visible_cuda_devices.
int64_t visible_cuda_devices();

/// For tests: visible_cuda_devices() returns `count` from now on (nullopt: LibTorch's answer
/// again). Nothing is made on the pretended devices by this call.
void pretend_visible_cuda_devices(std::optional<int64_t> count);

}  // namespace accelerant::detail
