// A loader over data read as a stream: records come from shards (files, or any source that can
// be opened at a position) without the data set knowing its size.
//
//   auto source = accelerant::jsonl_files(paths, [](const nlohmann::json& r) {
//     return accelerant::Batch{torch::tensor(r.at("x").get<std::vector<float>>()),
//                              torch::tensor(r.at("y").get<int64_t>())};
//   });
//   auto loader = accelerant::make_stream_loader(source,
//                     accelerant::StreamLoaderOptions().batch_size(32).num_workers(2));
//   auto [m, o, l] = accelerator.prepare(model, optimizer, loader);
//   for (auto& batch : l) { ... batch.data ... batch.target ... }
//
// Before prepare it reads every shard, like a single-process loader. After prepare each process
// reads its share (StreamSharding): record i to rank i % W, or shard j to rank j % W. Each `for`
// is one epoch over the whole stream.
//
// Note "Uneven stream ends": the ranks' shares differ in length and nobody knows the lengths in
// advance. Every step each rank says whether it still has a record, in one all-reduce of three
// integers (one step ahead, so that the last batch is known as the last: gradient accumulation
// synchronises on it). While any rank still has records the epoch goes on, and a rank that has
// run out yields a padding batch: the first batch of its share again, flagged by is_padding().
// When no rank has a record left the epoch ends on every rank at the same step. So every record
// is yielded exactly once as a real batch, no rank waits forever in a collective, and the cost is
// one small all-reduce per step (docs/data_loading.md "Streams" compares this with Accelerate's
// even_batches and IterableDatasetShard). A reader or parse error on one rank fails the same step
// on every rank instead of leaving the others waiting.
//
// The stream position (epoch, steps handed out and, per rank, the shard and the byte offset in
// it) is saved by Accelerator::save_state, one file per rank, and restored by load_state and
// auto_resume: the resumed run continues at the same record on every rank. It resumes only on
// the same number of processes.
#pragma once

#include <cstdint>
#include <functional>
#include <iterator>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "accelerant/batch.h"
#include "accelerant/error.h"
#include "accelerant/options.h"

namespace accelerant {
namespace detail {
struct StreamLoaderAccess;
}  // namespace detail

/// Where a reader stands inside one shard.
struct ShardCursor {
  /// Records read from the shard so far.
  int64_t records = 0;
  /// Lines (or record numbers) passed so far; the next record's line is after it.
  int64_t lines = 0;
  /// Byte offset of the next record, for readers that can seek (files); readers that cannot
  /// skip `records` records instead.
  int64_t byte_offset = 0;
};

/// One record as a reader found it, not yet parsed.
struct RawRecord {
  /// The record's text (a JSON Lines line without its newline).
  std::string text;
  /// Its 1-based line (or record number) in its shard, named by errors.
  int64_t line = 0;
};

/// Reads the records of one shard in order (RecordSource::open makes one).
class RecordReader {
 public:
  virtual ~RecordReader() = default;
  /// Reads the next record into `record`; false at the end of the shard. Throws Error for
  /// unreadable input, naming the shard and the line.
  virtual bool next(RawRecord& record) = 0;
  /// Where the next record starts (what save_state keeps).
  virtual ShardCursor cursor() const = 0;
};

/// A data set read as a stream: its shards, how to open one at a position, how to parse one
/// record. jsonl_files makes one for JSON Lines files.
struct RecordSource {
  /// The shards' names (file paths), in order: the stream is shard 0's records, then shard 1's.
  std::vector<std::string> shards;
  /// Opens shard `index` positioned at `from` (a default ShardCursor: its start).
  std::function<std::unique_ptr<RecordReader>(size_t index, const ShardCursor& from)> open;
  /// One record to one sample: a Batch of one example (tensors without the batch dimension), put
  /// together by StreamLoaderOptions::collate. Called from worker threads at once: it must be
  /// safe for that. What it throws comes back as an Error naming the shard and the line.
  std::function<Batch(const RawRecord& record)> parse;
};

/// How a prepared stream is divided between the processes.
enum class StreamSharding {
  /// Record i of the stream to rank i % W: even shares whatever the shards' sizes, but every
  /// rank reads (and skips) every shard.
  kByRecord,
  /// Shard j to rank j % W: each rank opens only its own files; shares as even as the shards.
  /// Needs at least as many shards as processes.
  kByShard,
};

/// Puts the samples of one batch together (what RecordSource::parse returned for each record).
using StreamCollate = std::function<Batch(std::vector<Batch>&& samples)>;

/// How a StreamLoader batches, reads ahead and divides its stream (make_stream_loader).
struct StreamLoaderOptions {
  /// Records per batch on each process. Default: 1.
  ACCELERANT_OPTION(int64_t, batch_size) = 1;
  /// How a prepared loader divides the stream between processes. Default:
  /// StreamSharding::kByRecord.
  ACCELERANT_OPTION(StreamSharding, sharding) = StreamSharding::kByRecord;
  /// Threads that read and parse batches ahead of the loop; 0 reads them in the loop's thread.
  /// Records are read in order by one thread at a time; parsing and collating run in parallel.
  /// Default: 0.
  ACCELERANT_OPTION(int, num_workers) = 0;
  /// Batches each worker thread may build ahead (the bound of the queue). Default: 2.
  ACCELERANT_OPTION(int, prefetch_factor) = 2;
  /// Builds a batch from its samples. Default: null = torch::stack of the samples' data and of
  /// their targets (a target left undefined by every sample stays undefined).
  ACCELERANT_OPTION(StreamCollate, collate) = nullptr;
};

/// Where a stream loader is, on this process (see the file comment). Saved per rank.
struct StreamPosition {
  /// The epoch in progress.
  int64_t epoch = 0;
  /// Steps of that epoch handed out (the same on every rank: padding steps count).
  int64_t steps_done = 0;
  /// The shard this rank reads next (an index into RecordSource::shards; their number when its
  /// share is read to the end).
  int64_t shard = 0;
  /// Where in that shard.
  ShardCursor cursor;
  /// Records of its shards this rank has passed this epoch, its own and (sharding by record)
  /// those it skipped: which of the next records are its own.
  int64_t records_passed = 0;
};

/// Batches of a stream, one epoch per `for` (see the file comment). Made by make_stream_loader;
/// Accelerator::prepare returns a sharded copy. Copies share their position.
class StreamLoader {
 public:
  /// A loader over `source`'s records. Throws Error for invalid options or a source without
  /// shards, open or parse.
  StreamLoader(RecordSource source, StreamLoaderOptions options);

  class Iterator;
  /// Starts an epoch (the current epoch number, then advances it). On a prepared loader this and
  /// the iterator's ++ are collectives (one small all-reduce per step); under
  /// AcceleratorOptions::auto_resume the first begin() may load the newest checkpoint first.
  Iterator begin();
  /// The end of any epoch.
  Iterator end();

  /// The epoch the next `for` runs. Getters read this process's copy only.
  int64_t epoch() const;
  /// The next `for` runs `epoch` from its start.
  void set_epoch(int64_t epoch);
  /// Where the batches handed out so far leave this process (after the last batch of an epoch:
  /// the start of the next).
  StreamPosition position() const;
  /// The next `for` continues from `position` (load_state uses this). Throws Error when the
  /// position does not fit this loader (another rank's, another number of shards).
  void set_position(const StreamPosition& position);
  /// Whether the batch handed out last is padding: this process had run out of records while
  /// another had not (see the file comment). Count, evaluate or gather only the batches where it
  /// is false; training on padding repeats samples as Accelerate's even_batches does.
  bool padding() const;
  /// The options it was made with.
  const StreamLoaderOptions& options() const;
  /// The shards of its source.
  const std::vector<std::string>& shards() const;
  /// The process whose share it yields; 0 before prepare.
  int rank() const;
  /// The processes the stream is divided between; 1 before prepare.
  int world_size() const;

 private:
  friend struct detail::StreamLoaderAccess;  // Accelerator::prepare's sharded copy
  struct Shared;                             // src/train/stream_loader_internal.h
  struct EpochRun;                           // src/train/stream_epoch_run.cpp
  explicit StreamLoader(std::shared_ptr<Shared> shared) : shared_(std::move(shared)) {}
  std::shared_ptr<Shared> shared_;
};

/// A single-pass iterator over one epoch's batches of a StreamLoader; a default-constructed one
/// is the end. It holds the epoch's worker threads, joined when it reaches the end or goes.
class StreamLoader::Iterator {
 public:
  /// Single pass: each batch is read once.
  using iterator_category = std::input_iterator_tag;
  /// What it yields: a Batch.
  using value_type = Batch;
  /// As the standard iterator requirements ask.
  using difference_type = std::ptrdiff_t;
  /// The current Batch, through operator->.
  using pointer = Batch*;
  /// The current Batch, through operator*.
  using reference = Batch&;

  /// The end iterator (the same as StreamLoader::end()).
  Iterator() = default;
  /// The current batch; ++ replaces it.
  Batch& operator*() { return current_; }
  /// The current batch's members, as in it->data.
  Batch* operator->() { return &current_; }
  /// Whether the current batch is padding (StreamLoader::padding()).
  bool is_padding() const { return padding_; }
  /// Hands out the next batch; after the last one of the epoch (on every rank the same step) it
  /// becomes the end. On a prepared loader a collective. Rethrows what reading or parsing threw,
  /// and throws Error on every rank when any rank failed.
  Iterator& operator++();
  /// Whether both are at the end of their epoch or both are not.
  bool operator==(const Iterator& other) const { return done() == other.done(); }
  /// The negation of operator==.
  bool operator!=(const Iterator& other) const { return !(*this == other); }

 private:
  friend class StreamLoader;
  explicit Iterator(std::shared_ptr<EpochRun> run);
  bool done() const { return run_ == nullptr; }
  void advance();
  std::shared_ptr<EpochRun> run_;
  Batch current_;
  bool padding_ = false;
};

/// A loader over `source` (see StreamLoader).
StreamLoader make_stream_loader(RecordSource source, StreamLoaderOptions options = {});

/// How jsonl_files reads its files.
struct JsonLinesOptions {
  /// The longest line accepted, in bytes; a longer one is an error naming the file and line (a
  /// file that is not JSON Lines, or a missing newline, would otherwise be read whole). Each
  /// record is also parsed within the nesting bound of every JSON Accelerant reads (64 deep).
  /// Default: 1 MiB.
  ACCELERANT_OPTION(int64_t, max_line_bytes) = int64_t{1} << 20;
};

/// The records of JSON Lines files (one JSON value per line; blank lines skipped), one shard per
/// file, each line parsed with nlohmann::json and handed to `parse` (include
/// <nlohmann/json.hpp> to write it). Invalid JSON, a line that is too long, a file that cannot be
/// opened or what `parse` throws (a missing field) is an Error naming the file, the line and the
/// problem.
RecordSource jsonl_files(std::vector<std::string> paths,
                         std::function<Batch(const nlohmann::json& record)> parse,
                         JsonLinesOptions options = {});

}  // namespace accelerant
