// FusedUpdater, the public class: construction, the step's entry points, save and load. The
// machinery is behind Impl (train/fused_updater_impl.h), in one file per concept: the arena
// (fused_arena.cpp), the update (fused_step.cpp) and ZeRO's shards (fused_shards.cpp).
#include "accelerant/fused_optimizer.h"

#include "accelerant/error.h"
#include "base/text.h"
#include "train/fused_state_format.h"
#include "train/fused_updater_impl.h"

namespace accelerant {

using detail::FusedKind;

namespace {

const char* kind_name(FusedKind kind) { return detail::fused_kind_name(kind); }
FusedKind kind_of(torch::optim::Optimizer& optimizer) { return detail::fused_kind_of(optimizer); }

}  // namespace

FusedUpdater::FusedUpdater(torch::optim::Optimizer& optimizer, FusedUpdaterOptions options)
    : impl_(std::make_unique<Impl>()) {
  impl_->optimizer = &optimizer;
  impl_->kind = kind_of(optimizer);
  impl_->options = options;
  for (size_t g = 0; g < optimizer.param_groups().size(); ++g) {
    detail::fused_group_constants(impl_->kind, optimizer.param_groups()[g].options(),
                                  g);  // refuses amsgrad now, not at step 1
  }
  if (!optimizer.state().empty()) {
    throw Error(detail::str(
        "This ", kind_name(impl_->kind), " already has state (it has stepped or loaded a ",
        "checkpoint), which the fused update would not continue from. Fix: create the ",
        "fused update before the first step, and load checkpoints through it."));
  }
  impl_->pack();
}

FusedUpdater::~FusedUpdater() = default;

void FusedUpdater::shard(std::vector<FusedShardPiece> pieces) { impl_->shard(std::move(pieces)); }

const std::vector<FusedShardPiece>& FusedUpdater::shard_pieces() const { return impl_->pieces; }

bool FusedUpdater::sharded() const { return impl_->is_sharded; }

void FusedUpdater::step() { impl_->step(torch::Tensor()); }

void FusedUpdater::step_unless(const torch::Tensor& skip) {
  if (!skip.defined() || skip.numel() != 1) {
    throw Error(detail::str(
        "step_unless needs a one-element skip flag (e.g. GradScaler::found_inf()); got ",
        skip.defined() ? detail::str("shape ", skip.sizes()) : std::string("an undefined tensor"),
        "."));
  }
  impl_->step(skip);
}

namespace {
const char* kKind = detail::kFusedKindKey;
const char* kNumels = detail::kFusedNumelsKey;
const char* kSteps = detail::kFusedStepsKey;
const char* kState1 = detail::kFusedState1Key;
const char* kState2 = detail::kFusedState2Key;
// A shard: [pieces, 3] int64 rows of (parameter, begin, length); its states hold those elements.
const char* kPieces = detail::kFusedPiecesKey;

torch::Tensor pieces_tensor(const std::vector<FusedShardPiece>& pieces) {
  torch::Tensor t = torch::empty({static_cast<int64_t>(pieces.size()), 3}, torch::kLong);
  auto a = t.accessor<int64_t, 2>();
  for (size_t k = 0; k < pieces.size(); ++k) {
    a[k][0] = pieces[k].param, a[k][1] = pieces[k].begin, a[k][2] = pieces[k].length;
  }
  return t;
}
}  // namespace

void FusedUpdater::save(torch::serialize::OutputArchive& archive) const {
  impl_->ensure_packed();
  archive.write(kKind, torch::tensor(static_cast<int64_t>(impl_->kind)));
  archive.write(kNumels, torch::tensor(impl_->numels));
  archive.write(kSteps, impl_->steps);
  if (impl_->is_sharded) archive.write(kPieces, pieces_tensor(impl_->pieces));
  if (impl_->state1.defined()) archive.write(kState1, impl_->state1);
  if (impl_->state2.defined()) archive.write(kState2, impl_->state2);
}

void FusedUpdater::load(torch::serialize::InputArchive& archive) {
  Impl& s = *impl_;
  s.ensure_packed();
  torch::Tensor kind, numels, steps, state1, state2;
  archive.read(kKind, kind);
  archive.read(kNumels, numels);
  archive.read(kSteps, steps);
  const auto saved_kind = static_cast<FusedKind>(kind.item<int64_t>());
  if (saved_kind != s.kind) {
    throw Error(detail::str("The saved state is a fused ", kind_name(saved_kind),
                            "'s, this is a fused ", kind_name(s.kind),
                            ". Fix: build the optimizer the saved run used."));
  }
  const std::vector<int64_t> saved(numels.data_ptr<int64_t>(),
                                   numels.data_ptr<int64_t>() + numels.numel());
  if (saved != s.numels) {
    throw Error(detail::str("The saved fused state is for ", saved.size(), " parameters of sizes [",
                            detail::join(saved, ", "), "], this optimizer has ", s.numels.size(),
                            " of sizes [", detail::join(s.numels, ", "),
                            "]. Fix: build the model and parameter groups as ",
                            "the saved run did."));
  }
  torch::Tensor saved_pieces;
  const bool own_shard = archive.try_read(kPieces, saved_pieces) && s.is_sharded &&
                         saved_pieces.equal(pieces_tensor(s.pieces));
  if (saved_pieces.defined() && !own_shard) {
    throw Error(
        "This fused optimizer state is one process's shard (saved under ZeRO); alone it lacks "
        "the other processes' elements. Fix: merge the shards first (merge_optimizer_shards; "
        "Accelerator::load_state does it, and `accelerant checkpoint merge` on the command line).");
  }
  const bool has1 = archive.try_read(kState1, state1), has2 = archive.try_read(kState2, state2);
  torch::NoGradGuard no_grad;
  if (s.uses_state2() && (!has1 || !has2))
    throw Error("The saved fused Adam state lacks its moments. Fix: save it again.");
  // Saved whole, a sharded updater keeps its pieces of it; its own shard it takes as it is.
  if (s.is_sharded && !own_shard) state1 = s.pieces_of(state1), state2 = s.pieces_of(state2);
  s.steps.copy_(steps);
  if (s.uses_state2()) s.state2.copy_(state2);
  if (has1) {
    if (!s.state1.defined()) s.state1 = torch::zeros({s.state_numel()}, s.param_arena.options());
    s.state1.copy_(state1);
  } else if (s.state1.defined()) {
    s.state1.zero_();
  }
}

int64_t FusedUpdater::numel() const { return impl_->param_arena.numel(); }

bool FusedUpdater::parameters_packed() const { return impl_->packed(); }

torch::optim::Optimizer& FusedUpdater::optimizer() const { return *impl_->optimizer; }

FusedUpdater* fused_updater_of(torch::optim::Optimizer& optimizer) {
  auto* fused = dynamic_cast<FusedOptimizerBase*>(&optimizer);
  return fused ? &fused->updater() : nullptr;
}

}  // namespace accelerant
