// What a StreamLoader shares between its copies, and the one door through which
// Accelerator::prepare makes a sharded copy. Private: users build stream loaders with
// make_stream_loader and get sharded ones from prepare.
#pragma once
#include <torch/types.h>

#include <functional>
#include <memory>
#include <string>

#include "accelerant/stream_loader.h"
#include "accelerant/training_state.h"
#include "train/resume_hook.h"

namespace accelerant {

// Copies of a stream loader (the user's and the Accelerator's) share one of these.
struct StreamLoader::Shared {
  RecordSource source;
  StreamLoaderOptions options;
  int rank = 0;
  int world_size = 1;
  std::string rank_prefix;
  int64_t epoch = 0;
  /// position(): where the next epoch starts when its epoch is the next.
  StreamPosition position;
  bool padding = false;
  std::shared_ptr<TrainingState> state;
  std::function<Batch(Batch)> transform;
  std::shared_ptr<detail::ResumeHook> resume;
  /// The element-wise maximum of a small int64 tensor over every rank (the note "Uneven stream
  /// ends"); null on one process.
  std::function<torch::Tensor(const torch::Tensor&)> all_reduce_max;
  /// Rank `src`'s text on every rank: a failing rank's error, told to the others; null on one
  /// process.
  std::function<std::string(const std::string& text, int src)> broadcast_text;
};

namespace detail {

/// What a sharded copy of a stream loader does differently from its source.
struct StreamLoaderSharding {
  int rank = 0;
  int world_size = 1;
  /// "[rank r/N] " for the errors it throws.
  std::string rank_prefix;
  /// Where it reports the last batch of an epoch (gradient accumulation synchronises there).
  std::shared_ptr<TrainingState> state;
  /// Applied to every batch (device move, dtype); null: none.
  std::function<Batch(Batch)> transform;
  /// auto_resume's hook, fired by begin(); null: none.
  std::shared_ptr<ResumeHook> resume;
  /// The ranks' agreement at every step (a MAX all-reduce); null on one process.
  std::function<torch::Tensor(const torch::Tensor&)> all_reduce_max;
  /// Rank `src`'s text on every rank; null on one process.
  std::function<std::string(const std::string& text, int src)> broadcast_text;
};

struct StreamLoaderAccess {
  /// A copy of `loader` (same position) that yields rank `how.rank`'s share. Throws Error when
  /// the shards cannot be divided (sharding by shard with fewer shards than processes).
  static StreamLoader sharded(const StreamLoader& loader, StreamLoaderSharding how);
  /// Where an epoch starts for `shared`'s rank: its first shard, nothing passed.
  static StreamPosition epoch_start(const StreamLoader::Shared& shared, int64_t epoch);
};

/// The shards rank `rank` of `world_size` reads, in order (all of them when sharding by record).
std::vector<size_t> shards_of_rank(size_t shards, int rank, int world_size,
                                   accelerant::StreamSharding sharding);

/// Whether the `index`-th record a rank passes (counting every record of the shards it reads) is
/// its own.
bool owns_record(int64_t index, int rank, int world_size, accelerant::StreamSharding sharding);

}  // namespace detail
}  // namespace accelerant
