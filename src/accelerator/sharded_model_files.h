// save_model and load_model, one ZeRO-3 sharded block at a time: every process gathers each
// sharded block in turn (a collective), and the block's tensors are written or read while it is
// whole, so that no process ever holds the whole model. Models without sharded blocks take the
// same path, each tensor written or read in place.
#pragma once
#include <torch/nn/module.h>

#include <cstdint>
#include <string>

#include "checkpoint/every_process.h"

namespace accelerant::detail {

/// The main process writes `model`'s weights into `dir` as save_model_safetensors does, streamed
/// tensor by tensor while each tensor's block is gathered. A failure there is reported on every
/// process (CheckpointError) once the gathers are over, so that no process waits on another.
void save_model_by_blocks(const torch::nn::Module& model, const std::string& dir,
                          int64_t max_shard_bytes, const CheckpointRanks& ranks);

/// Every process maps the weights saved in `dir` and checks them against `model` (names and
/// shapes; a failure anywhere fails everywhere, changing nothing), then copies them in block by
/// block: each sharded block gathered, written, its shares kept (store_gathered), released.
void load_model_by_blocks(torch::nn::Module& model, const std::string& dir,
                          const CheckpointRanks& ranks);

}  // namespace accelerant::detail
