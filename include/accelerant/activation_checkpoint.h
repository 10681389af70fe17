// Activation checkpointing: trade compute for memory. A checkpointed block keeps only its inputs
// for backward, not the activations inside it; backward runs the block's forward again to rebuild
// them, then backpropagates through the rebuilt graph.
//
//   auto h = accelerant::checkpoint([&](const auto& in) { return block->forward(in[0]); }, {x});
//   // or, for a block whose parameters must train even when its input needs no gradient:
//   auto block = accelerant::Checkpointed(torch::nn::Sequential(...));
//   auto h = block->forward(x);
//
// Costs: the block's forward runs twice per step (about a third more compute for a typical
// block); memory for its inner activations is needed only for one block at a time, in backward.
// The recomputation sees the same random numbers (dropout masks) and the same autocast state as
// the first forward, so gradients equal those without checkpointing.
//
// The recomputation runs a nested backward inside the outer one (as PyTorch's reentrant
// checkpoint does): parameters inside the block accumulate their .grad there, so a
// GradientReducer's per-parameter hooks fire during it, and its end-of-backward work waits for the
// outer backward (see queue_end_of_backward in src/train/end_of_backward.h).
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <functional>
#include <vector>

namespace accelerant {

/// The block a checkpoint recomputes: a pure function of its inputs and of the parameters it
/// reads. It must do the same work each time it is called with the same inputs, random numbers
/// and autocast state (no side effects on state outside it, which would happen twice).
using CheckpointFunction = std::function<torch::Tensor(const std::vector<torch::Tensor>&)>;

/// Runs `fn(inputs)` without keeping its activations, and returns its output. In backward, runs
/// `fn` again with grad enabled, with the CPU (and, for CUDA inputs, the CUDA) random generator
/// state and the autocast state that the first call saw, then backpropagates the incoming gradient
/// through it: inputs that require grad get their gradients, and parameters read by `fn` accumulate
/// theirs in .grad. The caller's random stream after backward is where it would be without
/// checkpointing. Memory kept for backward: the inputs only (they are saved, not copied).
///
/// With grad mode off (inference) it is just `fn(inputs)`.
///
/// Refuses (accelerant::Error), with grad mode on, when no input requires grad: the recomputed
/// graph would then be unreachable from the loss and parameters inside `fn` would silently get no
/// gradient. Make an input require grad, or wrap the block with Checkpointed, which knows its
/// parameters. Backward through it a second time needs retain_graph on the first.
torch::Tensor checkpoint(CheckpointFunction fn, std::vector<torch::Tensor> inputs);

/// A Sequential block whose forward is checkpointed (see checkpoint()). Its parameters are
/// registered as its own submodule's, so prepare(), optimizers and state dicts see them as usual.
/// Unlike checkpoint(), the input may be data that needs no gradient (the first block of a
/// model): the block's parameters still get theirs.
class CheckpointedImpl : public torch::nn::Module {
 public:
  /// Wraps `block` (registered as the submodule "block").
  explicit CheckpointedImpl(torch::nn::Sequential block);
  /// The block's output, its activations dropped until backward recomputes them.
  torch::Tensor forward(torch::Tensor input);
  /// The wrapped block.
  torch::nn::Sequential block() const { return block_; }

 private:
  torch::nn::Sequential block_;
};
/// The module holder of CheckpointedImpl (as TORCH_MODULE makes one for every module):
/// `Checkpointed block(torch::nn::Sequential(...));`.
TORCH_MODULE(Checkpointed);

}  // namespace accelerant
