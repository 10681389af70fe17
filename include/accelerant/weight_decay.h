// Parameter groups for weight decay: decay the weight matrices, not the biases, the norms'
// gains or (by choice) the embeddings, as GPT-style training does.
//
//   auto groups = accelerant::weight_decay_groups(*model, torch::optim::AdamWOptions(1e-3)
//                                                              .betas({0.9, 0.99})
//                                                              .weight_decay(0.1));
//   torch::optim::AdamW optimizer(groups, torch::optim::AdamWOptions(1e-3));
//
// The result is two ordinary torch::optim parameter groups (decay first, then no decay, each
// with a copy of the given options, the second with weight_decay 0), so it works wherever
// torch::optim does: the fused optimizers, ZeRO stages 1 and 2 (the sharded update reads each
// group's options), schedulers (ScheduledLR keeps a base rate per group) and save_state.
#pragma once

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <memory>
#include <string>
#include <vector>

#include "accelerant/options.h"

namespace accelerant {

/// Which parameters get no weight decay. A parameter is left undecayed when any rule says so.
struct WeightDecayOptions {
  /// Parameters with fewer dimensions than this get no decay: biases and norm gains are 1-D,
  /// weight matrices 2-D or more (nanoGPT's rule). 0 turns the rule off. Default: 2.
  ACCELERANT_OPTION(int64_t, min_dim) = 2;
  /// Parameters of normalisation modules (LayerNorm, GroupNorm, BatchNorm*, InstanceNorm*,
  /// LocalResponseNorm) get no decay, whatever their dimensions. Default: true.
  ACCELERANT_OPTION(bool, exclude_norms) = true;
  /// Parameters of Embedding and EmbeddingBag modules get no decay. nanoGPT decays its token
  /// embedding (it is also the output head's weight), so this is off by default. Default: false.
  ACCELERANT_OPTION(bool, exclude_embeddings) = false;
  /// Parameters whose full name (as named_parameters() gives it, e.g. "blocks.0.attn.bias") ends
  /// with one of these get no decay, e.g. {"bias", "pos_emb"}. Default: none.
  ACCELERANT_OPTION(std::vector<std::string>, exclude_name_suffixes) = {};
};

/// The trainable parameters of a module split by WeightDecayOptions, with their names, each
/// parameter once (a tied weight registered under two names counts under the first).
struct WeightDecaySplit {
  std::vector<torch::Tensor> decay;         ///< parameters to decay, in named_parameters order
  std::vector<std::string> decay_names;     ///< their names
  std::vector<torch::Tensor> no_decay;      ///< parameters not to decay
  std::vector<std::string> no_decay_names;  ///< their names
};

/// Splits `module`'s trainable parameters (requires_grad) by `options`; frozen ones are left out.
WeightDecaySplit split_weight_decay(const torch::nn::Module& module,
                                    const WeightDecayOptions& options = {});

/// Two parameter groups for a torch::optim optimizer: the parameters to decay with a copy of
/// `options`, then the others with a copy whose weight_decay is 0 (a group that would be empty
/// is left out). `Options` is the optimizer's options type (AdamWOptions, AdamOptions,
/// SGDOptions, ...: anything with weight_decay(double)).
template <class Options>
std::vector<torch::optim::OptimizerParamGroup> weight_decay_groups(
    const torch::nn::Module& module, const Options& options, const WeightDecayOptions& rule = {}) {
  WeightDecaySplit split = split_weight_decay(module, rule);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  if (!split.decay.empty()) {
    groups.emplace_back(std::move(split.decay), std::make_unique<Options>(options));
  }
  if (!split.no_decay.empty()) {
    auto none = std::make_unique<Options>(options);
    none->weight_decay(0.0);
    groups.emplace_back(std::move(split.no_decay), std::move(none));
  }
  return groups;
}

}  // namespace accelerant
