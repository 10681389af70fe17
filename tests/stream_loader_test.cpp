// Stream loaders: sharding by record and by shard, JSON Lines errors that name the file and line,
// positions that resume at the same record; on two real ranks over loopback, uneven shares that
// end together with every record seen once, a reader error that stops every rank, and a run
// SIGKILLed after a checkpoint that resumes and ends bit-identical to one nobody interrupted.
#include <accelerant/accelerant.h>
#include <gtest/gtest.h>

#include <chrono>
#include <csignal>
#include <fstream>
#include <nlohmann/json.hpp>

#include "test_support.h"
#include "train/stream_loader_internal.h"  // the sharded copy Accelerator::prepare makes

using namespace accelerant;
using accelerant::testing::contains;
using accelerant::testing::error_message;
using accelerant::testing::ScratchDir;

namespace {

// Writes JSON Lines shards of the given sizes into `dir`; record ids count up across the shards.
// Record i: {"id": i, "x": [4 values from i], "y": i % 3}.
std::vector<std::string> write_shards(const std::string& dir, const std::vector<int>& sizes) {
  std::vector<std::string> paths;
  int64_t id = 0;
  for (size_t j = 0; j < sizes.size(); ++j) {
    paths.push_back(dir + "/shard_" + std::to_string(j) + ".jsonl");
    std::ofstream out(paths.back());
    for (int i = 0; i < sizes[j]; ++i, ++id) {
      const double v = static_cast<double>(id);
      out << nlohmann::json{{"id", id},
                            {"x", {v / 10, -v / 20, (id % 7) / 7.0, 1.0}},
                            {"y", id % 3}}
                 .dump()
          << "\n";
    }
  }
  return paths;
}

// Data x, target the record's id: a batch tells which records it holds.
Batch parse_id(const nlohmann::json& r) {
  return Batch{torch::tensor(r.at("x").get<std::vector<float>>()),
               torch::tensor(r.at("id").get<int64_t>())};
}

Batch parse_xy(const nlohmann::json& r) {
  return Batch{torch::tensor(r.at("x").get<std::vector<float>>()),
               torch::tensor(r.at("y").get<int64_t>())};
}

std::vector<int64_t> ids_of(StreamLoader& loader) {
  std::vector<int64_t> seen;
  for (auto& batch : loader) {
    for (int64_t i = 0; i < batch.target.size(0); ++i)
      seen.push_back(batch.target[i].item<int64_t>());
  }
  return seen;
}

// Rank `rank` of `world`'s share, read alone (no agreement with other ranks).
StreamLoader share_of(const StreamLoader& loader, int rank, int world) {
  accelerant::detail::StreamLoaderSharding how;
  how.rank = rank;
  how.world_size = world;
  return accelerant::detail::StreamLoaderAccess::sharded(loader, how);
}

std::vector<int64_t> range(int64_t from, int64_t to, int64_t step = 1) {
  std::vector<int64_t> r;
  for (int64_t i = from; i < to; i += step) r.push_back(i);
  return r;
}

LaunchOptions loader_ranks(int n) {
  return LaunchOptions()
      .processes_per_node(n)
      .collective_timeout(std::chrono::seconds(30))
      .verbose(false);
}

}  // namespace

TEST(StreamLoader, ReadsEveryShardInOrderBeforePrepare) {
  ScratchDir dir;
  auto loader = make_stream_loader(jsonl_files(write_shards(dir.path, {3, 0, 5}), parse_id),
                                   StreamLoaderOptions().batch_size(2));
  EXPECT_EQ(ids_of(loader), range(0, 8));
  EXPECT_EQ(loader.epoch(), 1);
  EXPECT_EQ(ids_of(loader), range(0, 8)) << "the second epoch reads the stream again";
}

TEST(StreamLoader, ShardsByRecordGiveRecordIToRankIModW) {
  ScratchDir dir;
  auto loader = make_stream_loader(jsonl_files(write_shards(dir.path, {5, 0, 7, 1}), parse_id),
                                   StreamLoaderOptions().batch_size(2));
  for (int r = 0; r < 3; ++r) {
    auto share = share_of(loader, r, 3);
    EXPECT_EQ(ids_of(share), range(r, 13, 3)) << "rank " << r;
  }
}

TEST(StreamLoader, ShardsByShardGiveShardJToRankJModW) {
  ScratchDir dir;
  auto paths = write_shards(dir.path, {2, 3, 4, 1, 2});  // ids 0-1, 2-4, 5-8, 9, 10-11
  auto loader = make_stream_loader(
      jsonl_files(paths, parse_id),
      StreamLoaderOptions().batch_size(3).sharding(StreamSharding::kByShard).num_workers(2));
  auto rank0 = share_of(loader, 0, 2);
  auto rank1 = share_of(loader, 1, 2);
  EXPECT_EQ(ids_of(rank0), (std::vector<int64_t>{0, 1, 5, 6, 7, 8, 10, 11}));
  EXPECT_EQ(ids_of(rank1), (std::vector<int64_t>{2, 3, 4, 9}));
  auto message = error_message([&] { share_of(loader, 0, 6); });
  EXPECT_TRUE(contains(message, "5 shard(s)") && contains(message, "kByRecord")) << message;
}

TEST(StreamLoader, PositionResumesAtTheSameRecordWithAndWithoutWorkers) {
  ScratchDir dir;
  auto paths = write_shards(dir.path, {7, 6, 9});
  for (int workers : {0, 3}) {
    auto options = StreamLoaderOptions().batch_size(4).num_workers(workers);
    auto first = share_of(make_stream_loader(jsonl_files(paths, parse_id), options), 1, 2);
    std::vector<int64_t> before;
    {
      int steps = 0;
      for (auto& batch : first) {
        for (int64_t i = 0; i < batch.target.size(0); ++i)
          before.push_back(batch.target[i].item<int64_t>());
        if (++steps == 2) break;  // leaves mid-epoch, the reader far ahead with workers
      }
    }
    const StreamPosition at = first.position();
    EXPECT_EQ(at.steps_done, 2);
    auto resumed = share_of(make_stream_loader(jsonl_files(paths, parse_id), options), 1, 2);
    resumed.set_position(at);
    auto after = ids_of(resumed);
    before.insert(before.end(), after.begin(), after.end());
    EXPECT_EQ(before, range(1, 22, 2)) << workers << " workers";
    EXPECT_EQ(resumed.position().epoch, 1);
  }
}

TEST(StreamLoader, JsonLinesErrorsNameTheFileTheLineAndTheProblem) {
  ScratchDir dir;
  const std::string bad = dir.path + "/bad.jsonl";
  {
    std::ofstream out(bad);
    out << "{\"id\": 0, \"x\": [1,2,3,4]}\n\n{\"id\": 1, \"x\": [1,2,\n";
  }
  auto read_all = [&](const std::string& path, JsonLinesOptions options = {}) {
    return error_message([&] {
      auto loader = make_stream_loader(jsonl_files({path}, parse_id, options));
      ids_of(loader);
    });
  };
  auto message = read_all(bad);
  EXPECT_TRUE(contains(message, "bad.jsonl:3") && contains(message, "not valid JSON")) << message;

  const std::string missing_field = dir.path + "/missing.jsonl";
  std::ofstream(missing_field) << "{\"id\": 0, \"x\": [1,2,3,4]}\n{\"x\": [1,2,3,4]}\n";
  message = read_all(missing_field);
  EXPECT_TRUE(contains(message, "missing.jsonl:2") && contains(message, "rejected the record") &&
              contains(message, "id"))
      << message;

  const std::string long_line = dir.path + "/long.jsonl";
  std::ofstream(long_line) << "{\"id\": 0, \"x\": [1,2,3,4]}\n[" << std::string(100, '1') << "]\n";
  message = read_all(long_line, JsonLinesOptions().max_line_bytes(64));
  EXPECT_TRUE(contains(message, "long.jsonl:2") && contains(message, "longer than 64 bytes"))
      << message;

  const std::string deep = dir.path + "/deep.jsonl";
  std::ofstream(deep) << std::string(100, '[') << std::string(100, ']') << "\n";
  message = read_all(deep);
  EXPECT_TRUE(contains(message, "deep.jsonl:1") && contains(message, "deep")) << message;

  message = read_all(dir.path + "/absent.jsonl");
  EXPECT_TRUE(contains(message, "cannot open") && contains(message, "absent.jsonl")) << message;
}

TEST(StreamLoader, DefaultCollateNamesThePaddingFixForRaggedRecords) {
  ScratchDir dir;
  const std::string ragged = dir.path + "/ragged.jsonl";
  std::ofstream(ragged) << "{\"id\": 0, \"x\": [1,2,3,4]}\n{\"id\": 1, \"x\": [1,2]}\n";
  auto message = error_message([&] {
    auto loader =
        make_stream_loader(jsonl_files({ragged}, parse_id), StreamLoaderOptions().batch_size(2));
    ids_of(loader);
  });
  EXPECT_TRUE(contains(message, "collate")) << message;
}

// ---- two real ranks ------------------------------------------------------------------------

TEST(StreamLoaderOnRanks, UnevenSharesEndTogetherAndSeeEveryRecordOnce) {
  ScratchDir dir;
  struct Case {
    std::vector<int> sizes;
    StreamSharding sharding;
    int workers;
  };
  // By shard: rank 0 gets 19 records (7 steps of 3), rank 1 one record (1 step, then padding).
  // By record: 13 records, 7 and 6 (4 and 3 steps of 2).
  for (const Case& c : {Case{{10, 1, 7, 0, 2}, StreamSharding::kByShard, 0},
                        Case{{5, 8}, StreamSharding::kByRecord, 2}}) {
    const auto paths = write_shards(dir.path, c.sizes);
    int64_t total = 0;
    for (int size : c.sizes) total += size;
    const auto start = std::chrono::steady_clock::now();
    auto results = launch(
        [&](int) {
          Accelerator acc;
          auto loader = make_stream_loader(
              jsonl_files(paths, parse_id),
              StreamLoaderOptions().batch_size(3).sharding(c.sharding).num_workers(c.workers));
          auto prepared = acc.prepare(loader);
          std::vector<int64_t> real;
          int64_t steps = 0, last_flags = 0;
          for (int epoch = 0; epoch < 2; ++epoch) {
            for (auto it = prepared.begin(); it != prepared.end(); ++it) {
              ++steps;
              if (acc.state()->end_of_dataloader) ++last_flags;
              if (it.is_padding()) continue;
              for (int64_t i = 0; i < it->target.size(0); ++i)
                real.push_back(it->target[i].item<int64_t>());
            }
          }
          // [steps, end-of-epoch flags, the real record ids...]
          std::vector<int64_t> out{steps, last_flags};
          out.insert(out.end(), real.begin(), real.end());
          return torch::tensor(out);
        },
        loader_ranks(2));
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_LT(seconds, 20) << "bounded time";
    ASSERT_EQ(results.size(), 2u);
    EXPECT_EQ(results[0][0].item<int64_t>(), results[1][0].item<int64_t>()) << "same steps";
    std::vector<int64_t> all;
    for (const auto& r : results) {
      EXPECT_EQ(r[1].item<int64_t>(), 2) << "end_of_dataloader once per epoch";
      for (int64_t i = 2; i < r.size(0); ++i) all.push_back(r[i].item<int64_t>());
    }
    std::sort(all.begin(), all.end());
    std::vector<int64_t> expected;
    for (int epoch = 0; epoch < 2; ++epoch) {
      for (int64_t i = 0; i < total; ++i) expected.push_back(i);
    }
    std::sort(expected.begin(), expected.end());
    EXPECT_EQ(all, expected) << "every record exactly once per epoch";
  }
}

TEST(StreamLoaderOnRanks, AReaderErrorOnOneRankStopsEveryRank) {
  ScratchDir dir;
  auto paths = write_shards(dir.path, {6, 6});
  {
    std::ofstream out(paths[1], std::ios::app);
    out << "{\"id\": 12, \"x\": [1,2,3,4]\n";  // line 7 of shard 1: rank 1's, by shard
  }
  for (int workers : {0, 2}) {
    const auto start = std::chrono::steady_clock::now();
    auto message = error_message([&] {
      launch(
          [&](int) {
            Accelerator acc;
            auto loader = acc.prepare(make_stream_loader(jsonl_files(paths, parse_id),
                                                         StreamLoaderOptions()
                                                             .batch_size(2)
                                                             .sharding(StreamSharding::kByShard)
                                                             .num_workers(workers)));
            for (auto& batch : loader) (void)batch;
          },
          loader_ranks(2));
    });
    EXPECT_TRUE(contains(message, "shard_1.jsonl:7") && contains(message, "not valid JSON"))
        << workers << " workers: " << message;
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 20);
  }
}

namespace {

constexpr int64_t kEpochs = 2;
constexpr int64_t kSaveEvery = 4;

// Trains a small model on the stream for kEpochs epochs, saving every kSaveEvery optimizer steps;
// rank 1 kills itself right after the save at step `kill_at` (0: never). Returns the parameters
// followed by the optimizer steps this run took.
torch::Tensor train_on_stream(const std::vector<std::string>& paths, const std::string& project,
                              int64_t kill_at, int index) {
  Accelerator acc(AcceleratorOptions().project_dir(project).auto_resume(true));
  torch::manual_seed(3);
  auto model =
      torch::nn::Sequential(torch::nn::Linear(4, 8), torch::nn::Tanh(), torch::nn::Linear(8, 3));
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  auto loader = make_stream_loader(
      jsonl_files(paths, parse_xy),
      StreamLoaderOptions().batch_size(4).sharding(StreamSharding::kByShard).num_workers(2));
  auto [m, o, l] = acc.prepare(model, sgd, loader);
  acc.auto_resume_now();
  const int64_t first_step = acc.state()->optimizer_steps;
  while (l.epoch() < kEpochs) {
    for (auto& batch : l) {
      auto loss = torch::nn::functional::cross_entropy(m->forward(batch.data), batch.target);
      acc.backward(loss);
      o.step();
      o.zero_grad();
      const int64_t step = acc.state()->optimizer_steps;
      if (step % kSaveEvery == 0) {
        acc.save_state();
        if (step == kill_at && index == 1) std::raise(SIGKILL);
      }
    }
  }
  std::vector<torch::Tensor> flat;
  for (auto& p : m->parameters()) flat.push_back(p.detach().reshape({-1}));
  flat.push_back(torch::tensor({static_cast<float>(acc.state()->optimizer_steps - first_step)}));
  return torch::cat(flat);
}

}  // namespace

TEST(StreamLoaderOnRanks, KilledAndResumedRunEndsBitIdentical) {
  ScratchDir dir;
  // By shard: rank 0 reads shards 0 and 2 (35 records, 9 steps of 4), rank 1 shards 1 and 3
  // (10 records, 3 steps, then padding): 9 steps an epoch, 18 in all. The kill comes after the
  // save at step 8, with rank 0 inside shard 2 and rank 1 padding.
  const auto paths = write_shards(dir.path, {13, 7, 22, 3});
  const std::string whole = dir.path + "/whole", killed = dir.path + "/killed";
  auto reference =
      launch([&](int index) { return train_on_stream(paths, whole, 0, index); }, loader_ranks(2));
  ASSERT_EQ(reference.size(), 2u);
  EXPECT_EQ(reference[0][-1].item<float>(), 18);
  EXPECT_TRUE(torch::equal(reference[0], reference[1]));

  auto message = error_message([&] {
    launch([&](int index) { return train_on_stream(paths, killed, 8, index); }, loader_ranks(2));
  });
  EXPECT_FALSE(message.empty()) << "rank 1 was killed, so the launch must fail";
  // The positions as another reader sees them (plain JSON, one file per rank): after step 8 rank
  // 0 has read 32 records, the 13 of shard 0 and 19 of shard 2; rank 1 has read its 10 and pads.
  auto position_file = [&](int rank) {
    std::ifstream in(killed + "/checkpoints/checkpoint_1/rank_" + std::to_string(rank) +
                     "/stream_0.json");
    return nlohmann::json::parse(in);
  };
  const auto rank0 = position_file(0), rank1 = position_file(1);
  EXPECT_EQ(rank0.at("steps_done"), 8);
  EXPECT_EQ(rank0.at("shard"), 2);
  EXPECT_EQ(rank0.at("records"), 19);
  EXPECT_EQ(rank0.at("records_passed"), 32);
  EXPECT_EQ(rank0.at("world_size"), 2);
  {
    std::ifstream shard(paths[2]);
    shard.seekg(rank0.at("byte_offset").get<int64_t>());
    std::string line;
    std::getline(shard, line);
    // Shard 2 holds ids 20-41: the 20th record of it is id 39.
    EXPECT_EQ(nlohmann::json::parse(line).at("id"), 39) << "the byte offset is the next record's";
  }
  EXPECT_EQ(rank1.at("steps_done"), 8);
  EXPECT_EQ(rank1.at("shard"), 4) << "past its last shard";
  EXPECT_EQ(rank1.at("records_passed"), 10);
  EXPECT_EQ(rank1.at("rank"), 1);
  auto resumed =
      launch([&](int index) { return train_on_stream(paths, killed, 0, index); }, loader_ranks(2));
  ASSERT_EQ(resumed.size(), 2u);
  EXPECT_EQ(resumed[0][-1].item<float>(), 10) << "resumed after step 8 of 18";
  for (int r = 0; r < 2; ++r) {
    auto params = reference[r].narrow(0, 0, reference[r].size(0) - 1);
    auto again = resumed[r].narrow(0, 0, resumed[r].size(0) - 1);
    EXPECT_EQ(0, std::memcmp(params.data_ptr(), again.data_ptr(), params.nbytes()))
        << "rank " << r << ": the resumed run's parameters differ from the uninterrupted run's";
  }
}

TEST(StreamLoaderOnRanks, APositionSavedOnTwoProcessesIsRefusedOnOneWithTheFix) {
  ScratchDir dir;
  const auto paths = write_shards(dir.path, {6, 5});
  const std::string project = dir.path + "/run";
  auto run = [&](int processes) {
    launch(
        [&](int) {
          Accelerator acc(AcceleratorOptions().project_dir(project));
          auto loader = acc.prepare(make_stream_loader(jsonl_files(paths, parse_id),
                                                       StreamLoaderOptions().batch_size(2)));
          if (processes == 1) {
            acc.load_state();
            return;
          }
          for (auto& batch : loader) {
            (void)batch;
            acc.save_state();
            break;
          }
        },
        loader_ranks(processes));
  };
  run(2);
  auto message = error_message([&] { run(1); });
  EXPECT_TRUE(contains(message, "saved by 2 process(es) with stream loaders") &&
              contains(message, "resume on 2 process(es)"))
      << message;
}
