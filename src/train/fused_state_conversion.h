// Optimizer state between its two forms: torch::optim's per-parameter state (an optimizer that
// steps by itself) and the fused update's whole state (note "Fused state form" in
// fused_state_format.h; what merge_optimizer_shards makes of ZeRO shards). With them a checkpoint
// saved under ZeRO loads into plain data parallelism without fused optimizers, or on one process,
// and one saved without fused optimizers loads under ZeRO (docs/zero.md "Checkpoints").
#pragma once

#include <torch/optim.h>
#include <torch/serialize.h>

namespace accelerant::detail {

/// Replaces `optimizer`'s per-parameter state by the whole fused state in `fused` (parameters
/// that never stepped get none, as torch::optim leaves them). Throws Error, changing nothing, when
/// the state is one process's shard, another optimizer kind's, or for other parameter sizes.
void load_fused_state_into_optimizer(torch::optim::Optimizer& optimizer,
                                     torch::serialize::InputArchive& fused);

/// Writes `optimizer`'s per-parameter state (torch::optim's) in the whole fused form, which
/// FusedUpdater::load takes, sharded or not. Throws Error for an optimizer the fused update does
/// not implement (another type, amsgrad).
void write_optimizer_state_as_fused(torch::optim::Optimizer& optimizer,
                                    torch::serialize::OutputArchive& fused);

}  // namespace accelerant::detail
