// The fused update's saved state, as FusedUpdater::save writes it and merge_optimizer_shards and
// the conversions of fused_state_conversion.h read it. Private to src/train and the layers above.
//
// Note "Fused state form": an archive of kFusedKindKey (0-dim int64, FusedKind), kFusedNumelsKey
// (int64 [parameters]: each parameter's element count, in the optimizer's group order),
// kFusedStepsKey (double [parameters]: updates each has had), kFusedState1Key and kFusedState2Key
// (float, the parameters' elements end to end: Adam's exp_avg and exp_avg_sq, SGD's momentum
// buffers and no second), and for one process's ZeRO shard kFusedPiecesKey (int64 [pieces, 3]:
// parameter, first element, length), whose states then hold those elements only.
#pragma once

#include <torch/optim.h>

#include "train/fused_kernels.h"

namespace accelerant::detail {

inline constexpr const char* kFusedKindKey = "accelerant_fused_kind";
inline constexpr const char* kFusedNumelsKey = "accelerant_fused_numels";
inline constexpr const char* kFusedStepsKey = "accelerant_fused_steps";
inline constexpr const char* kFusedState1Key = "accelerant_fused_state1";
inline constexpr const char* kFusedState2Key = "accelerant_fused_state2";
inline constexpr const char* kFusedPiecesKey = "accelerant_fused_shard_pieces";

/// SGD, Adam or AdamW; throws Error naming the type for any other optimizer.
FusedKind fused_kind_of(torch::optim::Optimizer& optimizer);

/// "SGD", "Adam", "AdamW".
const char* fused_kind_name(FusedKind kind);

}  // namespace accelerant::detail
