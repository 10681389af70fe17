// Table tests for the per-rank sample order: each sample once per epoch, the same permutation on
// every rank, even batches padded from the head, and the padding exactly where
// gather_for_metrics will drop it.
#include <accelerant/data_sharding.h>
#include <accelerant/error.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <string>

using namespace accelerant;

namespace {

std::vector<EpochShard> all_ranks(int64_t n, int64_t epoch, int world, const ShardingOptions& o) {
  std::vector<EpochShard> shards;
  for (int r = 0; r < world; ++r) shards.push_back(shard_epoch(n, epoch, r, world, o));
  return shards;
}

// What gathering every step in rank order yields: step 0 of rank 0, 1, ..., then step 1, ...
std::vector<int64_t> gathered(const std::vector<EpochShard>& shards) {
  std::vector<int64_t> out;
  size_t steps = 0;
  for (const auto& s : shards) steps = std::max(steps, s.batches.size());
  for (size_t step = 0; step < steps; ++step) {
    for (const auto& s : shards) {
      if (step < s.batches.size())
        out.insert(out.end(), s.batches[step].begin(), s.batches[step].end());
    }
  }
  return out;
}

std::vector<int64_t> sorted(std::vector<int64_t> v) {
  std::sort(v.begin(), v.end());
  return v;
}

std::vector<int64_t> iota(int64_t n) {
  std::vector<int64_t> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = i;
  return v;
}

}  // namespace

TEST(DataSharding, EverySampleOnceAcrossRanksWithoutPadding) {
  for (int64_t n : {0, 1, 7, 10, 64, 101}) {
    for (int world : {1, 2, 3, 4}) {
      for (int64_t b : {1, 3, 8}) {
        for (bool shuffle : {false, true}) {
          SCOPED_TRACE("n=" + std::to_string(n) + " world=" + std::to_string(world) +
                       " b=" + std::to_string(b) + " shuffle=" + std::to_string(shuffle));
          auto o = ShardingOptions().batch_size(b).shuffle(shuffle).seed(7).even_batches(false);
          auto shards = all_ranks(n, 0, world, o);
          EXPECT_EQ(sorted(gathered(shards)), iota(n));
          for (const auto& s : shards) {
            EXPECT_EQ(s.padding, 0);
            for (const auto& batch : s.batches) EXPECT_LE(static_cast<int64_t>(batch.size()), b);
          }
        }
      }
    }
  }
}

TEST(DataSharding, EvenBatchesPadFromTheHeadAndTheGatherDropsExactlyThePadding) {
  for (int64_t n : {1, 7, 10, 64, 101}) {
    for (int world : {2, 3, 4}) {
      for (int64_t b : {1, 3, 8}) {
        SCOPED_TRACE("n=" + std::to_string(n) + " world=" + std::to_string(world) +
                     " b=" + std::to_string(b));
        auto o = ShardingOptions().batch_size(b).shuffle(true).seed(3);
        auto shards = all_ranks(n, 2, world, o);
        const int64_t steps = (n + b * world - 1) / (b * world);
        for (const auto& s : shards) {
          ASSERT_EQ(static_cast<int64_t>(s.batches.size()), steps);  // same count on every rank
          for (const auto& batch : s.batches) EXPECT_EQ(static_cast<int64_t>(batch.size()), b);
          EXPECT_EQ(s.padding, steps * b * world - n);
          EXPECT_EQ(s.real_samples, n);
        }
        auto all = gathered(shards);
        ASSERT_EQ(static_cast<int64_t>(all.size()), n + shards[0].padding);
        std::vector<int64_t> real(all.begin(), all.begin() + n);
        EXPECT_EQ(sorted(real), iota(n));  // dropping the tail leaves each sample exactly once
        for (int64_t i = n; i < static_cast<int64_t>(all.size()); ++i) {
          EXPECT_EQ(all[i], all[(i - n) % n]);  // padding repeats the head of the epoch's order
        }
      }
    }
  }
}

TEST(DataSharding, DropLastKeepsOnlyFullSteps) {
  auto o = ShardingOptions().batch_size(4).drop_last(true);
  auto shards = all_ranks(30, 0, 3, o);  // 12 samples per step: 2 full steps, 6 dropped
  for (const auto& s : shards) {
    EXPECT_EQ(s.batches.size(), 2u);
    EXPECT_EQ(s.padding, 0);
    EXPECT_EQ(s.real_samples, 24);
  }
  EXPECT_EQ(gathered(shards), iota(24));
}

TEST(DataSharding, SamePermutationOnEveryRankNewOneEachEpoch) {
  auto o = ShardingOptions().batch_size(5).shuffle(true).seed(11).even_batches(false);
  auto epoch0 = gathered(all_ranks(50, 0, 2, o));
  EXPECT_EQ(epoch0, gathered(all_ranks(50, 0, 2, o)));  // deterministic
  EXPECT_NE(epoch0, gathered(all_ranks(50, 1, 2, o)));  // reshuffled
  EXPECT_NE(epoch0, iota(50));
  // Any global RNG use in between must not change the order.
  torch::manual_seed(123);
  torch::rand({10});
  EXPECT_EQ(epoch0, gathered(all_ranks(50, 0, 2, o)));
}

TEST(DataSharding, SplitBatchesDividesTheGlobalBatch) {
  auto o = ShardingOptions().batch_size(8).split_batches(true);
  EXPECT_EQ(per_process_batch_size(o, 2), 4);
  auto shard = shard_epoch(16, 0, 1, 2, o);
  ASSERT_EQ(shard.batches.size(), 2u);
  EXPECT_EQ(shard.batches[0], std::vector<int64_t>({4, 5, 6, 7}));
  try {
    per_process_batch_size(ShardingOptions().batch_size(7).split_batches(true), 2);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("batch_size 7 cannot be split evenly over 2 processes"),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("Fix: use a multiple of 2 (e.g. 8)"), std::string::npos)
        << e.what();
  }
}

TEST(DataSharding, BadArgumentsAreErrors) {
  EXPECT_THROW(shard_epoch(10, 0, 0, 2, ShardingOptions().batch_size(0)), Error);
  EXPECT_THROW(shard_epoch(10, 0, 2, 2, ShardingOptions()), Error);
  EXPECT_THROW(shard_epoch(-1, 0, 0, 1, ShardingOptions()), Error);
}
