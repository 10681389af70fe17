#include "train/fused_state_conversion.h"

#include "accelerant/error.h"
#include "base/text.h"
#include "train/fused_state_format.h"

namespace accelerant::detail {

// (AdamW and Adam are unrelated types in LibTorch 1.13; a user subclass of either is still that
// kind.)
FusedKind fused_kind_of(torch::optim::Optimizer& optimizer) {
  if (dynamic_cast<torch::optim::AdamW*>(&optimizer)) return FusedKind::kAdamW;
  if (dynamic_cast<torch::optim::Adam*>(&optimizer)) return FusedKind::kAdam;
  if (dynamic_cast<torch::optim::SGD*>(&optimizer)) return FusedKind::kSGD;
  throw Error(str("The fused update exists for torch::optim::SGD, Adam and AdamW; this optimizer ",
                  "is another type (", typeid(optimizer).name(), "). Fix: use one of those three, ",
                  "or turn fused optimizers off (AcceleratorOptions::fused_optimizers(false)) to ",
                  "step it with its own step()."));
}

const char* fused_kind_name(FusedKind kind) {
  switch (kind) {
    case FusedKind::kSGD:
      return "SGD";
    case FusedKind::kAdam:
      return "Adam";
    case FusedKind::kAdamW:
      return "AdamW";
  }
  return "?";
}

namespace {

std::vector<torch::Tensor> parameters_in_order(torch::optim::Optimizer& optimizer) {
  std::vector<torch::Tensor> params;
  for (auto& group : optimizer.param_groups()) {
    for (const auto& p : group.params()) params.push_back(p);
  }
  return params;
}

std::string key_of(const torch::Tensor& p) { return c10::guts::to_string(p.unsafeGetTensorImpl()); }

}  // namespace

void load_fused_state_into_optimizer(torch::optim::Optimizer& optimizer,
                                     torch::serialize::InputArchive& fused) {
  const FusedKind kind = fused_kind_of(optimizer);
  torch::Tensor saved_kind, numels, steps, state1, state2, pieces;
  fused.read(kFusedKindKey, saved_kind);
  fused.read(kFusedNumelsKey, numels);
  fused.read(kFusedStepsKey, steps);
  if (fused.try_read(kFusedPiecesKey, pieces)) {
    throw Error("This fused optimizer state is one process's shard; merge the shards first.");
  }
  if (static_cast<FusedKind>(saved_kind.item<int64_t>()) != kind) {
    throw Error(str("the saved state is a ",
                    fused_kind_name(static_cast<FusedKind>(saved_kind.item<int64_t>())),
                    "'s, this optimizer is a ", fused_kind_name(kind),
                    ". Fix: build the optimizer the saved run used."));
  }
  const auto params = parameters_in_order(optimizer);
  const std::vector<int64_t> sizes(numels.data_ptr<int64_t>(),
                                   numels.data_ptr<int64_t>() + numels.numel());
  std::vector<int64_t> now;
  for (const auto& p : params) now.push_back(p.numel());
  if (sizes != now) {
    throw Error(str("the saved state is for ", sizes.size(), " parameters of sizes [",
                    join(sizes, ", "), "], this optimizer has ", now.size(), " of sizes [",
                    join(now, ", "), "]. Fix: build the model and parameter groups as the saved ",
                    "run did."));
  }
  const bool has1 = fused.try_read(kFusedState1Key, state1);
  const bool has2 = fused.try_read(kFusedState2Key, state2);
  if (kind != FusedKind::kSGD && (!has1 || !has2)) {
    throw Error("the saved fused Adam state lacks its moments. Fix: use another checkpoint.");
  }
  const double* counts = steps.to(torch::kDouble).contiguous().data_ptr<double>();
  // Built first, then swapped in: nothing changes when a piece does not fit.
  ska::flat_hash_map<std::string, std::unique_ptr<torch::optim::OptimizerParamState>> state;
  int64_t at = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& p = params[i];
    const int64_t n = p.numel();
    auto piece = [&](const torch::Tensor& flat) {
      return flat.narrow(0, at, n).view(p.sizes()).to(p.device(), p.scalar_type()).clone();
    };
    if (counts[i] > 0) {
      if (kind == FusedKind::kSGD) {
        if (has1) {  // momentum 0 keeps no buffer
          auto s = std::make_unique<torch::optim::SGDParamState>();
          s->momentum_buffer(piece(state1));
          state[key_of(p)] = std::move(s);
        }
      } else if (kind == FusedKind::kAdamW) {
        auto s = std::make_unique<torch::optim::AdamWParamState>();
        s->step(static_cast<int64_t>(counts[i]));
        s->exp_avg(piece(state1));
        s->exp_avg_sq(piece(state2));
        state[key_of(p)] = std::move(s);
      } else {
        auto s = std::make_unique<torch::optim::AdamParamState>();
        s->step(static_cast<int64_t>(counts[i]));
        s->exp_avg(piece(state1));
        s->exp_avg_sq(piece(state2));
        state[key_of(p)] = std::move(s);
      }
    }
    at += n;
  }
  optimizer.state() = std::move(state);
}

void write_optimizer_state_as_fused(torch::optim::Optimizer& optimizer,
                                    torch::serialize::OutputArchive& fused) {
  const FusedKind kind = fused_kind_of(optimizer);
  const auto params = parameters_in_order(optimizer);
  std::vector<int64_t> sizes;
  int64_t total = 0;
  for (const auto& p : params) sizes.push_back(p.numel()), total += p.numel();
  torch::Tensor steps = torch::zeros({static_cast<int64_t>(params.size())}, torch::kDouble);
  torch::Tensor state1 = torch::zeros({total}, torch::kFloat);
  torch::Tensor state2 = kind == FusedKind::kSGD ? torch::Tensor() : torch::zeros({total});
  bool any_momentum = false;
  int64_t at = 0;
  auto put = [&](const torch::Tensor& into, const torch::Tensor& value, int64_t n) {
    if (value.defined()) into.narrow(0, at, n).copy_(value.reshape({-1}).to(torch::kFloat).cpu());
  };
  for (size_t i = 0; i < params.size(); ++i) {
    const int64_t n = params[i].numel();
    auto found = optimizer.state().find(key_of(params[i]));
    if (found != optimizer.state().end()) {
      auto& base = *found->second;
      if (kind == FusedKind::kSGD) {
        auto& s = static_cast<torch::optim::SGDParamState&>(base);
        any_momentum = any_momentum || s.momentum_buffer().defined();
        put(state1, s.momentum_buffer(), n);
        steps[static_cast<int64_t>(i)] = 1;  // stepped: its buffer is no longer the first one
      } else if (kind == FusedKind::kAdamW) {
        auto& s = static_cast<torch::optim::AdamWParamState&>(base);
        if (s.max_exp_avg_sq().defined()) throw Error("amsgrad state: the fused update has none");
        put(state1, s.exp_avg(), n);
        put(state2, s.exp_avg_sq(), n);
        steps[static_cast<int64_t>(i)] = static_cast<double>(s.step());
      } else {
        auto& s = static_cast<torch::optim::AdamParamState&>(base);
        if (s.max_exp_avg_sq().defined()) throw Error("amsgrad state: the fused update has none");
        put(state1, s.exp_avg(), n);
        put(state2, s.exp_avg_sq(), n);
        steps[static_cast<int64_t>(i)] = static_cast<double>(s.step());
      }
    }
    at += n;
  }
  fused.write(kFusedKindKey, torch::tensor(static_cast<int64_t>(kind)));
  fused.write(kFusedNumelsKey, torch::tensor(sizes));
  fused.write(kFusedStepsKey, steps);
  if (kind != FusedKind::kSGD || any_momentum) fused.write(kFusedState1Key, state1);
  if (state2.defined()) fused.write(kFusedState2Key, state2);
}

}  // namespace accelerant::detail
