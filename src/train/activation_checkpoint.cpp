#include "accelerant/activation_checkpoint.h"

#include <ATen/Context.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>

#include <mutex>
#include <optional>
#include <utility>

#include "accelerant/error.h"
#include "base/text.h"
#include "base/torch_compat.h"
#include "train/end_of_backward.h"

namespace accelerant {
namespace {

// The random generators a block may draw from: the CPU one always, the CUDA one of the inputs'
// device when there is one. Saved at the first forward, set again for the recomputation so that
// dropout draws the same masks.
struct RngState {
  torch::Tensor cpu;
  std::optional<torch::Device> cuda_device;
  torch::Tensor cuda;

  // The CUDA generator is that of the first CUDA input's device, if any.
  static RngState capture(std::optional<torch::Device> cuda_device) {
    RngState state;
    state.cpu = generator_state(torch::Device(torch::kCPU));
    state.cuda_device = cuda_device;
    if (cuda_device) state.cuda = generator_state(*cuda_device);
    return state;
  }

  static std::optional<torch::Device> cuda_device_of(const std::vector<torch::Tensor>& inputs) {
    for (const auto& input : inputs) {
      if (input.defined() && input.is_cuda()) return input.device();
    }
    return std::nullopt;
  }

  void restore() const {
    set_generator_state(torch::Device(torch::kCPU), cpu);
    if (cuda_device) set_generator_state(*cuda_device, cuda);
  }

  static torch::Tensor generator_state(torch::Device device) {
    auto generator = at::globalContext().defaultGenerator(device);
    std::lock_guard<std::mutex> lock(generator.mutex());
    return generator.get_state();
  }
  static void set_generator_state(torch::Device device, const torch::Tensor& state) {
    auto generator = at::globalContext().defaultGenerator(device);
    std::lock_guard<std::mutex> lock(generator.mutex());
    generator.set_state(state);
  }
};

// Autocast on or off, and its dtype, for both device types: the recomputation must cast exactly
// as the first forward did, whatever is in force when backward runs.
struct AutocastState {
  bool cpu_enabled = false;
  torch::ScalarType cpu_dtype = torch::kBFloat16;
  bool cuda_enabled = false;
  torch::ScalarType cuda_dtype = torch::kHalf;

  static AutocastState capture() {
    AutocastState state;
    state.cpu_enabled = detail::autocast_enabled(c10::DeviceType::CPU);
    state.cpu_dtype = detail::autocast_dtype(c10::DeviceType::CPU);
    state.cuda_enabled = detail::autocast_enabled(c10::DeviceType::CUDA);
    state.cuda_dtype = detail::autocast_dtype(c10::DeviceType::CUDA);
    return state;
  }

  void apply() const {
    detail::set_autocast_enabled(c10::DeviceType::CPU, cpu_enabled);
    detail::set_autocast_dtype(c10::DeviceType::CPU, cpu_dtype);
    detail::set_autocast_enabled(c10::DeviceType::CUDA, cuda_enabled);
    detail::set_autocast_dtype(c10::DeviceType::CUDA, cuda_dtype);
  }
};

// The random and autocast state of the first forward, set while it lives; the caller's state is
// put back afterwards, so its random stream goes on from where its own forward left it.
class ReplayedState {
 public:
  ReplayedState(const RngState& rng, const AutocastState& autocast)
      : caller_rng_(RngState::capture(rng.cuda_device)),
        caller_autocast_(AutocastState::capture()) {
    rng.restore();
    autocast.apply();
  }
  ~ReplayedState() {
    caller_autocast_.apply();
    caller_rng_.restore();
  }
  ReplayedState(const ReplayedState&) = delete;
  ReplayedState& operator=(const ReplayedState&) = delete;

 private:
  RngState caller_rng_;
  AutocastState caller_autocast_;
};

// Autocast caches the low-precision copy of each weight for the whole autocast region. The first
// forward runs without grad, so its copies have no graph back to the weights, and the
// recomputation must cast afresh to reach them: the cache is off while a checkpointed block runs.
class AutocastCacheOff {
 public:
  AutocastCacheOff() : previous_(at::autocast::is_autocast_cache_enabled()) {
    at::autocast::set_autocast_cache_enabled(false);
  }
  ~AutocastCacheOff() { at::autocast::set_autocast_cache_enabled(previous_); }
  AutocastCacheOff(const AutocastCacheOff&) = delete;
  AutocastCacheOff& operator=(const AutocastCacheOff&) = delete;

 private:
  bool previous_;
};

// The autograd node of one checkpointed call: it holds the block, its inputs and the state needed
// to recompute it, in place of the activations.
class CheckpointNode : public torch::autograd::Node {
 public:
  CheckpointNode(CheckpointFunction fn, std::vector<torch::Tensor> inputs,
                 std::vector<bool> requires_grad)
      : fn_(std::move(fn)),
        inputs_(std::move(inputs)),
        requires_grad_(std::move(requires_grad)),
        rng_(RngState::capture(RngState::cuda_device_of(inputs_))),
        autocast_(AutocastState::capture()) {}

  std::string name() const override { return "accelerant::CheckpointBackward"; }

  void release_variables() override {
    std::lock_guard<std::mutex> lock(mutex_);
    inputs_.clear();
    released_ = true;
  }

  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    std::vector<torch::Tensor> detached;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (released_) {
        throw Error(
            "checkpoint: backward ran through a checkpointed block a second time, but the first "
            "backward freed its saved inputs. Fix: pass retain_graph=true to the first backward.");
      }
      for (size_t i = 0; i < inputs_.size(); ++i) {
        detached.push_back(inputs_[i].detach().requires_grad_(requires_grad_[i]));
      }
    }
    detail::RecomputationScope recomputation;
    torch::Tensor output;
    {
      ReplayedState replay(rng_, autocast_);
      AutocastCacheOff no_cache;
      at::AutoGradMode grad(true);
      output = fn_(detached);
    }
    if (output.requires_grad() && grads.at(0).defined()) {
      // backward, not grad(): parameters read by the block are leaves of the recomputed graph,
      // and must accumulate .grad (and fire their accumulators' hooks) as without checkpointing.
      torch::autograd::backward({output}, {grads[0]});
    }
    torch::autograd::variable_list input_grads;
    for (size_t i = 0; i < detached.size(); ++i) {
      input_grads.push_back(requires_grad_[i] ? detached[i].grad() : torch::Tensor());
    }
    return input_grads;
  }

 private:
  CheckpointFunction fn_;
  std::mutex mutex_;
  std::vector<torch::Tensor> inputs_;
  std::vector<bool> requires_grad_;
  RngState rng_;
  AutocastState autocast_;
  bool released_ = false;
};

// `parameters_need_grad`: the caller knows that the block has trainable parameters, so the output
// needs a gradient edge even when no input does.
torch::Tensor checkpoint_with(CheckpointFunction fn, std::vector<torch::Tensor> inputs,
                              bool parameters_need_grad) {
  if (!at::GradMode::is_enabled()) return fn(inputs);
  std::vector<bool> requires_grad;
  bool any = false;
  for (const auto& input : inputs) {
    requires_grad.push_back(input.defined() && input.requires_grad());
    any = any || requires_grad.back();
  }
  if (!any && !parameters_need_grad) {
    throw Error(detail::str(
        "checkpoint: none of its ", inputs.size(),
        " inputs requires grad, so backward would never reach the recomputed block and "
        "parameters inside it would silently get no gradient. Fix: make an input require grad "
        "(x.requires_grad_()), wrap the block with accelerant::Checkpointed (it knows its "
        "parameters), or call the block without checkpoint under torch::NoGradGuard for "
        "inference."));
  }
  auto node = std::shared_ptr<CheckpointNode>(new CheckpointNode(fn, inputs, requires_grad),
                                              torch::autograd::deleteNode);
  torch::autograd::edge_list edges;
  for (const auto& input : inputs) {
    edges.push_back(input.defined() ? torch::autograd::impl::gradient_edge(input)
                                    : torch::autograd::Edge());
  }
  node->set_next_edges(std::move(edges));
  torch::Tensor output;
  {
    // Nothing inside is recorded: this is where the activations are dropped.
    at::NoGradGuard no_grad;
    AutocastCacheOff no_cache;
    std::vector<torch::Tensor> detached;
    for (const auto& input : inputs) detached.push_back(input.defined() ? input.detach() : input);
    output = fn(detached);
  }
  torch::autograd::create_gradient_edge(output, node);
  return output;
}

}  // namespace

torch::Tensor checkpoint(CheckpointFunction fn, std::vector<torch::Tensor> inputs) {
  return checkpoint_with(std::move(fn), std::move(inputs), false);
}

CheckpointedImpl::CheckpointedImpl(torch::nn::Sequential block)
    : block_(register_module("block", std::move(block))) {}

torch::Tensor CheckpointedImpl::forward(torch::Tensor input) {
  bool trainable = false;
  for (const auto& parameter : block_->parameters())
    trainable = trainable || parameter.requires_grad();
  auto block = block_.ptr();  // shared: the node may outlive this module's forward
  return checkpoint_with(
      [block](const std::vector<torch::Tensor>& in) { return block->forward(in[0]); },
      {std::move(input)}, trainable);
}

}  // namespace accelerant
