// One checkpoint directory consolidated into files that need neither Accelerant's checkpoint
// layout nor the number of processes that saved it (what `accelerant checkpoint merge` runs):
//
//   OUT/
//     model.safetensors      the weights of the one model (model_<i>.safetensors for several),
//                            readable by read_safetensors / load_model_safetensors and by
//                            Python's safetensors.torch.load_file
//     optimizer_0.pt …       with MergeCheckpointOptions::optimizer: each optimizer's whole state,
//                            the shards of a ZeRO run (rank_<r>/optimizer_<i>.pt) merged into
//                            the file a run without ZeRO writes, so that such a run loads it
//
// Not an include of accelerant.h: only the programs that merge need it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "accelerant/options.h"

namespace accelerant {

/// What merge_checkpoint writes besides the weights, and whether it may replace `out_dir`.
struct MergeCheckpointOptions {
  /// Also write each optimizer's whole state as optimizer_`<i>`.pt: the archive that
  /// Accelerator::load_state reads for an optimizer saved without ZeRO (its fused state and the
  /// parameter groups' options, which rank 0's shard carries). An optimizer that was saved whole
  /// is copied as it is.
  /// Default: false (weights only).
  ACCELERANT_OPTION(bool, optimizer) = false;
  /// Replace `out_dir` when it exists and is not empty (it is swapped for the new directory in
  /// one rename, then removed).
  /// Default: false (an existing non-empty `out_dir` is refused, and nothing is written).
  ACCELERANT_OPTION(bool, overwrite) = false;
};

/// One file merge_checkpoint wrote.
struct MergedFile {
  std::string path;     ///< where it is, under `out_dir`
  int64_t tensors = 0;  ///< tensors in it (weights, or state tensors of an optimizer)
  int64_t bytes = 0;    ///< the file's size
};

/// What merge_checkpoint wrote, and from what.
struct MergedCheckpoint {
  std::string out_dir;                 ///< the directory written
  int world_size = 1;                  ///< processes that saved the checkpoint
  int64_t step = 0;                    ///< optimizer steps taken when it was saved
  int sharded_optimizers = 0;          ///< optimizers whose state was saved in shards (ZeRO)
  std::vector<MergedFile> models;      ///< one per model, in the checkpoint's order
  std::vector<MergedFile> optimizers;  ///< one per optimizer with options.optimizer(), else none
};

/// Consolidates the checkpoint directory `dir` (written by Accelerator::save_state, with or
/// without ZeRO) into `out_dir`: model_`<i>`.pt becomes model.safetensors (one model) or
/// model_`<i>`.safetensors (several), tensors named as the model's named_parameters and
/// named_buffers; with options.optimizer(), optimizer_`<i>`.pt as described above.
///
/// The checkpoint is verified first (verify_checkpoint); the files are written into a temporary
/// directory beside `out_dir`, fsynced, and renamed to `out_dir` last, so a failure or a crash
/// leaves no partial `out_dir`. Throws CheckpointError naming the file at fault: no checkpoint at
/// `dir`, a damaged or missing file (a rank's shard: which rank), shards that do not fit together,
/// `out_dir` existing and not empty without options.overwrite(), or `out_dir` not writable.
MergedCheckpoint merge_checkpoint(const std::string& dir, const std::string& out_dir,
                                  MergeCheckpointOptions options = {});

}  // namespace accelerant
