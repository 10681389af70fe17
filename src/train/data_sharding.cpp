#include "accelerant/data_sharding.h"

#include <torch/types.h>

#include "accelerant/error.h"
#include "base/text.h"

namespace accelerant {
namespace {

std::vector<int64_t> epoch_order(int64_t n, int64_t epoch, const ShardingOptions& o) {
  std::vector<int64_t> order(static_cast<size_t>(n));
  if (!o.shuffle()) {
    for (int64_t i = 0; i < n; ++i) order[i] = i;
    return order;
  }
  // The generator is created here, from seed + epoch alone: no global RNG state is read, so every
  // rank computes the same permutation whatever else it has drawn.
  auto generator = at::detail::createCPUGenerator(o.seed() + static_cast<uint64_t>(epoch));
  auto perm = torch::randperm(n, generator, torch::kLong);
  std::copy(perm.data_ptr<int64_t>(), perm.data_ptr<int64_t>() + n, order.begin());
  return order;
}

}  // namespace

int64_t per_process_batch_size(const ShardingOptions& o, int world_size) {
  if (o.batch_size() < 1) {
    throw Error(
        detail::str("batch_size is ", o.batch_size(), ". Fix: use a batch size of 1 or more."));
  }
  if (world_size < 1) {
    throw Error(detail::str("world size is ", world_size,
                            ". Fix: pass ProcessState::world_size() (at least 1)."));
  }
  if (!o.split_batches()) return o.batch_size();
  if (o.batch_size() % world_size != 0) {
    throw Error(detail::str(
        "split_batches: batch_size ", o.batch_size(), " cannot be split evenly over ", world_size,
        " processes. Fix: use a multiple of ", world_size, " (e.g. ",
        (o.batch_size() / world_size + 1) * world_size, ") or turn split_batches off."));
  }
  return o.batch_size() / world_size;
}

EpochShard shard_epoch(int64_t dataset_size, int64_t epoch, int rank, int world_size,
                       const ShardingOptions& o, int64_t first_position) {
  const int64_t b = per_process_batch_size(o, world_size);
  if (rank < 0 || rank >= world_size) {
    throw Error(detail::str("rank ", rank, " is outside 0..", world_size - 1,
                            ". Fix: pass ProcessState::rank() and world_size() together."));
  }
  if (dataset_size < 0) {
    throw Error(detail::str(
        "dataset size ", dataset_size,
        " is negative. Fix: pass the dataset's number of samples (size() of 0 or more)."));
  }
  if (first_position < 0 || first_position > dataset_size) {
    throw Error(detail::str(
        "the epoch cannot continue after position ", first_position, " of ", dataset_size,
        " samples. Likely cause: a data position saved for another dataset. Fix: resume ",
        "with the dataset the checkpoint was saved with."));
  }
  const auto order = epoch_order(dataset_size, epoch, o);
  const int64_t per_step = b * world_size;
  const int64_t left = dataset_size - first_position;
  const int64_t steps = o.drop_last() ? left / per_step : (left + per_step - 1) / per_step;
  EpochShard shard;
  const int64_t covered = o.drop_last() ? first_position + steps * per_step : dataset_size;
  shard.real_samples = covered - first_position;
  if (o.even_batches() && !o.drop_last()) shard.padding = steps * per_step - left;
  for (int64_t s = 0; s < steps; ++s) {
    std::vector<int64_t> batch;
    for (int64_t j = 0; j < b; ++j) {
      const int64_t position = first_position + (s * world_size + rank) * b + j;
      if (position < covered) {
        batch.push_back(order[position]);
      } else if (shard.padding > 0 && dataset_size > 0) {
        batch.push_back(order[(position - covered) % dataset_size]);  // repeat from the head
      }
    }
    if (!batch.empty()) shard.batches.push_back(std::move(batch));
  }
  return shard;
}

}  // namespace accelerant
