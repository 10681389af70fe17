// Mixed-precision autocast as an RAII guard. LibTorch has no C++ guard class, and its autocast
// functions were renamed between 1.13 and 2.4; this one works on both (src/torch_compat.cpp).
//
//   {
//     accelerant::AutocastGuard autocast(torch::kCPU, torch::kBFloat16);
//     auto logits = model->forward(x);   // matmuls and convolutions in bf16
//   }                                    // previous state restored
#pragma once

#include <torch/types.h>

namespace accelerant {

/// Turns LibTorch's autocast on for one scope and restores what was there before when it ends:
/// matmuls and convolutions run in the lower precision, ops that need the range stay in fp32
/// (LibTorch's autocast lists). Accelerator::autocast() returns one set from its mixed precision.
class AutocastGuard {
 public:
  /// Enables autocast to `dtype` for `device`'s type while the guard lives (or leaves it as it
  /// is when `enabled` is false). CPU: bf16 only (LibTorch's CPU autocast rejects fp16), so fp16
  /// on the CPU throws accelerant::Error saying so. CUDA: fp16 or bf16.
  AutocastGuard(torch::Device device, torch::ScalarType dtype, bool enabled = true);
  /// Restores the autocast state (on or off, and its dtype) that was in force when the guard
  /// opened.
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  bool active_;
  bool cuda_;
  bool previous_enabled_;
  torch::ScalarType previous_dtype_;
};

}  // namespace accelerant
