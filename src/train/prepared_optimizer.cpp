#include "accelerant/prepared_optimizer.h"

#include "accelerant/error.h"
#include "base/step_recording.h"
#include "base/step_timing.h"
#include "base/text.h"

namespace accelerant {

// What a PreparedOptimizer holds; every member is set at construction and never replaced, so
// copies of the handle share one.
struct PreparedOptimizer::Impl {
  Impl(torch::optim::Optimizer& optimizer, std::shared_ptr<TrainingState> state,
       std::shared_ptr<FusedUpdater> fused, Hooks hooks)
      : optimizer_(&optimizer),
        state_(std::move(state)),
        fused_(std::move(fused)),
        updater_(fused_ ? fused_.get() : fused_updater_of(optimizer)),
        hooks_(std::move(hooks)) {}

  bool step();
  bool step_in_graph();  // step() inside a GraphStep's capture

  torch::optim::Optimizer* optimizer_;
  std::shared_ptr<TrainingState> state_;
  std::shared_ptr<FusedUpdater> fused_;  // owned here when prepare bound it
  FusedUpdater* updater_;                // fused_, the optimizer's own, or null: decided once
  Hooks hooks_;
  // Graph steps under fp16: this step's skip flag, kept past the scaler's update(). Written in
  // place by every step and replay; the replays' host effects hold it too.
  std::shared_ptr<torch::Tensor> skip_flag_ = std::make_shared<torch::Tensor>();
};

PreparedOptimizer::PreparedOptimizer(torch::optim::Optimizer& optimizer,
                                     std::shared_ptr<TrainingState> state,
                                     std::shared_ptr<FusedUpdater> fused, Hooks hooks)
    : impl_(
          std::make_shared<Impl>(optimizer, std::move(state), std::move(fused), std::move(hooks))) {
  if (!impl_->state_)
    throw Error(
        "PreparedOptimizer needs a TrainingState; got null. Fix: pass "
        "std::make_shared<TrainingState>().");
  if (impl_->fused_ && &impl_->fused_->optimizer() != impl_->optimizer_) {
    throw Error(
        "PreparedOptimizer: the fused update is bound to another optimizer. Fix: bind it to this "
        "one.");
  }
}

bool PreparedOptimizer::step_was_skipped() const { return impl_->state_->last_step_skipped; }
torch::optim::Optimizer& PreparedOptimizer::optimizer() const { return *impl_->optimizer_; }
FusedUpdater* PreparedOptimizer::fused_updater() const { return impl_->updater_; }
const std::shared_ptr<TrainingState>& PreparedOptimizer::state() const { return impl_->state_; }

bool PreparedOptimizer::step() { return impl_->step(); }

bool PreparedOptimizer::Impl::step() {
  if (!state_->sync_gradients) return false;
  if (state_->step_abandoned) {  // done again from its batch (every optimizer skips it)
    state_->last_step_skipped = true;
    return false;
  }
  if (detail::recording_step()) return step_in_graph();
  bool stepped = true;
  {
    detail::PhaseTimer updating(detail::StepPhase::optimizer, "optimizer");
    if (hooks_.before_update) hooks_.before_update();
    if (state_->scaler && state_->scaler->enabled()) {
      stepped = updater_ ? state_->scaler->step(*updater_) : state_->scaler->step(*optimizer_);
      state_->scaler->update();
    } else if (updater_) {
      updater_->step();
    } else {
      optimizer_->step();
    }
    // Every process runs it, whether its update was skipped or not: under ZeRO a collective.
    if (hooks_.after_update) hooks_.after_update();
  }
  state_->last_step_skipped = !stepped;
  if (stepped) ++state_->optimizer_steps;
  detail::end_timed_step(optimizer_, state_->optimizer_steps);
  return stepped;
}

// Inside a captured step nothing is read on the host: the update is queued with the skip
// decision on the device, and the step counters become a host effect that runs after every
// replay and reads the flag then, once the step's work has been queued in full. Under ZeRO the
// parameters' all-gather is a host effect too, before the counters: a collective of the
// transport (shared memory, Gloo) that no capture holds, run after every replay instead.
bool PreparedOptimizer::Impl::step_in_graph() {
  if (!updater_) {
    throw Error(detail::str(
        "PreparedOptimizer::step() inside a graph step with an unfused torch::optim optimizer: "
        "its step sizes (bias corrections, the learning rate) are computed on the host, so a "
        "replay would repeat the captured step's values. Fix: ",
        "AcceleratorOptions::fused_optimizers(true), or build the optimizer as "
        "accelerant::FusedAdamW / FusedAdam / FusedSGD."));
  }
  auto state = state_;
  if (hooks_.before_update) hooks_.before_update();
  if (state_->scaler && state_->scaler->enabled()) {
    GradScaler& scaler = *state_->scaler;
    scaler.step_on_device(*updater_);
    if (hooks_.after_update) detail::host_effect(hooks_.after_update);
    // update() resets found_inf, and the effect runs after the whole step: keep this step's flag,
    // in one tensor that every step (and replay) writes in place.
    if (!skip_flag_->defined()) *skip_flag_ = torch::empty_like(scaler.found_inf());
    skip_flag_->copy_(scaler.found_inf());
    scaler.update();
    detail::host_effect([state, flag = skip_flag_, owner = optimizer_] {
      state->last_step_skipped = flag->item<float>() != 0.0f;
      if (!state->last_step_skipped) ++state->optimizer_steps;
      detail::end_timed_step(owner, state->optimizer_steps);
    });
  } else {
    updater_->step();
    if (hooks_.after_update) detail::host_effect(hooks_.after_update);
    detail::host_effect([state, owner = optimizer_] {
      state->last_step_skipped = false;
      ++state->optimizer_steps;
      detail::end_timed_step(owner, state->optimizer_steps);
    });
  }
  return true;  // queued; whether it was skipped is known after the step (step_was_skipped)
}

void PreparedOptimizer::zero_grad() {
  if (!impl_->state_->sync_gradients) return;
  if (impl_->hooks_.zero_gradients) {
    impl_->hooks_.zero_gradients();
  } else {
    impl_->optimizer_->zero_grad();
  }
}

// What a PreparedScheduler holds; copies of the handle share one, and so the count of optimizer
// steps already followed.
struct PreparedScheduler::Impl {
  torch::optim::LRScheduler* scheduler_;
  std::shared_ptr<TrainingState> state_;
  int64_t seen_optimizer_steps_ = 0;
};

PreparedScheduler::PreparedScheduler(torch::optim::LRScheduler& scheduler,
                                     std::shared_ptr<TrainingState> state)
    : impl_(std::make_shared<Impl>()) {
  if (!state)
    throw Error(
        "PreparedScheduler needs a TrainingState; got null. Fix: pass "
        "std::make_shared<TrainingState>().");
  impl_->scheduler_ = &scheduler;
  impl_->seen_optimizer_steps_ = state->optimizer_steps;
  impl_->state_ = std::move(state);
}

torch::optim::LRScheduler& PreparedScheduler::scheduler() const { return *impl_->scheduler_; }

void PreparedScheduler::resync() { impl_->seen_optimizer_steps_ = impl_->state_->optimizer_steps; }

void PreparedScheduler::step() {
  // A host effect: inside a captured step it runs after every replay, after the optimizer's
  // counters (recorded before it), and the new lr reaches the fused update before the next one.
  detail::host_effect([impl = impl_] {
    if (impl->state_->optimizer_steps == impl->seen_optimizer_steps_) return;
    impl->seen_optimizer_steps_ = impl->state_->optimizer_steps;
    impl->scheduler_->step();
  });
}

}  // namespace accelerant
