#include "base/torch_compat.h"

#include <ATen/Context.h>
#include <ATen/autocast_mode.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <torch/cuda.h>
#ifdef USE_C10D_NCCL  // a CUDA LibTorch
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace accelerant::detail {

// 2.4 renamed the per-device functions (set_cpu_enabled -> set_autocast_enabled(kCPU, ...)).
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
bool autocast_enabled(c10::DeviceType d) { return at::autocast::is_autocast_enabled(d); }
void set_autocast_enabled(c10::DeviceType d, bool on) { at::autocast::set_autocast_enabled(d, on); }
c10::ScalarType autocast_dtype(c10::DeviceType d) { return at::autocast::get_autocast_dtype(d); }
void set_autocast_dtype(c10::DeviceType d, c10::ScalarType t) {
  at::autocast::set_autocast_dtype(d, t);
}
#else
bool autocast_enabled(c10::DeviceType d) {
  return d == c10::DeviceType::CUDA ? at::autocast::is_enabled() : at::autocast::is_cpu_enabled();
}
void set_autocast_enabled(c10::DeviceType d, bool on) {
  d == c10::DeviceType::CUDA ? at::autocast::set_enabled(on) : at::autocast::set_cpu_enabled(on);
}
c10::ScalarType autocast_dtype(c10::DeviceType d) {
  return d == c10::DeviceType::CUDA ? at::autocast::get_autocast_gpu_dtype()
                                    : at::autocast::get_autocast_cpu_dtype();
}
void set_autocast_dtype(c10::DeviceType d, c10::ScalarType t) {
  d == c10::DeviceType::CUDA ? at::autocast::set_autocast_gpu_dtype(t)
                             : at::autocast::set_autocast_cpu_dtype(t);
}
#endif

void enter_autocast() { at::autocast::increment_nesting(); }
void leave_autocast() {
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
}

bool cuda_available() { return torch::cuda::is_available(); }

torch::Tensor to_device_from_worker(const torch::Tensor& t, torch::Device device,
                                    torch::ScalarType dtype, bool pin) {
#ifdef USE_C10D_NCCL
  if (device.is_cuda() && t.is_cpu()) {
    const torch::Tensor staged = pin && !t.is_pinned() ? t.pin_memory() : t;
    const auto index = device.has_index() ? device.index() : c10::cuda::current_device();
    auto side = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, index);
    torch::Tensor out;
    {
      c10::cuda::CUDAStreamGuard guard(side);
      out = staged.to(device, dtype, /*non_blocking=*/pin);
    }
    side.synchronize();  // the worker thread waits, not the training loop
    out.record_stream(c10::cuda::getDefaultCUDAStream(index));
    return out;
  }
#endif
  return t.to(device, dtype, /*non_blocking=*/pin && t.is_pinned());
}

bool cuda_initialized() {
  if (!at::hasCUDA()) return false;  // CPU-only LibTorch: there is nothing to initialise
  const auto& hooks = at::detail::getCUDAHooks();
  for (int64_t device = 0; device < hooks.getNumGPUs(); ++device) {
    if (hooks.hasPrimaryContext(device)) return true;
  }
  return false;
}

}  // namespace accelerant::detail
