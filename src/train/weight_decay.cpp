#include "accelerant/weight_decay.h"

// instancenorm.h uses torch::nn::functional's instance_norm without including it (LibTorch 1.13).
#include <torch/nn/functional/instancenorm.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/instancenorm.h>
#include <torch/nn/modules/normalization.h>

#include <unordered_set>

namespace accelerant {
namespace {

bool is_norm(const torch::nn::Module& m) {
  return dynamic_cast<const torch::nn::LayerNormImpl*>(&m) ||
         dynamic_cast<const torch::nn::GroupNormImpl*>(&m) ||
         dynamic_cast<const torch::nn::LocalResponseNormImpl*>(&m) ||
         dynamic_cast<const torch::nn::BatchNorm1dImpl*>(&m) ||
         dynamic_cast<const torch::nn::BatchNorm2dImpl*>(&m) ||
         dynamic_cast<const torch::nn::BatchNorm3dImpl*>(&m) ||
         dynamic_cast<const torch::nn::InstanceNorm1dImpl*>(&m) ||
         dynamic_cast<const torch::nn::InstanceNorm2dImpl*>(&m) ||
         dynamic_cast<const torch::nn::InstanceNorm3dImpl*>(&m);
}

bool is_embedding(const torch::nn::Module& m) {
  return dynamic_cast<const torch::nn::EmbeddingImpl*>(&m) ||
         dynamic_cast<const torch::nn::EmbeddingBagImpl*>(&m);
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

WeightDecaySplit split_weight_decay(const torch::nn::Module& module,
                                    const WeightDecayOptions& options) {
  // Parameters owned (directly) by modules whose kind the options exclude.
  std::unordered_set<const c10::TensorImpl*> excluded_by_module;
  for (const auto& sub : module.modules(/*include_self=*/true)) {
    const bool excluded = (options.exclude_norms() && is_norm(*sub)) ||
                          (options.exclude_embeddings() && is_embedding(*sub));
    if (!excluded) continue;
    for (const auto& p : sub->parameters(/*recurse=*/false))
      excluded_by_module.insert(p.unsafeGetTensorImpl());
  }
  WeightDecaySplit split;
  std::unordered_set<const c10::TensorImpl*> seen;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    const torch::Tensor& p = item.value();
    if (!p.requires_grad() || !seen.insert(p.unsafeGetTensorImpl()).second) continue;
    bool decay = p.dim() >= options.min_dim() && !excluded_by_module.count(p.unsafeGetTensorImpl());
    for (const auto& suffix : options.exclude_name_suffixes())
      decay = decay && !ends_with(item.key(), suffix);
    (decay ? split.decay : split.no_decay).push_back(p);
    (decay ? split.decay_names : split.no_decay_names).push_back(item.key());
  }
  return split;
}

}  // namespace accelerant
