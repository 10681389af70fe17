// Which samples each process sees in an epoch: the index arithmetic under the sharded data
// loader, kept as pure functions so that it can be tested alone.
//
// Every rank shuffles with the same generator (seed + epoch), so all ranks agree on one
// permutation; global step s gives rank r the samples at positions (s * W + r) * B ... + B of it.
// Each sample is seen once per epoch across ranks, except the padding described below.
#pragma once

#include <cstdint>
#include <vector>

#include "accelerant/options.h"

namespace accelerant {

/// How shard_epoch() cuts an epoch into batches for each process. A DataLoader builds one from its
/// DataLoaderOptions, and prepare() adds the Accelerator's even_batches and split_batches.
struct ShardingOptions {
  /// Samples per batch on each process (with split_batches: per step across all processes).
  /// Default: 1.
  ACCELERANT_OPTION(int64_t, batch_size) = 1;
  /// Shuffle every epoch with seed + epoch (the same permutation on every rank). Default: false.
  ACCELERANT_OPTION(bool, shuffle) = false;
  /// Seed of the shuffling. Default: 0.
  ACCELERANT_OPTION(uint64_t, seed) = 0;
  /// Keep only steps in which every process has a full batch. Default: false.
  ACCELERANT_OPTION(bool, drop_last) = false;
  /// Give every process the same number of full batches by repeating samples from the head of the
  /// epoch's order; gather_for_metrics drops exactly those repeats. Without it, the last batches
  /// are short or missing on some ranks, and collectives in the step must cope. Default: true.
  ACCELERANT_OPTION(bool, even_batches) = true;
  /// batch_size is the global batch, split evenly across processes (it must divide). Default:
  /// false.
  ACCELERANT_OPTION(bool, split_batches) = false;
};

/// One process's share of one epoch.
struct EpochShard {
  /// Dataset indices, batch by batch.
  std::vector<std::vector<int64_t>> batches;
  /// Padding samples (repeats from the head) in the whole epoch across all ranks; they sit at
  /// the end of the last global step. 0 unless even_batches had to pad.
  int64_t padding = 0;
  /// Samples of the epoch that are not padding, across all ranks.
  int64_t real_samples = 0;
};

/// The batches rank `rank` of `world_size` processes sees in `epoch` over `dataset_size` samples.
/// With `first_position` > 0 the epoch continues after that many positions of its order (a
/// resumed epoch): the rest is sharded as above, whatever world size consumed the first part, so
/// that no sample is skipped or repeated. Throws accelerant::Error for a bad batch size, world
/// size, rank, first position, or a split_batches batch that the world size does not divide.
EpochShard shard_epoch(int64_t dataset_size, int64_t epoch, int rank, int world_size,
                       const ShardingOptions& options, int64_t first_position = 0);

/// The per-process batch size `options` implies for `world_size` processes.
int64_t per_process_batch_size(const ShardingOptions& options, int world_size);

}  // namespace accelerant
