// ZeRO stage 3's optimizer state between its layouts. Under stage 3 each process's optimizer
// updates its shares of the sharded blocks' parameters (and the replicated ones whole), so a
// checkpoint holds one fused state per process (note "Fused state form" in fused_state_format.h)
// over those shares. With these functions such a state becomes the whole fused state (what a run
// of any stage takes: FusedUpdater::load, load_fused_state_into_optimizer), and a whole state
// becomes one process's state of its shares under another number of processes: a stage-3
// checkpoint loads on N processes or under stages 0-2, and any checkpoint loads under stage 3.
// Private to src/train and the layers above.
#pragma once

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace accelerant::detail {

/// Key, beside a stage-3 process's optimizer state, of its slots (int64 [slots, 2]: each slot's
/// whole element count and share length).
inline constexpr const char* kShareSlotsKey = "accelerant_zero3_share_slots";

/// One parameter an optimizer updates, in the order of its groups: the whole parameter's element
/// count, and, when the optimizer updates a process's share of a sharded block's parameter
/// instead, the length of each process's share (0: the parameter itself, whole everywhere).
struct ShareSlot {
  int64_t numel = 0;
  int64_t share = 0;
  bool operator==(const ShareSlot& o) const { return numel == o.numel && share == o.share; }
};

/// The slots of `optimizer`, whose parameters are the shares of `models`' sharded blocks
/// (optimize_shares) or other parameters of theirs.
std::vector<ShareSlot> share_slots(const torch::optim::Optimizer& optimizer,
                                   const std::vector<std::shared_ptr<torch::nn::Module>>& models);

/// The slots as a tensor (kShareSlotsKey) and back; from_tensor throws Error for another shape.
torch::Tensor share_slots_tensor(const std::vector<ShareSlot>& slots);
std::vector<ShareSlot> share_slots_from_tensor(const torch::Tensor& tensor);

/// The whole fused state, from every process's fused state of its shares (`processes`, in rank
/// order, each laid out as `slots` say). Throws Error when one does not fit the slots or the
/// processes disagree on the kind or the step counts (files of different saves).
void merge_share_states(const std::vector<torch::serialize::InputArchive*>& processes,
                        const std::vector<ShareSlot>& slots,
                        torch::serialize::OutputArchive& whole);

/// Process `rank`'s fused state of its shares (`slots`, cut for the run's number of processes),
/// from the whole fused state. Throws Error when the whole state is one process's ZeRO stage 1-2
/// shard or its parameters' sizes are not the slots'.
void cut_share_state(torch::serialize::InputArchive& whole, const std::vector<ShareSlot>& slots,
                     int rank, torch::serialize::OutputArchive& shares);

/// Writes, in the whole fused form, the per-parameter state (torch::optim's own save()) that an
/// optimizer of `like`'s type and parameter groups saved over parameters of `numels` elements
/// (in group order). Throws Error for another optimizer type than SGD, Adam, AdamW, amsgrad, or
/// groups of other sizes.
void write_saved_state_as_fused(const torch::optim::Optimizer& like,
                                const std::vector<int64_t>& numels,
                                torch::serialize::InputArchive& saved,
                                torch::serialize::OutputArchive& fused);

}  // namespace accelerant::detail
