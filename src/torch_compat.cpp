#include "torch_compat.h"

#include <ATen/Context.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <torch/cuda.h>

namespace accelerant::detail {

bool cuda_available() { return torch::cuda::is_available(); }

bool cuda_initialized() {
  if (!at::hasCUDA()) return false;  // CPU-only LibTorch: there is nothing to initialise
  const auto& hooks = at::detail::getCUDAHooks();
  for (int64_t device = 0; device < hooks.getNumGPUs(); ++device) {
    if (hooks.hasPrimaryContext(device)) return true;
  }
  return false;
}

}  // namespace accelerant::detail
