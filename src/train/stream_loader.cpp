// StreamLoader's construction, sharding and position; one epoch's reading is in
// stream_epoch_run.cpp.
#include "accelerant/stream_loader.h"

#include <algorithm>

#include "base/text.h"
#include "train/stream_loader_internal.h"

namespace accelerant {
namespace detail {

std::vector<size_t> shards_of_rank(size_t shards, int rank, int world_size,
                                   accelerant::StreamSharding sharding) {
  std::vector<size_t> mine;
  for (size_t j = 0; j < shards; ++j) {
    if (sharding == accelerant::StreamSharding::kByRecord ||
        static_cast<int>(j % static_cast<size_t>(world_size)) == rank) {
      mine.push_back(j);
    }
  }
  return mine;
}

bool owns_record(int64_t index, int rank, int world_size, accelerant::StreamSharding sharding) {
  return sharding == accelerant::StreamSharding::kByShard || index % world_size == rank;
}

StreamPosition StreamLoaderAccess::epoch_start(const StreamLoader::Shared& s, int64_t epoch) {
  const auto mine =
      shards_of_rank(s.source.shards.size(), s.rank, s.world_size, s.options.sharding());
  StreamPosition p;
  p.epoch = epoch;
  p.shard = mine.empty() ? static_cast<int64_t>(s.source.shards.size())
                         : static_cast<int64_t>(mine.front());
  return p;
}

StreamLoader StreamLoaderAccess::sharded(const StreamLoader& loader, StreamLoaderSharding how) {
  const auto& o = loader.shared_->options;
  const size_t shards = loader.shared_->source.shards.size();
  if (o.sharding() == accelerant::StreamSharding::kByShard &&
      shards < static_cast<size_t>(how.world_size)) {
    throw Error(
        str("the stream has ", shards, " shard(s) and is sharded by shard over ", how.world_size,
            " processes, so rank ", shards,
            " would get no record at all. Fix: write at least as many shards as ",
            "processes, or use StreamLoaderOptions().sharding(StreamSharding::kByRecord)."));
  }
  auto copy = std::make_shared<StreamLoader::Shared>(*loader.shared_);
  copy->rank = how.rank;
  copy->world_size = how.world_size;
  copy->rank_prefix = std::move(how.rank_prefix);
  copy->state = std::move(how.state);
  copy->transform = std::move(how.transform);
  copy->resume = std::move(how.resume);
  copy->all_reduce_max = std::move(how.all_reduce_max);
  copy->broadcast_text = std::move(how.broadcast_text);
  // A position at the start of an epoch is that epoch's start for the new rank; a position
  // inside one belongs to the rank that reached it, and set_position checks it.
  if (copy->position.steps_done == 0) copy->position = epoch_start(*copy, copy->position.epoch);
  return StreamLoader(std::move(copy));
}

}  // namespace detail

StreamLoader::StreamLoader(RecordSource source, StreamLoaderOptions options)
    : shared_(std::make_shared<Shared>()) {
  if (options.batch_size() < 1) {
    throw Error(detail::str("StreamLoaderOptions::batch_size is ", options.batch_size(),
                            ". Fix: use a batch size of 1 or more."));
  }
  if (options.num_workers() < 0 || options.prefetch_factor() < 1) {
    throw Error(detail::str("StreamLoaderOptions: num_workers ", options.num_workers(),
                            ", prefetch_factor ", options.prefetch_factor(),
                            ". Fix: num_workers must be 0 or more and prefetch_factor 1 or more."));
  }
  if (source.shards.empty() || !source.open || !source.parse) {
    throw Error(detail::str(
        "make_stream_loader: the record source has ", source.shards.size(), " shard(s)",
        source.open ? "" : ", no open function", source.parse ? "" : ", no parse function",
        ". Fix: list at least one shard and set open and parse (jsonl_files makes a complete "
        "source from JSON Lines files)."));
  }
  shared_->source = std::move(source);
  shared_->options = std::move(options);
  shared_->position = detail::StreamLoaderAccess::epoch_start(*shared_, 0);
}

int64_t StreamLoader::epoch() const { return shared_->epoch; }
StreamPosition StreamLoader::position() const { return shared_->position; }
bool StreamLoader::padding() const { return shared_->padding; }
const StreamLoaderOptions& StreamLoader::options() const { return shared_->options; }
const std::vector<std::string>& StreamLoader::shards() const { return shared_->source.shards; }
int StreamLoader::rank() const { return shared_->rank; }
int StreamLoader::world_size() const { return shared_->world_size; }

void StreamLoader::set_epoch(int64_t epoch) {
  shared_->epoch = epoch;
  shared_->position = detail::StreamLoaderAccess::epoch_start(*shared_, epoch);
}

void StreamLoader::set_position(const StreamPosition& position) {
  const auto& s = *shared_;
  const size_t shards = s.source.shards.size();
  const auto mine = detail::shards_of_rank(shards, s.rank, s.world_size, s.options.sharding());
  const bool at_end = position.shard == static_cast<int64_t>(shards);
  const bool known =
      at_end || std::find(mine.begin(), mine.end(),
                          static_cast<size_t>(std::max<int64_t>(position.shard, 0))) != mine.end();
  if (position.epoch < 0 || position.steps_done < 0 || position.shard < 0 || !known ||
      position.cursor.records < 0 || position.cursor.byte_offset < 0 ||
      position.records_passed < 0) {
    throw Error(detail::str(
        s.rank_prefix, "StreamLoader::set_position: epoch ", position.epoch, ", step ",
        position.steps_done, ", shard ", position.shard, " (byte ", position.cursor.byte_offset,
        ") does not fit this loader: rank ", s.rank, " of ", s.world_size, " reads ", mine.size(),
        " of the ", shards, " shard(s). Likely cause: a position saved by another rank, over ",
        "other shards or on another number of processes. Fix: resume with the same shards, ",
        "sharding and number of processes."));
  }
  shared_->epoch = position.epoch;
  shared_->position = position;
}

StreamLoader::Iterator StreamLoader::end() { return Iterator(); }

StreamLoader make_stream_loader(RecordSource source, StreamLoaderOptions options) {
  return StreamLoader(std::move(source), std::move(options));
}

}  // namespace accelerant
