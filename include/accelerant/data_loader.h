// A data loader whose batches are sharded across processes once Accelerator::prepare has seen it.
//
//   auto loader = accelerant::make_data_loader(images, labels,      // or any torch dataset
//                     accelerant::DataLoaderOptions().batch_size(64).shuffle(true).num_workers(2));
//   auto [m, o, l] = accelerator.prepare(model, optimizer, loader);
//   for (auto& batch : l) { ... batch.data ... batch.target ... }
//
// Before prepare it iterates the whole dataset, like a single-process loader. After prepare each
// process gets its share of every epoch (see data_sharding.h for the rules): each sample once per
// epoch across ranks, the same seeded permutation everywhere (seed + epoch), even_batches padding
// that gather_for_metrics removes again. Each `for` over the loader is one epoch; the epoch
// counter advances by itself (set_epoch to choose).
//
// A batch is `data` and `target` plus any named tensors (batch.h); a dataset's get() may return
// either kind of sample, and a collate function (collate.h) turns a batch's samples into a batch:
// stacking by default, padding variable-length sequences with collate::pad_to_longest & co.
//
// Worker threads (num_workers > 0) build batches ahead of the training loop, up to
// num_workers * prefetch_factor batches; batches still come out in order. A dataset's get() is
// then called from several threads at once and must be safe for that (reading is).
#pragma once
#include <torch/data/example.h>
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "accelerant/batch.h"
#include "accelerant/collate.h"
#include "accelerant/data_sharding.h"
#include "accelerant/error.h"
#include "accelerant/options.h"

namespace accelerant {
namespace detail {
struct DataLoaderAccess;
}

/// Where a loader is in its data: the epoch in progress and how many positions of that epoch's
/// order (across all processes) its batches have covered so far. It does not depend on the world
/// size, so a run resumed on another number of processes continues at the same sample.
struct DataPosition {
  /// The epoch in progress; once an epoch's last batch is handed out, the next (samples_done 0).
  int64_t epoch = 0;
  /// Positions of that epoch's order (shuffled or not) covered by the batches handed out, across
  /// all processes: 0 to the dataset size.
  int64_t samples_done = 0;
};

/// How a DataLoader batches, shuffles and builds its batches (make_data_loader); how a prepared
/// loader splits them across processes comes from AcceleratorOptions (data_sharding.h).
struct DataLoaderOptions {
  /// Samples per batch on each process (with AcceleratorOptions::split_batches: across all).
  /// Default: 1.
  ACCELERANT_OPTION(int64_t, batch_size) = 1;
  /// Reshuffle every epoch (seed + epoch). Default: false.
  ACCELERANT_OPTION(bool, shuffle) = false;
  /// Drop the last incomplete global step. Default: false.
  ACCELERANT_OPTION(bool, drop_last) = false;
  /// Threads that build batches ahead of the loop; 0 builds them in the loop's thread.
  /// Default: 0.
  ACCELERANT_OPTION(int, num_workers) = 0;
  /// Batches each worker thread may build ahead. Default: 2.
  ACCELERANT_OPTION(int, prefetch_factor) = 2;
  /// When a prepared loader moves batches to a CUDA device: copy them into page-locked memory
  /// first (in the worker threads when num_workers > 0), so that the copy to the GPU is
  /// asynchronous. No effect on the CPU. Default: unset = on with CUDA.
  ACCELERANT_OPTION(std::optional<bool>, pin_memory) = std::nullopt;
  /// Shuffle seed; unset = the Accelerator's seed (AcceleratorOptions::seed), else 0.
  ACCELERANT_OPTION(std::optional<uint64_t>, seed) = std::nullopt;
};

/// Builds the batch of the given dataset indices (collation included).
using BatchMaker = std::function<Batch(const std::vector<int64_t>& indices)>;

/// Batches of a dataset, one epoch per `for` (see the file comment). Made by make_data_loader;
/// Accelerator::prepare returns a sharded copy. Copies share their state: a position reached
/// through one is the position of all (prepare's sharded copy and with_workers start their own).
class DataLoader {
 public:
  /// A loader over `dataset_size` samples whose batches `make_batch` builds.
  DataLoader(BatchMaker make_batch, int64_t dataset_size, DataLoaderOptions options);

  class Iterator;
  /// Starts an epoch (the current epoch number, then advances it). On a prepared loader under
  /// AcceleratorOptions::auto_resume, the first begin() of any of the Accelerator's loaders
  /// loads the newest checkpoint first (a collective): the only call here that may.
  Iterator begin();
  /// The end of any epoch: what begin()'s iterator equals after the last batch.
  Iterator end();

  /// Batches this process gets in the current epoch.
  int64_t size() const;
  /// Samples in the dataset, all processes together.
  int64_t dataset_size() const;
  /// The epoch the next `for` runs. Getters read this process's copy only: they never resume,
  /// load or talk to other ranks (before the first begin() under auto_resume they tell the
  /// position before the resume).
  int64_t epoch() const;
  /// The next `for` runs `epoch` from its start (position (epoch, 0)); with shuffle its order is
  /// that of seed + epoch.
  void set_epoch(int64_t epoch);
  /// The batches handed out so far count as done: after the k-th batch of an epoch the position
  /// is (epoch, k × the global batch); after the last it is (epoch + 1, 0).
  DataPosition position() const;
  /// The next `for` over the loader runs `position.epoch`, starting after `samples_done` samples
  /// of its order (save_state / load_state use this).
  void set_position(DataPosition position);
  /// The next `for` over the loader skips its first `batches` global steps (Accelerate's
  /// skip_first_batches), e.g. to continue an epoch that was interrupted.
  void skip_first_batches(int64_t batches);
  /// The shuffle seed of the epochs to come (save_state keeps it with the position).
  void set_seed(uint64_t seed);
  /// Samples every global step takes from the epoch's order (per-process batch × processes).
  int64_t samples_per_step() const;
  /// The options it was made with (num_workers as with_workers set it).
  const DataLoaderOptions& options() const;
  /// This loader's sharding: rank, world size and the options prepare chose.
  const ShardingOptions& sharding() const;
  /// The process whose share of each epoch it yields; 0 before prepare.
  int rank() const;
  /// The processes each epoch is sharded across; 1 before prepare.
  int world_size() const;

  /// A copy of this loader (same position) whose batches are built by `num_workers` threads.
  DataLoader with_workers(int num_workers) const;

 private:
  friend struct detail::DataLoaderAccess;  // Accelerator::prepare's sharded copy
  struct Shared;                           // src/train/data_loader_internal.h
  struct EpochRun;
  explicit DataLoader(std::shared_ptr<Shared> shared) : shared_(std::move(shared)) {}
  std::shared_ptr<Shared> shared_;
};

/// A single-pass iterator over one epoch's batches (what `for (auto& batch : loader)` uses); a
/// default-constructed one is the end. It holds the epoch's worker threads, joined when it
/// reaches the end or goes.
class DataLoader::Iterator {
 public:
  /// Single pass: a batch is built for this epoch and handed out once.
  using iterator_category = std::input_iterator_tag;
  /// What it yields: a Batch (data, target and any named tensors).
  using value_type = Batch;
  /// As the standard iterator requirements ask; batches are not counted by distance.
  using difference_type = std::ptrdiff_t;
  /// The current Batch, through operator->.
  using pointer = Batch*;
  /// The current Batch, through operator*.
  using reference = Batch&;

  /// The end iterator (the same as DataLoader::end()).
  Iterator() = default;
  /// The current batch (on the device for a prepared loader); ++ replaces it.
  Batch& operator*() { return current_; }
  /// The current batch's members, as in it->data.
  Batch* operator->() { return &current_; }
  /// Hands out the next batch (waiting for a worker thread that is still building it) and moves
  /// the loader's position past it; after the last one it becomes the end. Rethrows what building
  /// the batch threw.
  Iterator& operator++();
  /// Whether both are at the end of their epoch or both are not: meant for comparing with end().
  bool operator==(const Iterator& other) const { return done() == other.done(); }
  /// The negation of operator==.
  bool operator!=(const Iterator& other) const { return !(*this == other); }

 private:
  friend class DataLoader;
  explicit Iterator(std::shared_ptr<EpochRun> run);
  bool done() const { return run_ == nullptr; }
  void fetch();
  // Makes the batch at index_ the current one for the position, the flags and on_batch.
  void hand_out();
  std::shared_ptr<EpochRun> run_;
  size_t index_ = 0;
  Batch current_;
};

/// A loader over two tensors whose first dimension indexes samples (images and labels); batches
/// are gathered with index_select, the fastest collation.
DataLoader make_data_loader(torch::Tensor data, torch::Tensor targets,
                            DataLoaderOptions options = {});

/// A loader over a dataset: anything with `get(index)` returning a Batch (named tensors of one
/// sample) or a torch::data::Example<> (a torch::data dataset), and `size()` returning the number
/// of samples as a std::optional (a dataset that returns nullopt is refused: it cannot be
/// sharded). `collate` builds each batch from its samples (collate.h); Default: collate::stack(),
/// which stacks every tensor and names the padding collates when sizes differ.
template <class Dataset>
DataLoader make_data_loader(Dataset dataset, DataLoaderOptions options = {},
                            Collate collate = collate::stack()) {
  auto shared = std::make_shared<Dataset>(std::move(dataset));
  const auto size = shared->size();
  if (!size.has_value()) {
    throw Error(
        "make_data_loader: the dataset does not know its size (size() returned nullopt). "
        "Fix: give the dataset a size() so that it can be sharded across processes.");
  }
  if (!collate) {
    throw Error(
        "make_data_loader: the collate function is empty. Fix: pass one, or leave the argument "
        "out for accelerant::collate::stack().");
  }
  BatchMaker make_batch = [shared,
                           collate = std::move(collate)](const std::vector<int64_t>& indices) {
    std::vector<Batch> samples;
    samples.reserve(indices.size());
    for (int64_t i : indices) samples.emplace_back(shared->get(static_cast<size_t>(i)));
    return collate(std::move(samples));
  };
  return DataLoader(std::move(make_batch), static_cast<int64_t>(*size), std::move(options));
}

}  // namespace accelerant
