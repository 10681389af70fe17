#include "accelerant/autocast.h"

#include "accelerant/error.h"
#include "base/text.h"
#include "base/torch_compat.h"

namespace accelerant {

AutocastGuard::AutocastGuard(torch::Device device, torch::ScalarType dtype, bool enabled)
    : active_(enabled), cuda_(device.is_cuda()), previous_enabled_(false), previous_dtype_(dtype) {
  if (!active_) return;
  if (!cuda_ && !device.is_cpu()) {
    throw Error(detail::str("autocast: device ", device.str(),
                            " is not supported. Fix: use a CPU or CUDA device."));
  }
  if (!cuda_ && dtype != torch::kBFloat16) {
    throw Error(detail::str(
        "autocast on the CPU supports bf16 only, but ", c10::toString(dtype),
        " was asked for (LibTorch's CPU autocast rejects fp16). Fix: use mixed_precision bf16 on "
        "the CPU; fp16 is the choice on CUDA GPUs."));
  }
  if (cuda_ && dtype != torch::kHalf && dtype != torch::kBFloat16) {
    throw Error(detail::str("autocast on CUDA supports fp16 and bf16, not ", c10::toString(dtype),
                            ". Fix: use mixed_precision fp16 or bf16."));
  }
  const auto type = cuda_ ? c10::DeviceType::CUDA : c10::DeviceType::CPU;
  previous_enabled_ = detail::autocast_enabled(type);
  previous_dtype_ = detail::autocast_dtype(type);
  detail::set_autocast_enabled(type, true);
  detail::set_autocast_dtype(type, dtype);
  detail::enter_autocast();
}

AutocastGuard::~AutocastGuard() {
  if (!active_) return;
  const auto type = cuda_ ? c10::DeviceType::CUDA : c10::DeviceType::CPU;
  detail::leave_autocast();
  detail::set_autocast_enabled(type, previous_enabled_);
  detail::set_autocast_dtype(type, previous_dtype_);
}

}  // namespace accelerant
