// What a language-model loop needs of the Accelerator beyond the step itself: prepared token
// windows (saved with the training state), evaluation averaged across processes with one
// collective, and a loss normalised by target tokens across the whole optimizer step.
#include <unordered_set>

#include "accelerant/accelerator.h"
#include "accelerant/error.h"
#include "accelerator/accelerator_impl.h"
#include "base/step_recording.h"
#include "base/text.h"
#include "checkpoint/training_checkpoint.h"
#include "comm/collective_label.h"

namespace accelerant {

TokenWindows Accelerator::prepare_token_windows(const TokenWindows& windows) {
  refuse_under_in_place_recovery("token windows");
  TokenWindows prepared = [&] {
    try {
      return windows.for_process(impl_->rank_, impl_->device_);
    } catch (const Error& e) {
      throw Error(detail::str(impl_->rank_prefix_, "prepare(token windows): ", e.what()));
    }
  }();
  // Every process draws as many batches as the others (one stream each, in lockstep), so the
  // main process's position stands for all: a registered object.
  register_checkpoint_object(
      [prepared](torch::serialize::OutputArchive& a) { prepared.save(a); },
      [prepared](torch::serialize::InputArchive& a) mutable { prepared.load(a); });
  impl_->prepared_token_windows_ = true;
  // auto_resume loads the newest checkpoint at auto_resume_now() (windows have no begin()).
  if (impl_->options_.auto_resume() && !impl_->resume_armed_) {
    impl_->resume_armed_ = true;
    impl_->resume_hook_->arm([this] { resume_from_latest(); });
  }
  return prepared;
}

std::map<std::string, double> Accelerator::evaluate_modules(
    const std::vector<std::shared_ptr<torch::nn::Module>>& modules,
    const std::function<void(MeanMetrics&)>& body) {
  if (detail::recording_step()) {
    throw Error(
        "evaluate() inside a graph step: it reads its result on the host. Fix: evaluate between "
        "steps.");
  }
  // Each module's own mode (a submodule may have been put in eval mode on purpose) comes back.
  struct ModeRestore {
    std::vector<std::pair<std::shared_ptr<torch::nn::Module>, bool>> modes;
    ~ModeRestore() {
      for (auto& [module, training] : modes) module->train(training);
    }
  } restore;
  for (const auto& model : modules) {
    for (const auto& m : model->modules(/*include_self=*/true))
      restore.modes.emplace_back(m, m->is_training());
  }
  MeanMetrics metrics;
  {
    torch::NoGradGuard no_grad;
    for (const auto& model : modules) model->eval();
    body(metrics);
  }
  const std::vector<std::string> names = metrics.names();
  // One all-reduce: every metric's sum and weight, then a fingerprint of the names, so that
  // processes that evaluated different metrics are told so instead of mixing them up.
  const uint64_t fingerprint = std::hash<std::string>{}(detail::join(names, "\n")) % (1ULL << 40);
  torch::Tensor packed = metrics.packed().to(impl_->device_);
  packed = torch::cat(
      {packed, torch::tensor({static_cast<double>(fingerprint), static_cast<double>(names.size())},
                             torch::TensorOptions(torch::kDouble).device(impl_->device_))});
  if (impl_->world_size_ > 1) {
    detail::ScopedCollectiveLabel label("evaluate");
    packed = communicator().all_reduce(packed, ReduceOp::kSum);
  }
  const torch::Tensor host = packed.to(torch::kCPU);
  const int64_t n = host.numel();
  const double world = static_cast<double>(impl_->world_size_);
  if (host[n - 2].item<double>() != world * static_cast<double>(fingerprint) ||
      host[n - 1].item<double>() != world * static_cast<double>(names.size())) {
    throw Error(detail::str(
        impl_->rank_prefix_, "evaluate(): the processes added different metrics (this one: ",
        names.empty() ? std::string("none") : detail::join(names, ", "),
        "). Likely cause: a metric added only on some processes, e.g. inside a loop that runs "
        "zero times on one of them. Fix: add every metric on every process (a weight of 0 is "
        "allowed)."));
  }
  return metrics.means_of(host.narrow(0, 0, n - 2));
}

void Accelerator::backward_per_token(const torch::Tensor& loss_sum, int64_t target_tokens) {
  if (detail::recording_step()) {
    throw Error(
        "backward_per_token() inside a graph step: it reads the step's token count on the host. "
        "Fix: use backward() with a mean loss in graph steps.");
  }
  if (!loss_sum.defined() || loss_sum.numel() != 1 || target_tokens < 0) {
    throw Error(detail::str(
        "backward_per_token() needs the sum of this micro-batch's per-token losses (one value) "
        "and its number of target tokens (>= 0); got ",
        loss_sum.defined() ? c10::str("a tensor of shape ", loss_sum.sizes())
                           : std::string("an undefined tensor"),
        " and ", target_tokens,
        " tokens. Fix: cross_entropy(..., CrossEntropyFuncOptions().reduction(torch::kSum)) "
        "and the count of targets that are not ignored."));
  }
  warn_if_data_unsharded();
  impl_->step_tokens_ += target_tokens;
  const bool synchronising = impl_->state_->sync_gradients;
  double total_tokens = static_cast<double>(impl_->step_tokens_);
  if (synchronising && impl_->world_size_ > 1) {
    // Before backward, so that the count comes ahead of the gradient buckets on every rank.
    detail::ScopedCollectiveLabel label("backward_per_token token count");
    total_tokens =
        communicator()
            .all_reduce(torch::tensor(total_tokens,
                                      torch::TensorOptions(torch::kDouble).device(impl_->device_)),
                        ReduceOp::kSum)
            .item<double>();
  }
  torch::Tensor scaled = loss_sum;
  if (impl_->state_->scaler) scaled = impl_->state_->scaler->scale(scaled);
  scaled.backward();
  if (!synchronising) return;  // accumulating: the sums add up in the gradients
  impl_->step_tokens_ = 0;
  if (total_tokens <= 0) {
    throw Error(detail::str(
        impl_->rank_prefix_,
        "backward_per_token(): this optimizer step had no target tokens on any process, so the "
        "mean over tokens is undefined. Likely cause: every label ignored (e.g. all padding). "
        "Fix: skip such batches before backward."));
  }
  // The reducer averaged over processes (a division by their number): undo it and divide by the
  // tokens instead.
  scale_gradients(static_cast<double>(impl_->world_size_) / total_tokens);
}

void Accelerator::scale_gradients(double factor) {
  torch::NoGradGuard no_grad;
  if (gradients_sharded()) {
    for (const auto& prepared : impl_->models_) {
      for (auto& share : prepared.reducer->gradient_shares()) share.mul_(factor);
    }
    return;
  }
  // The parameters of the prepared models and optimizers, each once.
  std::unordered_set<const c10::TensorImpl*> seen;
  auto scale = [&](const torch::Tensor& p) {
    if (p.grad().defined() && seen.insert(p.unsafeGetTensorImpl()).second) p.grad().mul_(factor);
  };
  for (const auto& prepared : impl_->models_) {
    for (const auto& p : prepared.module->parameters()) scale(p);
  }
  for (const auto& prepared : impl_->checkpointed_->optimizers) {
    for (const auto& group : prepared.optimizer->param_groups()) {
      for (const auto& p : group.params()) scale(p);
    }
  }
}

}  // namespace accelerant
