// Graph mode: a training step captured once per input-shape signature and replayed, the
// discipline PyTorch/XLA teaches, for C++.
//
//   accelerant::GraphStep step([&](const accelerant::GraphStep::Inputs& in) {
//     auto loss = torch::nn::functional::cross_entropy(model->forward(in[0]), in[1]);
//     accelerator.backward(loss);
//     optimizer.step();
//     optimizer.zero_grad();
//     return accelerant::GraphStep::Outputs{loss.detach()};
//   }, accelerant::GraphStepOptions().name("train"));
//   for (auto& batch : loader) {
//     auto loss = step(batch)[0].clone();  // a replay reuses its output tensors
//     accelerant::add_step_closure([loss] { std::cout << loss.item<float>() << "\n"; });
//   }
//
// The cache is keyed by the inputs' dtypes, devices and shapes (shape_signature). A signature
// seen for the first time is a capture (a compile); later steps with it are cache hits. On CUDA
// (a CUDA LibTorch with cuda_graphs on) a signature's first warmup_steps run eagerly on a side
// stream, the next one is captured into a CUDA graph with static input buffers, and every later
// step copies its inputs into those buffers and replays the graph. On the CPU every step runs
// eagerly with the same accounting, so a program written for graph mode runs everywhere and its
// recompiles show up before it meets a GPU. A replay repeats the recorded device work, not the
// C++ of the step function: keep host-side effects (closures, counters, prints) outside it.
//
// More distinct signatures than recompile_warning_after -> a warning for each further one, naming
// the inputs whose shapes changed: pad to a fixed length or a few bucket lengths
// (static_shapes.h) and keep the batch size fixed. metrics_report() (metrics.h) counts it all.
#pragma once
#include <torch/arg.h>
#include <torch/types.h>

#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "accelerant/data_loader.h"

namespace accelerant {

struct GraphStepOptions {
  /// Names the step in warnings and in the metrics report. Default: "step".
  TORCH_ARG(std::string, name) = "step";
  /// Distinct input signatures allowed before each further one is warned about. Default: 8.
  TORCH_ARG(int, recompile_warning_after) = 8;
  /// Capture CUDA graphs when the inputs are on a GPU (false: eager there too). Default: true.
  TORCH_ARG(bool, cuda_graphs) = true;
  /// CUDA: eager steps of a new signature before it is captured (kernel selection, allocator
  /// warm-up). Default: 3.
  TORCH_ARG(int, warmup_steps) = 3;
};

class GraphStep {
 public:
  using Inputs = std::vector<torch::Tensor>;
  using Outputs = std::vector<torch::Tensor>;
  using Function = std::function<Outputs(const Inputs&)>;

  explicit GraphStep(Function step, GraphStepOptions options = {});
  ~GraphStep();
  GraphStep(GraphStep&&) noexcept;
  GraphStep& operator=(GraphStep&&) noexcept;

  /// Runs one step, then the step closures it added (mark_step). On CUDA graph replays the
  /// outputs are the graph's static tensors: the next step overwrites them, so clone what you keep.
  Outputs operator()(const Inputs& inputs);
  /// The same with inputs {batch.data, batch.target}. (A template only so that a braced list
  /// of tensors, step({x, y}), picks the overload above.)
  template <class B, std::enable_if_t<std::is_same_v<B, Batch>, int> = 0>
  Outputs operator()(const B& batch) {
    return (*this)(Inputs{batch.data, batch.target});
  }

  /// Distinct input signatures seen so far.
  int64_t signatures() const;
  const GraphStepOptions& options() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

/// Runs `closure` once the current step has finished (at the end of the GraphStep call that is
/// running, or at the next mark_step()), after the closures added before it. For logging and
/// metrics: tensor values are final by then, and reading them does not stall the step itself.
void add_step_closure(std::function<void()> closure);

/// Ends a step: runs the pending step closures in the order they were added. GraphStep calls it
/// after every step; an eager loop may call it itself. An exception from a closure propagates
/// after the remaining closures have run.
void mark_step();

/// What the graph cache is keyed by: each input's dtype, device (when not the CPU) and shape,
/// e.g. "Float[64, 128]; Long[64]". Undefined inputs read "undefined".
std::string shape_signature(const std::vector<torch::Tensor>& inputs);

}  // namespace accelerant
