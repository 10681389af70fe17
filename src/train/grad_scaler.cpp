#include "accelerant/grad_scaler.h"

#include "accelerant/communicator.h"
#include "accelerant/error.h"
#include "accelerant/fused_optimizer.h"  // the FusedUpdater entry points
#include "base/step_recording.h"
#include "base/text.h"

namespace accelerant {
namespace {

std::vector<torch::Tensor> optimizer_params(torch::optim::Optimizer& optimizer) {
  std::vector<torch::Tensor> params;
  for (auto& group : optimizer.param_groups()) {
    for (auto& p : group.params()) params.push_back(p);
  }
  return params;
}

// Divides `grads` by `scale` in place and records in `found_inf` whether any is inf or nan. Stays
// on the device: no .item() here. In place, as all of the scaler's state: a captured step reads
// and writes the tensors it was captured with.
void unscale_gradients(const std::vector<torch::Tensor>& grads, const torch::Tensor& scale,
                       const torch::Tensor& found_inf) {
  torch::NoGradGuard no_grad;
  const auto inverse = scale.reciprocal();
  std::vector<torch::Tensor> non_finite;  // one 0-dim flag per gradient, reduced once below
  for (const auto& g : grads) {
    g.mul_(inverse.to(g.scalar_type()));
    non_finite.push_back(torch::isfinite(g).logical_not().any());
  }
  if (!non_finite.empty()) found_inf.copy_(torch::stack(non_finite).any());
}

void check_not_unscaled(bool unscaled, const char* call) {
  if (unscaled) {
    throw Error(detail::str("GradScaler::", call,
                            " was called twice in one step. Fix: unscale at most once between "
                            "update() calls (step() unscales only when you have not)."));
  }
}

}  // namespace

// A scaler's options and state; the tensors are 0-dim and updated in place (see found_inf()).
struct GradScaler::Impl {
  GradScalerOptions options_;
  torch::Tensor scale_;           // 0-dim float
  torch::Tensor growth_tracker_;  // 0-dim int: clean steps since the last change
  torch::Tensor found_inf_;       // 0-dim float
  bool unscaled_ = false;
};

GradScaler::GradScaler(GradScalerOptions options, torch::Device device)
    : impl_(std::make_unique<Impl>()) {
  if (options.init_scale() <= 0 || options.growth_factor() <= 1 || options.backoff_factor() <= 0 ||
      options.backoff_factor() >= 1 || options.growth_interval() < 1) {
    throw Error(detail::str("GradScaler options out of range: init_scale ", options.init_scale(),
                            ", growth_factor ", options.growth_factor(), ", backoff_factor ",
                            options.backoff_factor(), ", growth_interval ",
                            options.growth_interval(),
                            ". Fix: init_scale > 0, growth_factor > 1, 0 < backoff_factor < 1, "
                            "growth_interval >= 1."));
  }
  auto f = torch::TensorOptions().dtype(torch::kFloat).device(device);
  impl_->scale_ = torch::full({}, options.init_scale(), f);
  impl_->growth_tracker_ = torch::zeros({}, f.dtype(torch::kInt));
  impl_->found_inf_ = torch::zeros({}, f);
  impl_->options_ = options;
}

GradScaler::~GradScaler() = default;
GradScaler::GradScaler(const GradScaler& other) : impl_(std::make_unique<Impl>(*other.impl_)) {}
GradScaler& GradScaler::operator=(const GradScaler& other) {
  if (this != &other) impl_ = std::make_unique<Impl>(*other.impl_);
  return *this;
}
GradScaler::GradScaler(GradScaler&&) noexcept = default;
GradScaler& GradScaler::operator=(GradScaler&&) noexcept = default;

bool GradScaler::unscaled() const { return impl_->unscaled_; }
const torch::Tensor& GradScaler::found_inf() const { return impl_->found_inf_; }
const torch::Tensor& GradScaler::scale_tensor() const { return impl_->scale_; }
bool GradScaler::enabled() const { return impl_->options_.enabled(); }

torch::Tensor GradScaler::scale(const torch::Tensor& loss) const {
  if (!enabled()) return loss;
  return loss * impl_->scale_.to(loss.device()).to(loss.scalar_type());
}

void GradScaler::unscale_(const std::vector<torch::Tensor>& params) {
  if (!enabled()) return;
  check_not_unscaled(impl_->unscaled_, "unscale_");
  std::vector<torch::Tensor> grads;
  for (const auto& p : params) {
    if (p.grad().defined()) grads.push_back(p.grad());
  }
  unscale_gradients(grads, impl_->scale_, impl_->found_inf_);
  impl_->unscaled_ = true;
}

void GradScaler::unscale_shares_(const std::vector<torch::Tensor>& shares,
                                 Communicator& communicator) {
  if (!enabled()) return;
  if (detail::recording_step()) {
    throw Error(
        "GradScaler::unscale_shares_ inside a graph step: the processes agree on an overflow "
        "through an all-reduce, which a graph step does not record. Fix: run ZeRO stage 2 with "
        "fp16 eagerly, or use zero_stage(1) in graph mode (its gradients are whole: each "
        "process sees every overflow).");
  }
  check_not_unscaled(impl_->unscaled_, "unscale_shares_");
  unscale_gradients(shares, impl_->scale_, impl_->found_inf_);
  // Each process tested only its share: an overflow anywhere must skip the step everywhere, or
  // the processes' parameters would part (an owner skipping its shard, the others updating).
  communicator.all_reduce_(impl_->found_inf_, ReduceOp::kMax);
  impl_->unscaled_ = true;
}

void GradScaler::unscale_(torch::optim::Optimizer& optimizer) {
  unscale_(optimizer_params(optimizer));
}

bool GradScaler::step(torch::optim::Optimizer& optimizer) {
  if (!enabled()) {
    optimizer.step();
    return true;
  }
  if (detail::recording_step()) {
    throw Error(
        "GradScaler::step(torch::optim optimizer) inside a graph step: deciding whether to skip "
        "the "
        "update means reading found_inf on the host, which a captured step cannot do. Fix: use a "
        "fused "
        "optimizer (accelerant::FusedAdamW / FusedSGD, or "
        "AcceleratorOptions::fused_optimizers(true)) "
        "and step_on_device(its updater()).");
  }
  if (!impl_->unscaled_) unscale_(optimizer);
  // The one host read: torch::optim cannot take a device-side skip flag.
  if (impl_->found_inf_.item<float>() != 0.0f) return false;
  optimizer.step();
  return true;
}

void GradScaler::step_on_device(FusedUpdater& updater) {
  if (!enabled()) {
    updater.step();
    return;
  }
  if (!impl_->unscaled_) unscale_(updater.optimizer());
  updater.step_unless(impl_->found_inf_);  // queued on the device with the flag: no sync before it
}

bool GradScaler::step(FusedUpdater& updater) {
  if (detail::recording_step()) {
    throw Error(
        "GradScaler::step() inside a graph step: its result is read on the host, which a captured "
        "step cannot do. Fix: call step_on_device() and read found_inf() after the step, e.g. in "
        "a step closure (PreparedOptimizer does this for you).");
  }
  step_on_device(updater);
  // Read only after the step was queued, for the caller's step counters.
  return !enabled() || impl_->found_inf_.item<float>() == 0.0f;
}

void GradScaler::update() {
  if (!enabled()) return;
  torch::NoGradGuard no_grad;
  Impl& s = *impl_;
  const auto overflow = s.found_inf_ > 0;
  const auto clean_steps =
      torch::where(overflow, torch::zeros_like(s.growth_tracker_), s.growth_tracker_ + 1);
  const auto grow = clean_steps >= s.options_.growth_interval();
  s.scale_.copy_(torch::where(overflow, s.scale_ * s.options_.backoff_factor(),
                              torch::where(grow, s.scale_ * s.options_.growth_factor(), s.scale_)));
  s.growth_tracker_.copy_(torch::where(grow, torch::zeros_like(clean_steps), clean_steps));
  s.found_inf_.zero_();
  s.unscaled_ = false;
}

double GradScaler::current_scale() const { return impl_->scale_.item<double>(); }

void GradScaler::save(torch::serialize::OutputArchive& archive) const {
  archive.write("scale", impl_->scale_.cpu());
  archive.write("growth_tracker", impl_->growth_tracker_.cpu());
}

void GradScaler::load(torch::serialize::InputArchive& archive) {
  torch::Tensor scale, tracker;
  archive.read("scale", scale);
  archive.read("growth_tracker", tracker);
  impl_->scale_.copy_(scale);
  impl_->growth_tracker_.copy_(tracker);
  impl_->found_inf_.zero_();
  impl_->unscaled_ = false;
}

}  // namespace accelerant
