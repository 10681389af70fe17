// What Accelerator::prepare returns for an optimizer and a learning-rate scheduler: thin handles
// over the user's own objects that follow the TrainingState.
//
// - While gradient accumulation only accumulates (sync_gradients false), step() and zero_grad()
//   do nothing, so the loop need not know which micro-step it is in.
// - Under fp16, step() unscales the gradients, skips the update when one is inf or nan, and
//   adapts the loss scale (GradScaler: init 65536, growth 2, backoff 0.5, interval 2000).
// - With AcceleratorOptions::fused_optimizers, step() runs a FusedUpdater bound to the user's
//   SGD / Adam / AdamW: same parameter groups and options, one pass over memory per step.
// - The scheduler advances only when the optimizer really stepped: not on accumulating
//   micro-steps, not on fp16 steps skipped for overflow. A schedule therefore counts optimizer
//   updates; build it with the number of updates of the sharded loop (loader.size() after
//   prepare, divided by the accumulation steps), not with the single-process length.
#pragma once
#include <torch/optim/optimizer.h>
#include <torch/optim/schedulers/lr_scheduler.h>

#include <functional>
#include <memory>

#include "accelerant/fused_optimizer.h"
#include "accelerant/training_state.h"

namespace accelerant {

/// What Accelerator::prepare returns for an optimizer: a handle over the user's optimizer that
/// follows a TrainingState (see the file comment). Copies step the same optimizer, with the same
/// state.
class PreparedOptimizer {
 public:
  /// What a sharded update (ZeRO, Accelerator::prepare) adds to step() and zero_grad(). Each is
  /// optional; none is set without ZeRO.
  struct Hooks {
    /// Runs first in every step() that updates, on every process. ZeRO stage 2: the loss scaler
    /// unscales the gradient shares and the processes agree on an overflow
    /// (GradScaler::unscale_shares_).
    std::function<void()> before_update;
    /// Runs after every update step() makes, skipped or not. ZeRO: the all-gather of the
    /// parameters.
    std::function<void()> after_update;
    /// Clears the gradients in place of the optimizer's zero_grad(). ZeRO stage 2:
    /// GradientReducer::zero_gradients (the gradients are its shares).
    std::function<void()> zero_gradients;
  };

  /// Wraps `optimizer` (which must outlive this handle) under `state`. With `fused` (bound to
  /// `optimizer`), step() runs the fused update instead of optimizer.step(); without, an
  /// `optimizer` that is itself fused (FusedSGD / FusedAdam / FusedAdamW) runs its own updater.
  /// Which update runs is decided here, once, and step() calls the scaler's matching entry.
  /// Throws Error when `state` is null or `fused` is bound to another optimizer.
  PreparedOptimizer(torch::optim::Optimizer& optimizer, std::shared_ptr<TrainingState> state,
                    std::shared_ptr<FusedUpdater> fused = nullptr, Hooks hooks = {});

  /// Updates the parameters unless accumulating; under fp16 unscales first and skips on
  /// overflow. Returns whether the parameters were updated. Inside a GraphStep's capture it
  /// queues the update without reading anything on the host and returns true; the counters (and
  /// step_was_skipped) follow after the step, and after every replay. That needs the fused update.
  bool step();
  /// Clears the gradients unless accumulating.
  void zero_grad();
  /// The last step() that should have updated was skipped because of an fp16 overflow.
  bool step_was_skipped() const;
  /// The user's optimizer behind this handle, for its parameter groups, options or state.
  torch::optim::Optimizer& optimizer() const;
  /// The fused update step() runs: the one prepare bound (AcceleratorOptions::fused_optimizers)
  /// or the optimizer's own when it is a fused type; null for a plain torch::optim step.
  FusedUpdater* fused_updater() const;
  /// The TrainingState it follows (the preparing Accelerator's state()).
  const std::shared_ptr<TrainingState>& state() const;

 private:
  struct Impl;  // src/train/prepared_optimizer.cpp; shared by copies, as the optimizer is
  std::shared_ptr<Impl> impl_;
};

/// What Accelerator::prepare returns for a learning-rate scheduler: a handle over the user's
/// scheduler whose step() advances it only when the optimizer really updated the parameters (see
/// the file comment). Copies share the count of optimizer steps already followed.
class PreparedScheduler {
 public:
  /// Wraps `scheduler` (which must outlive this handle) under `state`, counting from its
  /// optimizer_steps now. Throws Error when `state` is null.
  PreparedScheduler(torch::optim::LRScheduler& scheduler, std::shared_ptr<TrainingState> state);

  /// Advances the schedule if the optimizer updated the parameters since the last call. Inside
  /// a GraphStep it is recorded and runs after every replay.
  void step();
  /// The user's scheduler behind this handle.
  torch::optim::LRScheduler& scheduler() const;
  /// After load_state changed the step counters: count from the restored optimizer steps.
  /// Copies of a handle share this, so the user's copy follows too.
  void resync();

 private:
  struct Impl;  // src/train/prepared_optimizer.cpp; shared by copies (the steps already followed)
  std::shared_ptr<Impl> impl_;
};

}  // namespace accelerant
