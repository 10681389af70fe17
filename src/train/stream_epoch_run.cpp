// One epoch of a StreamLoader: reading this rank's records in order, building batches ahead in
// worker threads, and the ranks' agreement at every step (the note "Uneven stream ends" in
// accelerant/stream_loader.h).
#include <condition_variable>
#include <exception>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include "accelerant/stream_loader.h"
#include "base/step_timing.h"
#include "base/text.h"
#include "base/uncaught_exception_recorder.h"
#include "train/stream_loader_internal.h"

namespace accelerant {
namespace {

// A rank's records in order, from a position: its shards one after another, and of their
// records only its own.
class ShardWalk {
 public:
  ShardWalk(const RecordSource& source, int rank, int world_size, StreamSharding sharding,
            const StreamPosition& from)
      : source_(source),
        rank_(rank),
        world_size_(world_size),
        sharding_(sharding),
        mine_(detail::shards_of_rank(source.shards.size(), rank, world_size, sharding)),
        position_(from) {
    slot_ = mine_.size();
    for (size_t i = 0; i < mine_.size(); ++i) {
      if (static_cast<int64_t>(mine_[i]) == from.shard) slot_ = i;
    }
  }

  // The next record of this rank into `record` (and its shard into `shard`); false at the end.
  bool next(RawRecord& record, size_t& shard) {
    while (slot_ < mine_.size()) {
      if (!reader_) reader_ = source_.open(mine_[slot_], position_.cursor);
      if (!reader_->next(record)) {
        reader_.reset();
        ++slot_;
        position_.shard =
            static_cast<int64_t>(slot_ < mine_.size() ? mine_[slot_] : source_.shards.size());
        position_.cursor = ShardCursor();
        continue;
      }
      position_.cursor = reader_->cursor();
      if (!detail::owns_record(position_.records_passed++, rank_, world_size_, sharding_)) continue;
      shard = mine_[slot_];
      return true;
    }
    return false;
  }

  // Where the next record starts (steps_done is the caller's).
  const StreamPosition& position() const { return position_; }

 private:
  const RecordSource& source_;
  int rank_, world_size_;
  StreamSharding sharding_;
  std::vector<size_t> mine_;
  StreamPosition position_;
  size_t slot_;
  std::unique_ptr<RecordReader> reader_;
};

// One batch as a worker left it: the batch, or none when the share ran out before it.
struct Built {
  std::optional<Batch> batch;
  /// The share had run out: `batch` is its first batch again (agree() made it).
  bool padding = false;
  /// Where the stream stands after it (its steps_done unset).
  StreamPosition after;
  std::exception_ptr error;
};

// The records of one batch, read in order, not yet parsed.
struct RawBatch {
  std::vector<std::pair<RawRecord, size_t>> records;  // with their shard
  StreamPosition after;
};

// What every rank said about a step: the element-wise maximum over ranks.
struct Agreement {
  int64_t has_batch = 0;      // some rank still has a record
  int64_t failed_rank = 0;    // 1 + a rank whose reading or parsing threw; 0: none
  int64_t unpadded_rank = 0;  // 1 + a rank that ran out with no record to pad with; 0: none
};

}  // namespace

struct StreamLoader::EpochRun {
  std::shared_ptr<Shared> shared;
  int64_t epoch = 0;
  int64_t first_step = 0;
  size_t depth = 0;

  // Reading: one thread at a time, batch after batch in order (read_mutex).
  std::mutex read_mutex;
  std::optional<ShardWalk> walk;

  // Building ahead (mutex): batches claimed, built, consumed; once a read comes back empty or
  // fails, nothing more is claimed.
  std::mutex mutex;
  std::condition_variable changed;
  size_t next_to_build = 0;
  size_t consumed = 0;
  bool reading_over = false;
  bool stopping = false;
  StreamPosition end_position;
  std::map<size_t, Built> built;
  std::vector<std::thread> workers;

  // The consumer's side (the loop's thread only).
  size_t index = 0;  // the batch `pending` is
  Built pending;
  Agreement agreed;
  // The records of this epoch's padding, parsed afresh for every padding step: a batch the loop
  // changed in place is never handed out again, so a resumed run pads with the same values.
  std::optional<RawBatch> padding_records;

  RawBatch read_batch(ShardWalk& from) {
    RawBatch raw;
    RawRecord record;
    size_t shard = 0;
    const auto size = static_cast<size_t>(shared->options.batch_size());
    while (raw.records.size() < size && from.next(record, shard)) {
      raw.records.emplace_back(std::move(record), shard);
    }
    raw.after = from.position();
    return raw;
  }

  Batch make(RawBatch&& raw) {
    const Shared& s = *shared;
    std::vector<Batch> samples;
    samples.reserve(raw.records.size());
    for (auto& [record, shard] : raw.records) {
      try {
        samples.push_back(s.source.parse(record));
      } catch (const std::exception& e) {
        throw Error(
            detail::str(s.rank_prefix, s.source.shards[shard], ":", record.line, ": ", e.what()));
      }
    }
    Batch batch = s.options.collate() ? s.options.collate()(std::move(samples))
                                      : stack_samples(std::move(samples));
    return s.transform ? s.transform(std::move(batch)) : batch;
  }

  static Batch stack_samples(std::vector<Batch>&& samples) {
    std::vector<torch::Tensor> data, targets;
    for (auto& sample : samples) {
      data.push_back(std::move(sample.data));
      if (sample.target.defined()) targets.push_back(std::move(sample.target));
    }
    try {
      return Batch{torch::stack(data), targets.empty() ? torch::Tensor() : torch::stack(targets)};
    } catch (const c10::Error& e) {
      throw Error(detail::str(
          "the stream's default collate could not stack the samples of a batch (",
          e.what_without_backtrace(), "). Likely cause: records of different lengths. Fix: pad ",
          "them in the parse function, or set StreamLoaderOptions::collate to a padding collate."));
    }
  }

  // Reads and builds the next batch in this thread (no worker threads).
  Built build_here() {
    Built out;
    try {
      RawBatch raw = read_batch(*walk);
      out.after = raw.after;
      if (!raw.records.empty()) out.batch = make(std::move(raw));
    } catch (...) {
      out.error = std::current_exception();
    }
    return out;
  }

  void work() {
    for (;;) {
      size_t k;
      RawBatch raw;
      Built out;
      {
        std::lock_guard<std::mutex> reading(read_mutex);  // claims and reads in batch order
        {
          std::unique_lock<std::mutex> lock(mutex);
          changed.wait(
              lock, [&] { return stopping || reading_over || next_to_build < consumed + depth; });
          if (stopping || reading_over) return;
          k = next_to_build++;
        }
        try {
          raw = read_batch(*walk);
        } catch (...) {
          out.error = std::current_exception();
        }
        if (out.error || raw.records.empty()) {
          std::lock_guard<std::mutex> lock(mutex);
          reading_over = true;
          end_position = raw.after;
          changed.notify_all();
        }
      }
      out.after = raw.after;
      if (!out.error && !raw.records.empty()) {
        try {
          out.batch = make(std::move(raw));
        } catch (...) {
          out.error = std::current_exception();
        }
      }
      std::lock_guard<std::mutex> lock(mutex);
      built[k] = std::move(out);
      changed.notify_all();
    }
  }

  Built take(size_t k) {
    if (workers.empty()) return build_here();
    std::unique_lock<std::mutex> lock(mutex);
    changed.wait(lock, [&] { return built.count(k) || (reading_over && k >= next_to_build); });
    auto it = built.find(k);
    if (it == built.end()) {  // past the end of this rank's share
      Built out;
      out.after = end_position;
      return out;
    }
    Built out = std::move(it->second);
    built.erase(it);
    consumed = k + 1;
    changed.notify_all();
    return out;
  }

  // Reads the padding of this epoch: the first batch of this rank's share again; none when the
  // share is empty.
  void read_padding() {
    if (padding_records) return;
    ShardWalk from_start(shared->source, shared->rank, shared->world_size,
                         shared->options.sharding(),
                         detail::StreamLoaderAccess::epoch_start(*shared, epoch));
    RawBatch raw = read_batch(from_start);
    if (!raw.records.empty()) padding_records = std::move(raw);
  }

  Batch padding_batch() { return make(RawBatch(*padding_records)); }

  // What every rank says about `b`, batch `k` of this run (one all-reduce); throws on every rank
  // when any rank failed.
  Agreement agree(Built& b, size_t k) {
    const Shared& s = *shared;
    if (!b.batch && !b.error && s.world_size > 1) {  // alone, running out ends the epoch
      try {
        read_padding();
        if (padding_records) b.batch = padding_batch();
        b.padding = true;
      } catch (...) {
        b.error = std::current_exception();
      }
    }
    Agreement mine;
    mine.has_batch = b.batch && !b.padding ? 1 : 0;
    mine.failed_rank = b.error ? s.rank + 1 : 0;
    mine.unpadded_rank = !b.batch && !b.error ? s.rank + 1 : 0;
    Agreement all = mine;
    if (s.all_reduce_max) {
      auto values = s.all_reduce_max(
          torch::tensor({mine.has_batch, mine.failed_rank, mine.unpadded_rank}, torch::kLong));
      values = values.cpu();
      all = {values[0].item<int64_t>(), values[1].item<int64_t>(), values[2].item<int64_t>()};
    }
    if (all.failed_rank > 0) {
      // Every rank fails with the failing rank's reason, which launchers report from rank 0.
      std::string reason = "its own error says why";
      if (s.broadcast_text)
        reason =
            s.broadcast_text(b.error ? detail::exception_text(b.error) : "", all.failed_rank - 1);
      if (b.error) std::rethrow_exception(b.error);
      throw Error(detail::str(s.rank_prefix, "the stream's epoch ", epoch,
                              " stops on every rank at step ", first_step + static_cast<int64_t>(k),
                              " (counted from 0): rank ", all.failed_rank - 1,
                              " could not read or parse its records: ", reason));
    }
    if (all.has_batch > 0 && all.unpadded_rank > 0) {
      throw Error(detail::str(
          s.rank_prefix, "rank ", all.unpadded_rank - 1, " has no record at all in epoch ", epoch,
          " of the stream (", s.source.shards.size(), " shard(s) over ", s.world_size,
          " processes), so it has nothing to pad with while other ranks still train. Fix: give ",
          "every process records: more (or fuller) shards, or shard by record."));
    }
    return all;
  }

  ~EpochRun() {
    {
      std::lock_guard<std::mutex> lock(mutex);
      stopping = true;
    }
    changed.notify_all();
    for (auto& worker : workers) worker.join();
  }
};

StreamLoader::Iterator StreamLoader::begin() {
  if (shared_->resume) shared_->resume->fire();  // auto_resume (train/resume_hook.h)
  auto run = std::make_shared<EpochRun>();
  run->shared = shared_;
  const int64_t epoch = shared_->epoch++;
  // Inside the epoch about to run only after set_position (a resume); else from its start.
  const StreamPosition from = shared_->position.epoch == epoch
                                  ? shared_->position
                                  : detail::StreamLoaderAccess::epoch_start(*shared_, epoch);
  run->epoch = epoch;
  run->first_step = from.steps_done;
  run->walk.emplace(shared_->source, shared_->rank, shared_->world_size,
                    shared_->options.sharding(), from);
  shared_->position = from;
  shared_->padding = false;
  const int workers = shared_->options.num_workers();
  run->depth = static_cast<size_t>(workers * shared_->options.prefetch_factor());
  for (int w = 0; w < workers; ++w) run->workers.emplace_back([raw = run.get()] { raw->work(); });
  run->pending = run->take(0);
  run->agreed = run->agree(run->pending, 0);
  return Iterator(std::move(run));
}

StreamLoader::Iterator::Iterator(std::shared_ptr<EpochRun> run) : run_(std::move(run)) {
  advance();
}

void StreamLoader::Iterator::advance() {
  // The wait for the next batch, and the ranks' agreement on whether each has one.
  detail::PhaseTimer waiting(detail::StepPhase::data, "data wait");
  EpochRun& r = *run_;
  Shared& s = *r.shared;
  if (r.agreed.has_batch == 0) {  // no rank has a record left: the epoch ends everywhere
    s.position = detail::StreamLoaderAccess::epoch_start(s, r.epoch + 1);
    s.padding = false;
    run_.reset();  // joins the workers
    current_ = Batch();
    padding_ = false;
    return;
  }
  Built now = std::move(r.pending);
  padding_ = now.padding;
  current_ = std::move(*now.batch);
  // One step ahead: whether this batch is the epoch's last (gradient accumulation syncs on it).
  r.pending = r.take(r.index + 1);
  r.agreed = r.agree(r.pending, r.index + 1);
  const bool last = r.agreed.has_batch == 0;
  ++r.index;
  // Counted when handed out: a checkpoint taken after this batch's step resumes at the next one.
  if (last) {
    s.position = detail::StreamLoaderAccess::epoch_start(s, r.epoch + 1);
  } else {
    s.position = now.after;
    s.position.epoch = r.epoch;
    s.position.steps_done = r.first_step + static_cast<int64_t>(r.index);
  }
  s.padding = padding_;
  if (s.state) {
    s.state->end_of_dataloader = last;
    s.state->padding_in_last_step = 0;  // padding is flagged per batch (is_padding)
  }
}

StreamLoader::Iterator& StreamLoader::Iterator::operator++() {
  advance();
  return *this;
}

}  // namespace accelerant
