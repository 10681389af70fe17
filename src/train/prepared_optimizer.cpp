#include "accelerant/prepared_optimizer.h"

#include "accelerant/error.h"
#include "base/step_recording.h"
#include "base/step_timing.h"
#include "base/text.h"

namespace accelerant {

PreparedOptimizer::PreparedOptimizer(torch::optim::Optimizer& optimizer,
                                     std::shared_ptr<TrainingState> state,
                                     std::shared_ptr<FusedUpdater> fused, Hooks hooks)
    : optimizer_(&optimizer),
      state_(std::move(state)),
      fused_(std::move(fused)),
      updater_(fused_ ? fused_.get() : fused_updater_of(optimizer)),
      hooks_(std::move(hooks)) {
  if (!state_)
    throw Error(
        "PreparedOptimizer needs a TrainingState; got null. Fix: pass "
        "std::make_shared<TrainingState>().");
  if (fused_ && &fused_->optimizer() != optimizer_) {
    throw Error(
        "PreparedOptimizer: the fused update is bound to another optimizer. Fix: bind it to this "
        "one.");
  }
}

bool PreparedOptimizer::step() {
  if (!state_->sync_gradients) return false;
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
bool PreparedOptimizer::step_in_graph() {
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
  if (!state_->sync_gradients) return;
  if (hooks_.zero_gradients) {
    hooks_.zero_gradients();
  } else {
    optimizer_->zero_grad();
  }
}

PreparedScheduler::PreparedScheduler(torch::optim::LRScheduler& scheduler,
                                     std::shared_ptr<TrainingState> state)
    : scheduler_(&scheduler), state_(std::move(state)) {
  if (!state_)
    throw Error(
        "PreparedScheduler needs a TrainingState; got null. Fix: pass "
        "std::make_shared<TrainingState>().");
  seen_optimizer_steps_ = std::make_shared<int64_t>(state_->optimizer_steps);
}

void PreparedScheduler::step() {
  // A host effect: inside a captured step it runs after every replay, after the optimizer's
  // counters (recorded before it), and the new lr reaches the fused update before the next one.
  detail::host_effect([scheduler = scheduler_, state = state_, seen = seen_optimizer_steps_] {
    if (state->optimizer_steps == *seen) return;
    *seen = state->optimizer_steps;
    scheduler->step();
  });
}

}  // namespace accelerant
