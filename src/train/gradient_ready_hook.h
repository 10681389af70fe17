// When a leaf parameter's gradient for the current backward pass is complete: a post-hook on its
// gradient accumulator. The GradientReducer starts a bucket's all-reduce there, and ZeRO-3's
// sharded blocks their reduce-scatter.
#pragma once

#include <torch/csrc/autograd/function.h>
#include <torch/types.h>

#include <functional>
#include <memory>
#include <string>

namespace accelerant::detail {

/// Calls `ready` each time backward has accumulated `param`'s gradient. Returns the accumulator,
/// which must be kept alive for the hook to keep firing (LibTorch keeps it only while a graph
/// refers to it). Throws Error starting with `what` (e.g. "Parameter 'fc.weight'") when `param`
/// is not a leaf tensor: it has no accumulator.
std::shared_ptr<torch::autograd::Node> on_gradient_ready(const torch::Tensor& param,
                                                         const std::string& what,
                                                         std::function<void()> ready);

}  // namespace accelerant::detail
