// What a DataLoader shares between its copies, and the one door through which
// Accelerator::prepare makes a sharded copy. Private: users build loaders with make_data_loader
// and get sharded ones from prepare.
#pragma once
#include <functional>
#include <memory>

#include "accelerant/data_loader.h"
#include "accelerant/training_state.h"
#include "train/resume_hook.h"

namespace accelerant {

// Copies of a loader (the user's and the Accelerator's) share one of these: a position reached
// through one copy is the position of all.
struct DataLoader::Shared {
  BatchMaker make_batch;
  int64_t dataset_size = 0;
  DataLoaderOptions options;
  ShardingOptions sharding;
  int rank = 0;
  int world_size = 1;
  int64_t epoch = 0;
  /// position(); its samples_done is where the next epoch starts when its epoch is the next.
  DataPosition position;
  std::shared_ptr<TrainingState> state;
  std::function<Batch(Batch)> transform;
  /// Fired by begin() only (resume_hook.h); null before prepare.
  std::shared_ptr<detail::ResumeHook> resume;
  /// Called as each batch is handed out (again, after a rewind); null: none. In-place recovery
  /// reseeds the random generators there (Accelerator).
  std::function<void()> on_batch;
  /// Where the epoch stood before the batch handed out last, while an epoch runs: what
  /// rewind_current_batch goes back to.
  DataPosition before_current{-1, 0};
  /// ... and where it stands after that batch.
  DataPosition after_current{-1, 0};
  /// Set by rewind_current_batch: the running epoch hands out its current batch once more.
  bool repeat_current = false;
};

namespace detail {

/// What a sharded copy of a loader does differently from its source.
struct LoaderSharding {
  int rank = 0;
  int world_size = 1;
  ShardingOptions sharding;
  /// Where the loader reports the end of an epoch and its padding (gather_for_metrics).
  std::shared_ptr<TrainingState> state;
  /// Applied to every batch (device move, dtype); null: none.
  std::function<Batch(Batch)> transform;
  /// auto_resume's hook, fired by begin(); null: none.
  std::shared_ptr<ResumeHook> resume;
  /// Called as each batch is handed out; null: none.
  std::function<void()> on_batch;
};

struct DataLoaderAccess {
  /// A copy of `loader` (same position) that yields rank `how.rank`'s share of each epoch.
  /// Throws Error when the sharding cannot work (split_batches that do not divide).
  static DataLoader sharded(const DataLoader& loader, LoaderSharding how);
  /// A step was abandoned (in-place recovery): the running epoch's next batch is the one it
  /// handed out last, again, and position() is where it stood before that batch. Nothing to do
  /// when no epoch runs.
  static void rewind_current_batch(DataLoader& loader);
  /// After another process's position was taken (sync_state_from): the running epoch's next
  /// batch is its current one again when the position is before it, the next one when the
  /// position is after it. Throws Error when it is neither (the processes are more than a batch
  /// apart). Nothing to do when no epoch runs.
  static void follow_sync(DataLoader& loader);
};

}  // namespace detail
}  // namespace accelerant
