// The data loader: whole-dataset iteration before prepare, sharding across ranks after it,
// worker threads that keep the order, epochs, progress reported to the TrainingState.
#include <accelerant/accelerant.h>
#include <gtest/gtest.h>

#include <atomic>
#include <set>
#include <thread>

#include "train/data_loader_internal.h"  // the sharded copy Accelerator::prepare makes

using namespace accelerant;

namespace {

// Sample i is the row [i, i] with target i, so a batch shows which samples it holds.
DataLoader indexed_loader(int64_t n, DataLoaderOptions options) {
  auto data = torch::arange(n, torch::kFloat).unsqueeze(1).repeat({1, 2});
  return make_data_loader(data, torch::arange(n, torch::kLong), options);
}

std::vector<int64_t> targets_of(DataLoader& loader) {
  std::vector<int64_t> seen;
  for (auto& batch : loader) {
    EXPECT_TRUE(torch::equal(batch.data.select(1, 0).to(torch::kLong), batch.target));
    for (int64_t i = 0; i < batch.target.size(0); ++i)
      seen.push_back(batch.target[i].item<int64_t>());
  }
  return seen;
}

ShardingOptions sharding_of(const DataLoader& loader, bool even_batches) {
  return ShardingOptions()
      .batch_size(loader.options().batch_size())
      .shuffle(loader.options().shuffle())
      .seed(loader.options().seed().value_or(0))
      .drop_last(loader.options().drop_last())
      .even_batches(even_batches);
}

// What Accelerator::prepare does to a loader, without an Accelerator.
DataLoader sharded(const DataLoader& loader, int rank, int world, ShardingOptions sharding,
                   std::shared_ptr<TrainingState> state, std::function<Batch(Batch)> transform,
                   std::shared_ptr<accelerant::detail::ResumeHook> resume = nullptr) {
  return accelerant::detail::DataLoaderAccess::sharded(
      loader, {rank, world, std::move(sharding), std::move(state), std::move(transform),
               std::move(resume)});
}

// A torch dataset, to check the generic make_data_loader path.
struct Squares : torch::data::datasets::Dataset<Squares> {
  torch::data::Example<> get(size_t i) override {
    return {torch::full({1}, static_cast<float>(i * i)), torch::tensor(static_cast<int64_t>(i))};
  }
  torch::optional<size_t> size() const override { return 10; }
};

}  // namespace

TEST(DataLoader, BeforePrepareItYieldsTheWholeDatasetInOrder) {
  auto loader = indexed_loader(10, DataLoaderOptions().batch_size(4));
  EXPECT_EQ(loader.size(), 3);
  auto seen = targets_of(loader);
  std::vector<int64_t> expected(10);
  for (int i = 0; i < 10; ++i) expected[i] = i;
  EXPECT_EQ(seen, expected);
}

TEST(DataLoader, ShuffleChangesEveryEpochAndIsReproducible) {
  auto a = indexed_loader(50, DataLoaderOptions().batch_size(8).shuffle(true).seed(3));
  auto b = indexed_loader(50, DataLoaderOptions().batch_size(8).shuffle(true).seed(3));
  auto first = targets_of(a);
  auto second = targets_of(a);
  EXPECT_NE(first, second) << "epoch 1 repeated epoch 0's order";
  EXPECT_EQ(a.epoch(), 2);
  EXPECT_EQ(targets_of(b), first);
  b.set_epoch(1);
  EXPECT_EQ(targets_of(b), second);
  EXPECT_EQ(std::set<int64_t>(first.begin(), first.end()).size(), 50u);
}

TEST(DataLoader, WorkerThreadsKeepTheOrderOfTheSingleThreadedLoader) {
  auto serial = indexed_loader(103, DataLoaderOptions().batch_size(5).shuffle(true).seed(1));
  auto threaded =
      indexed_loader(103, DataLoaderOptions().batch_size(5).shuffle(true).seed(1).num_workers(3));
  EXPECT_EQ(targets_of(threaded), targets_of(serial));
}

TEST(DataLoader, WorkerThreadsBuildAheadButNotUnboundedly) {
  std::atomic<int> built{0};
  BatchMaker make = [&](const std::vector<int64_t>& indices) {
    ++built;
    return Batch{torch::tensor(indices), torch::tensor(indices)};
  };
  DataLoader loader(make, 100, DataLoaderOptions().num_workers(2).prefetch_factor(2));
  auto it = loader.begin();
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  // One batch consumed by begin(); then at most workers * prefetch_factor ahead of it.
  EXPECT_GE(built.load(), 2);
  EXPECT_LE(built.load(), 1 + 4 + 1);
}

TEST(DataLoader, AnErrorInAWorkerReachesTheLoop) {
  BatchMaker make = [](const std::vector<int64_t>& indices) -> Batch {
    if (indices[0] == 6) throw std::runtime_error("sample 6 is corrupt");
    return Batch{torch::tensor(indices), torch::tensor(indices)};
  };
  DataLoader loader(make, 10, DataLoaderOptions().batch_size(2).num_workers(2));
  std::string message;
  try {
    for (auto& batch : loader) (void)batch;
  } catch (const std::runtime_error& e) {
    message = e.what();
  }
  EXPECT_EQ(message, "sample 6 is corrupt");
}

TEST(DataLoader, TorchDatasetsAreStackedIntoBatches) {
  auto loader = make_data_loader(Squares(), DataLoaderOptions().batch_size(4));
  auto it = loader.begin();
  EXPECT_EQ(it->data.sizes(), (std::vector<int64_t>{4, 1}));
  EXPECT_EQ(it->data[3].item<float>(), 9.0f);
  EXPECT_EQ(loader.size(), 3);
}

TEST(DataLoader, RanksShareEachEpochWithEveryTheSamplesOnceAndPaddingReported) {
  const int world = 3;
  auto loader = indexed_loader(20, DataLoaderOptions().batch_size(4).shuffle(true).seed(9));
  std::multiset<int64_t> all;
  int64_t batches = -1;
  for (int rank = 0; rank < world; ++rank) {
    auto state = std::make_shared<TrainingState>();
    auto shard = sharded(loader, rank, world, sharding_of(loader, true), state, nullptr);
    if (batches >= 0) EXPECT_EQ(shard.size(), batches) << "even_batches: every rank the same count";
    batches = shard.size();
    int64_t seen_batches = 0;
    for (auto& batch : shard) {
      ++seen_batches;
      EXPECT_EQ(state->end_of_dataloader, seen_batches == shard.size());
      for (int64_t i = 0; i < batch.target.size(0); ++i)
        all.insert(batch.target[i].item<int64_t>());
    }
    EXPECT_EQ(state->padding_in_last_step, 24 - 20);  // 2 steps x 3 ranks x 4 - 20 samples
  }
  EXPECT_EQ(all.size(), 24u);
  for (int64_t i = 0; i < 20; ++i) EXPECT_GE(all.count(i), 1u) << "sample " << i << " never seen";
}

TEST(DataLoader, TransformRunsOnEveryBatch) {
  auto loader = indexed_loader(6, DataLoaderOptions().batch_size(3).num_workers(1));
  auto shard = sharded(loader, 0, 1, sharding_of(loader, true), nullptr, [](Batch b) {
    return Batch{b.data.to(torch::kBFloat16), b.target};
  });
  int batches = 0;
  for (auto& batch : shard) {
    EXPECT_EQ(batch.data.scalar_type(), torch::kBFloat16);
    ++batches;
  }
  EXPECT_EQ(batches, 2);  // 6 samples in batches of 3
}

TEST(DataLoader, SplitBatchesThatDoNotDivideAreRefusedAtPrepare) {
  auto loader = indexed_loader(20, DataLoaderOptions().batch_size(5));
  try {
    sharded(loader, 0, 2, sharding_of(loader, true).split_batches(true), nullptr, nullptr);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot be split evenly over 2"), std::string::npos)
        << e.what();
  }
}

// auto_resume's hook (train/resume_hook.h): only begin() fires it, once, for every loader that
// shares it; the getters never do, so they never load a checkpoint or talk to other ranks.
TEST(DataLoader, OnlyBeginFiresTheResumeHookAndOnlyOnce) {
  auto hook = std::make_shared<accelerant::detail::ResumeHook>();
  int resumes = 0;
  auto first = indexed_loader(8, DataLoaderOptions().batch_size(2));
  auto second = indexed_loader(8, DataLoaderOptions().batch_size(4));
  auto a = sharded(first, 0, 1, sharding_of(first, false), nullptr, nullptr, hook);
  auto b = sharded(second, 0, 1, sharding_of(second, false), nullptr, nullptr, hook);
  hook->arm([&] {
    ++resumes;
    a.set_position({1, 4});  // as a load_state would
  });
  EXPECT_EQ(a.epoch(), 0);
  EXPECT_EQ(a.position().epoch, 0);
  EXPECT_EQ(a.position().samples_done, 0);
  EXPECT_EQ(a.size(), 4);
  EXPECT_EQ(b.epoch(), 0);
  EXPECT_EQ(resumes, 0) << "a getter ran the resume";
  auto it = a.begin();  // the resume runs first, then the epoch starts where it put the loader
  EXPECT_EQ(resumes, 1);
  EXPECT_EQ(it->target[0].item<int64_t>(), 4);
  for (auto& batch : b) (void)batch;
  EXPECT_EQ(resumes, 1) << "the hook is shared and fires once";
}

TEST(DataLoader, BadOptionsAreRefused) {
  EXPECT_THROW(indexed_loader(5, DataLoaderOptions().batch_size(0)), Error);
  EXPECT_THROW(indexed_loader(5, DataLoaderOptions().num_workers(-1)), Error);
  EXPECT_THROW(make_data_loader(torch::zeros({4, 2}), torch::zeros({3})), Error);
}
