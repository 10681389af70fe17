#include "accelerant/prepared_optimizer.h"

#include "accelerant/error.h"

namespace accelerant {

PreparedOptimizer::PreparedOptimizer(torch::optim::Optimizer& optimizer, std::shared_ptr<TrainingState> state,
                                     std::shared_ptr<FusedUpdater> fused)
    : optimizer_(&optimizer), state_(std::move(state)), fused_(std::move(fused)) {
  if (!state_) throw Error("PreparedOptimizer needs a TrainingState; got null. Fix: pass std::make_shared<TrainingState>().");
  if (fused_ && &fused_->optimizer() != optimizer_) {
    throw Error("PreparedOptimizer: the fused update is bound to another optimizer. Fix: bind it to this one.");
  }
}

bool PreparedOptimizer::step() {
  if (!state_->sync_gradients) return false;
  bool stepped = true;
  if (state_->scaler && state_->scaler->enabled()) {
    stepped = fused_ ? state_->scaler->step(*fused_) : state_->scaler->step(*optimizer_);
    state_->scaler->update();
  } else if (fused_) {
    fused_->step();
  } else {
    optimizer_->step();
  }
  state_->last_step_skipped = !stepped;
  if (stepped) ++state_->optimizer_steps;
  return stepped;
}

void PreparedOptimizer::zero_grad() {
  if (state_->sync_gradients) optimizer_->zero_grad();
}

PreparedScheduler::PreparedScheduler(torch::optim::LRScheduler& scheduler, std::shared_ptr<TrainingState> state)
    : scheduler_(&scheduler), state_(std::move(state)) {
  if (!state_) throw Error("PreparedScheduler needs a TrainingState; got null. Fix: pass std::make_shared<TrainingState>().");
  seen_optimizer_steps_ = std::make_shared<int64_t>(state_->optimizer_steps);
}

void PreparedScheduler::step() {
  if (state_->optimizer_steps == *seen_optimizer_steps_) return;
  *seen_optimizer_steps_ = state_->optimizer_steps;
  scheduler_->step();
}

}  // namespace accelerant
