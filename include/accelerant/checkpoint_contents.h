// What a checkpoint's files mean, checked beyond their bytes (docs/checkpoints.md "Verifying what
// the files mean"). verify_checkpoint (checkpoint.h) checks that every file is the one the
// manifest lists, by size and CRC-32; files swapped between checkpoints, or edited, with the
// manifest's checksums rewritten to match, pass it. This reads each file as LibTorch does and
// checks that it holds what its name says, of this checkpoint's step. Needs LibTorch (the
// `accelerant` front end runs it in its helper).
#pragma once

#include <string>

#include "accelerant/checkpoint.h"

namespace accelerant {

/// verify_checkpoint(dir), then: state.json's step is the manifest's; each model file (model_0.pt,
/// ...) holds a module's tensors (not an optimizer's or a generator's state); each optimizer file
/// (optimizer_0.pt, or the ZeRO shards rank_0/optimizer_0.pt, ...) holds an optimizer's state, of
/// no later step than the checkpoint's; the ZeRO shards of each optimizer belong together (the
/// same update counts: a shard of another checkpoint is named) and cover every parameter that has
/// state; each rank's generator file (rank_0/rng.pt, ...) holds a random generator's state. Returns
/// the manifest. Throws CheckpointError naming the file and what it holds instead.
CheckpointManifest verify_checkpoint_contents(const std::string& dir);

}  // namespace accelerant
