#include "train/share_state.h"

#include <unordered_map>

#include "accelerant/error.h"
#include "accelerant/sharded.h"
#include "base/text.h"
#include "train/fused_state_conversion.h"
#include "train/fused_state_format.h"

namespace accelerant::detail {

std::vector<ShareSlot> share_slots(const torch::optim::Optimizer& optimizer,
                                   const std::vector<std::shared_ptr<torch::nn::Module>>& models) {
  // Each share's whole parameter: a freed parameter keeps its shape.
  std::unordered_map<const c10::TensorImpl*, int64_t> whole_numel;
  for (const auto& model : models) {
    for (const auto& block : sharded_blocks(*model)) {
      const auto params = block->block()->parameters();
      const auto& shares = block->shares();
      for (size_t i = 0; i < shares.size(); ++i)
        whole_numel[shares[i].unsafeGetTensorImpl()] = params[i].numel();
    }
  }
  std::vector<ShareSlot> slots;
  for (const auto& group : optimizer.param_groups()) {
    for (const auto& p : group.params()) {
      auto found = whole_numel.find(p.unsafeGetTensorImpl());
      slots.push_back(found == whole_numel.end() ? ShareSlot{p.numel(), 0}
                                                 : ShareSlot{found->second, p.numel()});
    }
  }
  return slots;
}

torch::Tensor share_slots_tensor(const std::vector<ShareSlot>& slots) {
  torch::Tensor t = torch::empty({static_cast<int64_t>(slots.size()), 2}, torch::kLong);
  auto rows = t.accessor<int64_t, 2>();
  for (size_t s = 0; s < slots.size(); ++s) {
    rows[static_cast<int64_t>(s)][0] = slots[s].numel;
    rows[static_cast<int64_t>(s)][1] = slots[s].share;
  }
  return t;
}

std::vector<ShareSlot> share_slots_from_tensor(const torch::Tensor& tensor) {
  if (tensor.dim() != 2 || tensor.size(1) != 2 || tensor.scalar_type() != torch::kLong) {
    throw Error(detail::str("the stage-3 share layout is a ", tensor.toString(), " of shape ",
                            tensor.sizes(), ", not int64 [slots, 2]. The file is damaged."));
  }
  std::vector<ShareSlot> slots;
  auto rows = tensor.accessor<int64_t, 2>();
  for (int64_t s = 0; s < tensor.size(0); ++s) slots.push_back({rows[s][0], rows[s][1]});
  return slots;
}

namespace {

// A fused state's parts (note "Fused state form").
struct FusedParts {
  torch::Tensor kind, numels, steps, state1, state2;

  static FusedParts read(torch::serialize::InputArchive& a) {
    FusedParts parts;
    a.read(kFusedKindKey, parts.kind);
    a.read(kFusedNumelsKey, parts.numels);
    a.read(kFusedStepsKey, parts.steps);
    a.try_read(kFusedState1Key, parts.state1);
    a.try_read(kFusedState2Key, parts.state2);
    return parts;
  }

  std::vector<int64_t> sizes() const {
    return {numels.data_ptr<int64_t>(), numels.data_ptr<int64_t>() + numels.numel()};
  }

  void write(torch::serialize::OutputArchive& a) const {
    a.write(kFusedKindKey, kind);
    a.write(kFusedNumelsKey, numels);
    a.write(kFusedStepsKey, steps);
    if (state1.defined()) a.write(kFusedState1Key, state1);
    if (state2.defined()) a.write(kFusedState2Key, state2);
  }
};

// The elements of `slot` that process `rank` keeps: [begin, begin + length) of the whole
// parameter (all of it for a replicated one; none for a process past its end).
std::pair<int64_t, int64_t> piece_of(const ShareSlot& slot, int rank) {
  if (slot.share == 0) return {0, slot.numel};
  const int64_t begin = std::min(slot.numel, rank * slot.share);
  return {begin, std::min(slot.share, slot.numel - begin)};
}

std::vector<int64_t> share_sizes(const std::vector<ShareSlot>& slots) {
  std::vector<int64_t> sizes;
  for (const auto& s : slots) sizes.push_back(s.share > 0 ? s.share : s.numel);
  return sizes;
}

std::vector<int64_t> whole_sizes(const std::vector<ShareSlot>& slots) {
  std::vector<int64_t> sizes;
  for (const auto& s : slots) sizes.push_back(s.numel);
  return sizes;
}

// Each size's offset in the elements laid end to end, and their total.
std::pair<std::vector<int64_t>, int64_t> offsets_of(const std::vector<int64_t>& sizes) {
  std::vector<int64_t> offsets;
  int64_t total = 0;
  for (int64_t n : sizes) offsets.push_back(total), total += n;
  return {offsets, total};
}

// A state buffer of `total` elements, or none where `like` has none.
torch::Tensor zeros_like_buffer(const torch::Tensor& like, int64_t total) {
  return like.defined() ? torch::zeros({total}, torch::kFloat) : torch::Tensor();
}

// Copies `length` elements of each defined buffer of `from`, at `from_at`, into `to`, at `to_at`.
void copy_elements(const FusedParts& from, int64_t from_at, FusedParts& to, int64_t to_at,
                   int64_t length) {
  if (length <= 0) return;
  if (to.state1.defined())
    to.state1.narrow(0, to_at, length).copy_(from.state1.narrow(0, from_at, length));
  if (to.state2.defined())
    to.state2.narrow(0, to_at, length).copy_(from.state2.narrow(0, from_at, length));
}

}  // namespace

void merge_share_states(const std::vector<torch::serialize::InputArchive*>& processes,
                        const std::vector<ShareSlot>& slots,
                        torch::serialize::OutputArchive& whole) {
  if (processes.empty()) throw Error("merge_share_states: no process's state given.");
  const std::vector<int64_t> saved_sizes = share_sizes(slots);
  const auto [saved_offsets, saved_total] = offsets_of(saved_sizes);
  std::vector<FusedParts> parts;
  for (size_t r = 0; r < processes.size(); ++r) {
    parts.push_back(FusedParts::read(*processes[r]));
    const FusedParts& p = parts.back();
    torch::Tensor pieces;
    if (processes[r]->try_read(kFusedPiecesKey, pieces) || p.sizes() != saved_sizes) {
      throw Error(detail::str("rank ", r, "'s state is over parameters of sizes [",
                              join(p.sizes(), ", "), "], where its share layout says [",
                              join(saved_sizes, ", "),
                              "]. Likely cause: the file is damaged or comes from another run. "
                              "Fix: use the files one save_state wrote, together."));
    }
    if (r > 0 && (!p.kind.equal(parts[0].kind) || !p.steps.equal(parts[0].steps) ||
                  p.state1.defined() != parts[0].state1.defined() ||
                  p.state2.defined() != parts[0].state2.defined())) {
      throw Error(
          detail::str("rank ", r,
                      "'s state differs from rank 0's in its optimizer kind, its "
                      "buffers or its step counts (every process updates its shares at every "
                      "step): the files come from different saves. Fix: use the files one "
                      "save_state wrote, together."));
    }
  }
  FusedParts merged;
  merged.kind = parts[0].kind;
  merged.steps = parts[0].steps;
  const std::vector<int64_t> sizes = whole_sizes(slots);
  merged.numels = torch::tensor(sizes);
  const auto [offsets, total] = offsets_of(sizes);
  merged.state1 = zeros_like_buffer(parts[0].state1, total);
  merged.state2 = zeros_like_buffer(parts[0].state2, total);
  for (size_t s = 0; s < slots.size(); ++s) {
    if (slots[s].share == 0) {  // replicated: every process holds the same whole state
      copy_elements(parts[0], saved_offsets[s], merged, offsets[s], slots[s].numel);
      continue;
    }
    for (size_t r = 0; r < parts.size(); ++r) {
      const auto [begin, length] = piece_of(slots[s], static_cast<int>(r));
      copy_elements(parts[r], saved_offsets[s], merged, offsets[s] + begin, length);
    }
    if (static_cast<int64_t>(parts.size()) * slots[s].share < slots[s].numel) {
      throw Error(
          detail::str(parts.size(), " processes' shares of ", slots[s].share,
                      " elements do not cover a parameter of ", slots[s].numel,
                      ": a rank's state is missing. Fix: pass every rank's file, in rank order."));
    }
  }
  merged.write(whole);
}

void cut_share_state(torch::serialize::InputArchive& whole, const std::vector<ShareSlot>& slots,
                     int rank, torch::serialize::OutputArchive& shares) {
  torch::Tensor pieces;
  if (whole.try_read(kFusedPiecesKey, pieces)) {
    throw Error("cut_share_state: the state is one process's ZeRO shard; merge the shards first.");
  }
  const FusedParts parts = FusedParts::read(whole);
  const std::vector<int64_t> sizes = whole_sizes(slots);
  if (parts.sizes() != sizes) {
    throw Error(detail::str(
        "the saved state is for ", parts.numels.numel(), " parameters of sizes [",
        join(parts.sizes(), ", "), "], this optimizer's are ", sizes.size(), " of sizes [",
        join(sizes, ", "), "]. Fix: build the model and parameter groups as the saved run did."));
  }
  const auto [offsets, total] = offsets_of(sizes);
  const auto [share_offsets, share_total] = offsets_of(share_sizes(slots));
  FusedParts cut;
  cut.kind = parts.kind;
  cut.steps = parts.steps;
  cut.numels = torch::tensor(share_sizes(slots));
  cut.state1 = zeros_like_buffer(parts.state1, share_total);
  cut.state2 = zeros_like_buffer(parts.state2, share_total);
  for (size_t s = 0; s < slots.size(); ++s) {
    const auto [begin, length] = piece_of(slots[s], rank);
    copy_elements(parts, offsets[s] + begin, cut, share_offsets[s], length);
  }
  cut.write(shares);
}

namespace {

// An optimizer of `like`'s type, options and group sizes over new tensors of `numels` elements.
std::unique_ptr<torch::optim::Optimizer> optimizer_like(const torch::optim::Optimizer& like,
                                                        const std::vector<int64_t>& numels) {
  auto& mutable_like = const_cast<torch::optim::Optimizer&>(like);  // fused_kind_of only reads
  const FusedKind kind = fused_kind_of(mutable_like);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  size_t at = 0;
  for (const auto& group : like.param_groups()) {
    std::vector<torch::Tensor> params;
    for (size_t i = 0; i < group.params().size(); ++i, ++at) {
      if (at >= numels.size()) break;
      params.push_back(torch::empty({numels[at]}));
    }
    groups.emplace_back(std::move(params), group.options().clone());
  }
  if (at != numels.size()) {
    throw Error(detail::str("the optimizer has ", at, " parameters, the slots ", numels.size()));
  }
  switch (kind) {
    case FusedKind::kSGD:
      return std::make_unique<torch::optim::SGD>(
          std::move(groups), static_cast<const torch::optim::SGDOptions&>(like.defaults()));
    case FusedKind::kAdam:
      return std::make_unique<torch::optim::Adam>(
          std::move(groups), static_cast<const torch::optim::AdamOptions&>(like.defaults()));
    case FusedKind::kAdamW:
      break;
  }
  return std::make_unique<torch::optim::AdamW>(
      std::move(groups), static_cast<const torch::optim::AdamWOptions&>(like.defaults()));
}

}  // namespace

void write_saved_state_as_fused(const torch::optim::Optimizer& like,
                                const std::vector<int64_t>& numels,
                                torch::serialize::InputArchive& saved,
                                torch::serialize::OutputArchive& fused) {
  auto stand_in = optimizer_like(like, numels);
  stand_in->load(saved);
  write_optimizer_state_as_fused(*stand_in, fused);
}

}  // namespace accelerant::detail
