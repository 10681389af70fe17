// Fused optimizers: SGD (momentum, dampening, Nesterov, weight decay), Adam and AdamW that update
// every parameter in one pass through memory, instead of torch::optim's eight to ten tensor
// operations (each a pass, each a dispatch) per parameter tensor.
//
// The parameters are packed into one contiguous arena at construction (each parameter keeps its
// identity; its storage moves), the optimizer state lives in arenas of the same layout, and
// gradients are bound into a gradient arena at the first step that sees them, unless something
// else (the gradient reducer's buckets) already holds them: autograd then accumulates in place.
// On the CPU the update is one vectorised loop over the arena split across LibTorch's threads;
// on other devices it is a fixed handful of whole-arena tensor operations, whatever the number
// of parameters. Results equal torch::optim's within rounding.
//
// Sync-free: step_unless(flag) leaves everything unchanged when the 0-dim `flag` (the
// GradScaler's found_inf) is non-zero, without reading it on the host when it lives on a GPU.
//
// Two ways in:
//   // 1. drop-in types, torch::optim::SGD / Adam / AdamW underneath (same options, schedulers):
//   accelerant::FusedAdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-3));
//   // 2. keep torch::optim and let prepare switch the update
//   (AcceleratorOptions::fused_optimizers): torch::optim::AdamW adamw(model->parameters(), 1e-3);
//   auto optimizer = accelerator.prepare(adamw);  // step() runs a FusedUpdater bound to adamw
//
// Limits (each refused with an error that says so): fp32 dense parameters on one device;
// amsgrad. Use torch::optim for those.
#pragma once

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <memory>
#include <vector>

#include "accelerant/options.h"

namespace accelerant {

/// A run of consecutive elements of one parameter that this process updates under ZeRO
/// (GradientReducer::shard_pieces): elements [begin, begin + length) of the optimizer's
/// parameter `param`, counted over its parameter groups in order.
struct FusedShardPiece {
  int64_t param = 0;   ///< index of the parameter among all of the optimizer's, group by group
  int64_t begin = 0;   ///< first element, in the flattened parameter
  int64_t length = 0;  ///< elements
  /// Where the piece's gradient is when not in the parameter's .grad: `length` contiguous fp32
  /// elements on the parameter's device (ZeRO stage 2: this process's share of a reduced bucket,
  /// the parameters' .grad being left unset). Undefined: elements [begin, begin + length) of
  /// .grad. When the pieces carry their gradients, every parameter counts as having one.
  torch::Tensor grad;
};

/// How a FusedUpdater runs its update.
struct FusedUpdaterOptions {
  /// Run the whole-arena tensor operations (the path other devices take) on the CPU too, instead
  /// of the CPU loop: for tests that check both paths. Default: false.
  ACCELERANT_OPTION(bool, tensor_ops_on_cpu) = false;
};

/// The fused update of a torch::optim::SGD, Adam or AdamW: it reads that optimizer's parameter
/// groups and their options at every step (so schedulers and add_param_group work) and keeps the
/// state itself.
class FusedUpdater {
 public:
  /// `optimizer` must outlive the updater. Throws for other optimizer types and for parameters
  /// the fused update cannot take (not fp32, sparse, on several devices), saying why.
  explicit FusedUpdater(torch::optim::Optimizer& optimizer, FusedUpdaterOptions options = {});
  ~FusedUpdater();
  FusedUpdater(const FusedUpdater&) = delete;
  FusedUpdater& operator=(const FusedUpdater&) = delete;

  /// Updates every parameter that has a gradient (as torch::optim skips those without).
  void step();
  /// step(), unless `skip` (a 0-dim tensor; non-zero = skip) says the step must not happen; then
  /// parameters, state and step counts stay as they are. On a GPU `skip` is only used on the
  /// device: no host synchronisation.
  void step_unless(const torch::Tensor& skip);

  /// Restricts the update to `pieces` (ZeRO): step() changes only those elements, and the
  /// moments or momentum buffers are kept for them alone, in the order given. The state held so
  /// far is kept for the pieces and dropped for the rest. An empty list (a process that owns
  /// nothing) is allowed. Throws Error for a piece outside its parameter, or overlapping another,
  /// or when some pieces carry a gradient (FusedShardPiece::grad) and others do not.
  void shard(std::vector<FusedShardPiece> pieces);
  /// The pieces of shard(); empty when the update is not sharded.
  const std::vector<FusedShardPiece>& shard_pieces() const;
  /// Whether shard() restricted the update.
  bool sharded() const;

  /// The optimizer state (step counts, moments or momentum buffers) with the parameter sizes it
  /// belongs to; load refuses state saved for other parameters. A sharded updater writes its
  /// pieces and their state only (merge_optimizer_shards makes the whole state of those).
  void save(torch::serialize::OutputArchive& archive) const;
  /// Replaces the state with what save() wrote: whole (a sharded updater takes its pieces out of
  /// it), or this updater's own shard (the same pieces). Throws Error, changing nothing, when it
  /// was saved by another kind of optimizer (SGD vs Adam), for parameters of other sizes, or is
  /// another shard (merge the shards first: merge_optimizer_shards).
  void load(torch::serialize::InputArchive& archive);

  /// Elements in the arena (all parameters of all groups).
  int64_t numel() const;
  /// Whether every parameter's storage is the arena's (false once e.g. model->to() moved them;
  /// the next step packs them again).
  bool parameters_packed() const;
  /// The optimizer it updates for.
  torch::optim::Optimizer& optimizer() const;

 private:
  // The arenas, the state and the shard live in the library (src/train/fused_updater_impl.h):
  // this header states the contract, and the layout can change without rebuilding users.
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Lets GradScaler and PreparedOptimizer find the fused update behind an optimizer.
class FusedOptimizerBase {
 public:
  virtual ~FusedOptimizerBase() = default;
  /// The fused update that this optimizer's step() runs.
  virtual FusedUpdater& updater() = 0;
};

/// A torch::optim optimizer whose step() is a FusedUpdater: the same options and constructors as
/// `TorchOptimizer`, its save/load carry the fused state.
template <class TorchOptimizer, class Options>
class FusedOptimizer : public TorchOptimizer, public FusedOptimizerBase {
 public:
  /// As TorchOptimizer's constructor over parameter groups; `fused` for the update. Throws Error
  /// for parameters the fused update cannot take (see FusedUpdater).
  FusedOptimizer(std::vector<torch::optim::OptimizerParamGroup> param_groups, Options defaults,
                 FusedUpdaterOptions fused = {})
      : TorchOptimizer(std::move(param_groups), std::move(defaults)), updater_(*this, fused) {}
  /// As TorchOptimizer's constructor over one list of parameters; `fused` for the update.
  FusedOptimizer(std::vector<torch::Tensor> params, Options defaults,
                 FusedUpdaterOptions fused = {})
      : TorchOptimizer(std::move(params), std::move(defaults)), updater_(*this, fused) {}

  /// Evaluates `closure` (with gradients on) when given, then runs the fused update. Returns the
  /// closure's loss, or an undefined tensor without one.
  torch::Tensor step(torch::optim::Optimizer::LossClosure closure = nullptr) override {
    torch::Tensor loss;
    if (closure) {
      torch::AutoGradMode grad(true);
      loss = closure();
    }
    updater_.step();
    return loss;
  }
  /// See FusedUpdater::step_unless.
  void step_unless(const torch::Tensor& skip) { updater_.step_unless(skip); }
  /// Saves the fused state (FusedUpdater::save), not torch::optim's per-parameter state.
  void save(torch::serialize::OutputArchive& archive) const override { updater_.save(archive); }
  /// Loads what save() wrote (FusedUpdater::load, which says what it throws).
  void load(torch::serialize::InputArchive& archive) override { updater_.load(archive); }
  /// The fused update this optimizer's step() runs.
  FusedUpdater& updater() override { return updater_; }

 private:
  FusedUpdater updater_;
};

/// torch::optim::SGD with a fused update: momentum, dampening, Nesterov, weight decay.
using FusedSGD = FusedOptimizer<torch::optim::SGD, torch::optim::SGDOptions>;
/// torch::optim::Adam with a fused update (amsgrad is refused).
using FusedAdam = FusedOptimizer<torch::optim::Adam, torch::optim::AdamOptions>;
/// torch::optim::AdamW with a fused update (amsgrad is refused).
using FusedAdamW = FusedOptimizer<torch::optim::AdamW, torch::optim::AdamWOptions>;

/// The whole optimizer state from the shards that the sharded updaters of every process saved
/// (FusedUpdater::save), in rank order: an archive that FusedUpdater::load takes on any number
/// of processes. Throws Error when the shards disagree (kind, parameter sizes) or leave elements
/// of a stepped parameter without state.
void merge_optimizer_shards(const std::vector<torch::serialize::InputArchive*>& shards,
                            torch::serialize::OutputArchive& merged);

/// The FusedUpdater behind `optimizer` when it is one of the types above, else null.
FusedUpdater* fused_updater_of(torch::optim::Optimizer& optimizer);

}  // namespace accelerant
