// Work that must run when the whole backward pass ends, even when it is asked for from inside a
// checkpoint's recomputation.
//
// A checkpoint (accelerant/activation_checkpoint.h) backpropagates through its recomputed block
// in a nested backward. LibTorch's Engine::queue_callback attaches a callback to the innermost
// running backward, so a callback queued from a hook that first fires inside the nested one would
// run when the nested backward ends, while the outer one still has layers to go (the
// GradientReducer would then wait for buckets whose gradients do not exist yet). Callbacks queued
// here during a recomputation are held and run when the outermost backward ends instead.
#pragma once

#include <functional>

namespace accelerant::detail {

/// Runs `callback` when the current backward pass ends: the outermost one when called during a
/// checkpoint's recomputation, else LibTorch's Engine::queue_callback. Call it from autograd hooks.
void queue_end_of_backward(std::function<void()> callback);

/// Marks a checkpoint's recomputation (and its nested backward) on this thread while it lives. The
/// outermost one queues, on the backward that is running it, a callback that runs what
/// queue_end_of_backward held.
class RecomputationScope {
 public:
  RecomputationScope();
  ~RecomputationScope();
  RecomputationScope(const RecomputationScope&) = delete;
  RecomputationScope& operator=(const RecomputationScope&) = delete;
};

}  // namespace accelerant::detail
