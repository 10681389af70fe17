// A tensor that shares a slice of a flat buffer without being an autograd view of it.
//
// Gradients and parameters that live inside a flat buffer (the gradient reducer's buckets, the
// fused optimizers' arenas) must not be autograd views: LibTorch 1.13's Optimizer::zero_grad
// calls detach_() on every gradient, which refuses views ("Can't detach views in-place"). A
// tensor built with set_() over the buffer's storage aliases the same memory but has no view
// metadata, so zero_grad, in-place accumulation by autograd and set_data all work on it.
#pragma once
#include <torch/types.h>

namespace accelerant::detail {

/// `sizes`-shaped contiguous alias of `flat`'s elements [offset, offset + numel(sizes)).
inline torch::Tensor alias_into(const torch::Tensor& flat, int64_t offset, c10::IntArrayRef sizes) {
  return torch::empty({0}, flat.options())
      .set_(flat.storage(), flat.storage_offset() + offset, sizes);
}

/// Whether `t` is exactly the alias that alias_into(flat, offset, t.sizes()) would give.
inline bool aliases(const torch::Tensor& t, const torch::Tensor& flat, int64_t offset) {
  return t.defined() && t.is_contiguous() && t.scalar_type() == flat.scalar_type() &&
         t.device() == flat.device() &&
         t.data_ptr() ==
             static_cast<void*>(static_cast<char*>(flat.data_ptr()) + offset * flat.element_size());
}

}  // namespace accelerant::detail
