// Graph mode: a training step captured once per input-shape signature and replayed, the
// discipline PyTorch/XLA teaches, for C++.
//
//   // accelerator built with AcceleratorOptions().fused_optimizers(true): a capturable update
//   accelerant::GraphStep step = accelerator.compile([&](const accelerant::GraphStep::Inputs& in) {
//     auto loss = torch::nn::functional::cross_entropy(model->forward(in[0]), in[1]);
//     accelerator.backward(loss);
//     optimizer.step();
//     optimizer.zero_grad();
//     accelerant::add_step_closure([loss] { std::cout << loss.item<float>() << "\n"; });
//     return accelerant::GraphStep::Outputs{loss.detach()};
//   }, accelerant::GraphStepOptions().name("train"));
//   for (auto& batch : loader) {
//     auto loss = step(batch)[0].clone();  // a replay reuses its output tensors
//   }
//
// (Accelerator::compile is a GraphStep that also handles gradient accumulation; GraphStep(fn,
// options) builds one directly.)
//
// The cache is keyed by the inputs' dtypes, devices and shapes (shape_signature), and for a Batch
// by every tensor's name as well. A signature
// seen for the first time is a capture (a compile); later steps with it are cache hits. On CUDA
// (a CUDA LibTorch with cuda_graphs on) a signature's first warmup_steps run eagerly on a side
// stream, the next one is captured into a CUDA graph with static input buffers, and every later
// step copies its inputs into those buffers and replays the graph. On the CPU every step runs
// eagerly with the same accounting, so a program written for graph mode runs everywhere and its
// recompiles show up before it meets a GPU. A replay repeats the recorded device work, not the
// C++ of the step function: Accelerant's own host-side bookkeeping inside the step (optimizer
// step counters, the scheduler, step closures added inside the step) is recorded at the capture
// and re-run after every replay; your own host code inside the step runs at the capture only.
// emulate_replays checks a program for this on the CPU (see below).
//
// More distinct signatures than recompile_warning_after -> a warning for each further one, naming
// the inputs whose shapes changed: pad to a fixed length or a few bucket lengths
// (static_shapes.h) and keep the batch size fixed. metrics_report() (metrics.h) counts it all.
#pragma once
#include <torch/types.h>

#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "accelerant/batch.h"
#include "accelerant/options.h"

namespace accelerant {

/// How a GraphStep captures, names and checks its step.
struct GraphStepOptions {
  /// What GraphStepOptions::phase returns: a key for this step's kind, a scope held while it runs.
  struct Phase {
    std::string key;  ///< joins the cache key: steps with different keys are different graphs
    std::shared_ptr<void> scope;  ///< held until the step ends, then released; may be null
  };

  /// Names the step in warnings and in the metrics report. Default: "step".
  ACCELERANT_OPTION(std::string, name) = "step";
  /// Distinct input signatures allowed before each further one is warned about. Default: 8.
  ACCELERANT_OPTION(int, recompile_warning_after) = 8;
  /// Capture CUDA graphs when the inputs are on a GPU (false: eager there too). Default: true.
  ACCELERANT_OPTION(bool, cuda_graphs) = true;
  /// CUDA: eager steps of a new signature before it is captured (kernel selection, allocator
  /// warm-up). Default: 3.
  ACCELERANT_OPTION(int, warmup_steps) = 3;
  /// CPU: run each signature's later steps the way a GPU replays them, as a check before meeting
  /// a GPU. The step function still runs (the CPU has no graph to replay), but the host-side
  /// bookkeeping it does through Accelerant is not run inline: what was recorded at the
  /// signature's first step runs instead, and the capture rules apply (no host reads of device
  /// values, fused optimizers only). Slower: the fused optimizers take their device path.
  /// Default: ACCELERANT_EMULATE_REPLAYS (a bool, parse_bool), else false.
  ACCELERANT_OPTION(bool, emulate_replays) = default_emulate_replays();
  /// Runs before every step, outside any capture, and returns a key that joins the cache key
  /// and a scope held until the step ends. Accelerator::compile uses it for gradient
  /// accumulation: whether a micro-step synchronises is decided here, and the two kinds of
  /// micro-step are two graphs. Default: none.
  ACCELERANT_OPTION(std::function<Phase()>, phase);

 public:
  /// emulate_replays' default: whether the environment variable ACCELERANT_EMULATE_REPLAYS is "1".
  static bool default_emulate_replays();
};

/// A training step run through a cache of captures, one per input signature (see the file
/// comment). Made by Accelerator::compile, or directly; movable, not copyable.
class GraphStep {
 public:
  /// The step's input tensors, in the order the function expects them.
  using Inputs = std::vector<torch::Tensor>;
  /// The tensors the step returns (after a CUDA graph replay: the graph's own, reused next step).
  using Outputs = std::vector<torch::Tensor>;
  /// The step itself: forward, backward, optimizer step, returning what the loop needs to see.
  using Function = std::function<Outputs(const Inputs&)>;

  /// Wraps `step`; nothing runs or is captured until the first call.
  explicit GraphStep(Function step, GraphStepOptions options = {});
  ~GraphStep();
  /// Takes over the function and the captures; the moved-from step must not be called again.
  GraphStep(GraphStep&&) noexcept;
  /// Takes over the function and the captures, dropping this step's own.
  GraphStep& operator=(GraphStep&&) noexcept;

  /// Runs one step, then the step closures it added (mark_step). On CUDA graph replays the
  /// outputs are the graph's static tensors: the next step overwrites them, so clone what you keep.
  Outputs operator()(const Inputs& inputs);
  /// The same with every tensor of `batch` as the inputs, in items() order (data, target, then
  /// the named ones). The cache key covers each tensor with its name, so two batches that differ
  /// in any one tensor's shape, or in their names, are two signatures. (A template only so that
  /// a braced list of tensors, step({x, y}), picks the overload above.)
  template <class B, std::enable_if_t<std::is_same_v<B, Batch>, int> = 0>
  Outputs operator()(const B& batch) {
    return run_batch(batch);
  }

  /// Distinct input signatures seen so far.
  int64_t signatures() const;
  /// The options it was made with.
  const GraphStepOptions& options() const;

  struct Impl;

 private:
  Outputs run_batch(const Batch& batch);
  std::unique_ptr<Impl> impl_;
};

/// Runs `closure` once the current step has finished (at the end of the GraphStep call that is
/// running, or at the next mark_step()), after the closures added before it. For logging and
/// metrics: tensor values are final by then, and reading them does not stall the step itself.
/// Added inside a GraphStep's function, it is recorded with the step and added again after
/// every replay: the tensors it holds are the graph's, and carry each replay's values.
void add_step_closure(std::function<void()> closure);

/// Ends a step: runs the pending step closures in the order they were added. GraphStep calls it
/// after every step; an eager loop may call it itself. An exception from a closure propagates
/// after the remaining closures have run.
void mark_step();

/// What the graph cache is keyed by: each input's dtype, device (when not the CPU) and shape,
/// e.g. "Float[64, 128]; Long[64]". Undefined inputs read "undefined". (A step called with a
/// Batch keys each tensor by its name too: "data Float[64, 128]; target Long[64]; mask ...".)
std::string shape_signature(const std::vector<torch::Tensor>& inputs);

}  // namespace accelerant
