#include "accelerant/data_loader.h"

#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>

#include "base/step_timing.h"
#include "base/text.h"
#include "train/data_loader_internal.h"

namespace accelerant {

// One epoch in progress: the batch list and, with worker threads, the batches built ahead.
// Workers claim batch numbers in order and may run at most `depth` batches ahead of the
// consumer, so memory stays bounded however slow the training step is.
struct DataLoader::EpochRun {
  std::shared_ptr<Shared> shared;
  EpochShard shard;
  int64_t epoch = 0;
  int64_t first_position = 0;
  int64_t samples_per_step = 0;
  size_t depth = 0;

  std::mutex mutex;
  std::condition_variable changed;
  size_t next_to_build = 0;
  size_t consumed = 0;
  bool stopping = false;
  std::vector<std::optional<Batch>> built;
  std::vector<std::exception_ptr> errors;
  std::vector<std::thread> workers;

  Batch build(size_t k) {
    Batch batch = shared->make_batch(shard.batches[k]);
    return shared->transform ? shared->transform(std::move(batch)) : batch;
  }

  void work() {
    for (;;) {
      size_t k;
      {
        std::unique_lock<std::mutex> lock(mutex);
        changed.wait(lock, [&] {
          return stopping || next_to_build >= built.size() || next_to_build < consumed + depth;
        });
        if (stopping || next_to_build >= built.size()) return;
        k = next_to_build++;
      }
      std::optional<Batch> batch;
      std::exception_ptr error;
      try {
        batch = build(k);
      } catch (...) {
        error = std::current_exception();
      }
      std::lock_guard<std::mutex> lock(mutex);
      built[k] = std::move(batch);
      errors[k] = error;
      changed.notify_all();
    }
  }

  Batch take(size_t k) {
    if (workers.empty()) return build(k);
    std::unique_lock<std::mutex> lock(mutex);
    changed.wait(lock, [&] { return built[k].has_value() || errors[k]; });
    if (errors[k]) std::rethrow_exception(errors[k]);
    Batch batch = std::move(*built[k]);
    built[k].reset();
    consumed = k + 1;
    changed.notify_all();
    return batch;
  }

  ~EpochRun() {
    {
      std::lock_guard<std::mutex> lock(mutex);
      stopping = true;
    }
    changed.notify_all();
    for (auto& worker : workers) worker.join();
    // Ended or left early: no epoch runs (set_position, rewind_current_batch).
    if (shared->before_current.epoch == epoch) shared->before_current = {-1, 0};
  }
};

DataLoader::DataLoader(BatchMaker make_batch, int64_t dataset_size, DataLoaderOptions options)
    : shared_(std::make_shared<Shared>()) {
  if (options.batch_size() < 1) {
    throw Error(detail::str("DataLoaderOptions::batch_size is ", options.batch_size(),
                            ". Fix: use a batch size of 1 or more."));
  }
  if (options.num_workers() < 0 || options.prefetch_factor() < 1) {
    throw Error(detail::str("DataLoaderOptions: num_workers ", options.num_workers(),
                            ", prefetch_factor ", options.prefetch_factor(),
                            ". Fix: num_workers must be 0 or more and prefetch_factor 1 or more."));
  }
  shared_->make_batch = std::move(make_batch);
  shared_->dataset_size = dataset_size;
  shared_->options = options;
  shared_->sharding = ShardingOptions()
                          .batch_size(options.batch_size())
                          .shuffle(options.shuffle())
                          .seed(options.seed().value_or(0))
                          .drop_last(options.drop_last())
                          .even_batches(false);  // one process: nothing to even out
}

DataLoader DataLoader::with_workers(int num_workers) const {
  if (num_workers < 0) {
    throw Error(detail::str(
        "with_workers: num_workers must be 0 or more, got ", num_workers,
        ". Fix: 0 builds batches in the loop's thread, N > 0 in N threads ahead of it."));
  }
  auto copy = std::make_shared<Shared>(*shared_);
  copy->options.num_workers(num_workers);
  return DataLoader(std::move(copy));
}

DataLoader detail::DataLoaderAccess::sharded(const DataLoader& loader, LoaderSharding how) {
  auto copy = std::make_shared<DataLoader::Shared>(*loader.shared_);
  per_process_batch_size(how.sharding,
                         how.world_size);  // validates split_batches before the first epoch
  copy->rank = how.rank;
  copy->world_size = how.world_size;
  copy->sharding = std::move(how.sharding);
  copy->state = std::move(how.state);
  copy->transform = std::move(how.transform);
  copy->resume = std::move(how.resume);
  copy->on_batch = std::move(how.on_batch);
  return DataLoader(std::move(copy));
}

void detail::DataLoaderAccess::follow_sync(DataLoader& loader) {
  DataLoader::Shared& shared = *loader.shared_;
  if (shared.before_current.epoch < 0) return;  // no epoch runs: begin() starts at the position
  const auto same = [](const DataPosition& a, const DataPosition& b) {
    return a.epoch == b.epoch && a.samples_done == b.samples_done;
  };
  if (same(shared.position, shared.before_current)) {
    shared.repeat_current = true;
  } else if (same(shared.position, shared.after_current)) {
    shared.repeat_current = false;
  } else {
    throw Error(detail::str(
        "in-place recovery: the process whose state was taken is at epoch ", shared.position.epoch,
        ", sample ", shared.position.samples_done,
        ", but this process is at the batch from sample ", shared.before_current.samples_done,
        " to ", shared.after_current.samples_done, " of epoch ", shared.before_current.epoch,
        ": more than a batch apart, so this process cannot follow it. Fix: launch with "
        "Recovery::kRestartGroup, which restarts every process from the last checkpoint."));
  }
}

void detail::DataLoaderAccess::rewind_current_batch(DataLoader& loader) {
  DataLoader::Shared& shared = *loader.shared_;
  if (shared.before_current.epoch < 0) return;  // no epoch runs
  shared.position = shared.before_current;      // shared.epoch stays: begin() counted the run
  shared.repeat_current = true;
}

// The getters read this process's copy and nothing else (resume_hook.h).
int64_t DataLoader::epoch() const { return shared_->epoch; }
DataPosition DataLoader::position() const { return shared_->position; }
int64_t DataLoader::dataset_size() const { return shared_->dataset_size; }
const DataLoaderOptions& DataLoader::options() const { return shared_->options; }
const ShardingOptions& DataLoader::sharding() const { return shared_->sharding; }
int DataLoader::rank() const { return shared_->rank; }
int DataLoader::world_size() const { return shared_->world_size; }
void DataLoader::set_seed(uint64_t seed) { shared_->sharding.seed(seed); }

void DataLoader::set_epoch(int64_t epoch) {
  shared_->epoch = epoch;
  shared_->position = {epoch, 0};
}

void DataLoader::set_position(DataPosition position) {
  if (position.epoch < 0 || position.samples_done < 0 ||
      position.samples_done > shared_->dataset_size) {
    throw Error(
        detail::str("DataLoader::set_position: epoch ", position.epoch, ", samples done ",
                    position.samples_done, " does not fit a dataset of ", shared_->dataset_size,
                    " samples. Likely cause: a position saved for another dataset. Fix: use the ",
                    "dataset the position was saved with."));
  }
  // While an epoch runs, begin() has counted it already: the next to begin is the one after.
  shared_->epoch = shared_->before_current.epoch == position.epoch && position.epoch >= 0
                       ? position.epoch + 1
                       : position.epoch;
  shared_->position = position;
}

int64_t DataLoader::samples_per_step() const {
  return per_process_batch_size(shared_->sharding, shared_->world_size) * shared_->world_size;
}

void DataLoader::skip_first_batches(int64_t batches) {
  if (batches < 0) {
    throw Error(detail::str("skip_first_batches(", batches, "): the count must be 0 or more."));
  }
  set_position({shared_->epoch, std::min(shared_->dataset_size, batches * samples_per_step())});
}

int64_t DataLoader::size() const {
  ShardingOptions counting = shared_->sharding;
  counting.shuffle(false);  // the count does not depend on the order
  return static_cast<int64_t>(
      shard_epoch(shared_->dataset_size, 0, shared_->rank, shared_->world_size, counting)
          .batches.size());
}

DataLoader::Iterator DataLoader::begin() {
  // AcceleratorOptions::auto_resume: the checkpoint is loaded before the first epoch starts.
  if (shared_->resume) shared_->resume->fire();
  auto run = std::make_shared<EpochRun>();
  run->shared = shared_;
  const int64_t epoch = shared_->epoch++;
  // The position is inside the epoch about to run only after set_position (a resume); after an
  // epoch, or one left early, the next starts at its beginning.
  run->first_position = shared_->position.epoch == epoch ? shared_->position.samples_done : 0;
  run->shard = shard_epoch(shared_->dataset_size, epoch, shared_->rank, shared_->world_size,
                           shared_->sharding, run->first_position);
  run->epoch = epoch;
  run->samples_per_step = samples_per_step();
  shared_->position = {epoch, run->first_position};
  if (run->shard.batches.empty()) {
    shared_->position = {epoch + 1, 0};
    return end();
  }
  const int workers = shared_->options.num_workers();
  run->depth = static_cast<size_t>(workers * shared_->options.prefetch_factor());
  run->built.resize(run->shard.batches.size());
  run->errors.resize(run->shard.batches.size());
  for (int w = 0; w < workers; ++w) run->workers.emplace_back([raw = run.get()] { raw->work(); });
  return Iterator(std::move(run));
}

DataLoader::Iterator DataLoader::end() { return Iterator(); }

DataLoader::Iterator::Iterator(std::shared_ptr<EpochRun> run) : run_(std::move(run)) { fetch(); }

void DataLoader::Iterator::fetch() {
  {
    detail::PhaseTimer waiting(detail::StepPhase::data, "data wait");
    current_ = run_->take(index_);
  }
  hand_out();
}

void DataLoader::Iterator::hand_out() {
  Shared& shared = *run_->shared;
  shared.before_current = {
      run_->epoch, run_->first_position + static_cast<int64_t>(index_) * run_->samples_per_step};
  if (shared.on_batch) shared.on_batch();
  // Counted when handed out: a checkpoint taken after this batch's step resumes at the next one.
  const bool last = index_ + 1 == run_->shard.batches.size();
  const int64_t done =
      run_->first_position + static_cast<int64_t>(index_ + 1) * run_->samples_per_step;
  run_->shared->position =
      last ? DataPosition{run_->epoch + 1, 0}
           : DataPosition{run_->epoch, std::min(done, run_->shared->dataset_size)};
  shared.after_current = shared.position;
  if (auto& state = run_->shared->state) {
    state->end_of_dataloader = last;
    state->padding_in_last_step = last ? run_->shard.padding : 0;
  }
}

DataLoader::Iterator& DataLoader::Iterator::operator++() {
  if (run_->shared->repeat_current) {  // rewind_current_batch: this batch once more
    run_->shared->repeat_current = false;
    hand_out();
    return *this;
  }
  if (++index_ >= run_->shard.batches.size()) {
    run_.reset();  // joins the workers
    current_ = Batch();
  } else {
    fetch();
  }
  return *this;
}

DataLoader make_data_loader(torch::Tensor data, torch::Tensor targets, DataLoaderOptions options) {
  if (!data.defined() || !targets.defined() || data.dim() == 0 || targets.dim() == 0 ||
      data.size(0) != targets.size(0)) {
    throw Error(
        detail::str("make_data_loader: data and targets must be tensors with the same first ",
                    "dimension (one row per sample); got data ",
                    data.defined() ? c10::str(data.sizes()) : "undefined", " and targets ",
                    targets.defined() ? c10::str(targets.sizes()) : "undefined",
                    ". Fix: pass the samples stacked along dim 0."));
  }
  const int64_t size = data.size(0);
  BatchMaker make_batch = [data, targets](const std::vector<int64_t>& indices) {
    auto index = torch::from_blob(const_cast<int64_t*>(indices.data()),
                                  {static_cast<int64_t>(indices.size())}, torch::kLong);
    return Batch{data.index_select(0, index), targets.index_select(0, index)};
  };
  return DataLoader(std::move(make_batch), size, std::move(options));
}

}  // namespace accelerant
