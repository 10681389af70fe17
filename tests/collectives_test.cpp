// Collectives between real forked ranks over loopback: exact results on 2 and 4 processes, the
// sharded ones (reduce_scatter, all_gather) with the shared-memory path on and off.
#include <accelerant/accelerant.h>
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "test_support.h"

using namespace accelerant;
using accelerant::testing::contains;

namespace {

LaunchOptions ranks(int n) {
  return LaunchOptions()
      .processes_per_node(n)
      .collective_timeout(std::chrono::seconds(60))
      .verbose(false);
}

}  // namespace

class CollectivesOnRanks : public ::testing::TestWithParam<int> {};

TEST_P(CollectivesOnRanks, AllReduceSumMeanMaxMinAreExact) {
  const int n = GetParam();
  auto results = launch(
      [](int index) {
        auto& comm = ProcessState::get().communicator();
        auto mine = torch::arange(6, torch::kFloat) * (index + 1);
        auto ints = torch::arange(6, torch::kLong) * (index + 1);
        return torch::stack(
            {comm.all_reduce(mine, ReduceOp::kSum), comm.all_reduce(mine, ReduceOp::kMean),
             comm.all_reduce(mine, ReduceOp::kMax), comm.all_reduce(mine, ReduceOp::kMin),
             comm.all_reduce(ints, ReduceOp::kSum).to(torch::kFloat)});
      },
      ranks(n));
  ASSERT_EQ(results.size(), static_cast<size_t>(n));
  const auto base = torch::arange(6, torch::kFloat);
  const double total = n * (n + 1) / 2.0;
  for (const auto& r : results) {
    EXPECT_TRUE(torch::equal(r[0], base * total));
    EXPECT_TRUE(torch::allclose(r[1], base * total / n));
    EXPECT_TRUE(torch::equal(r[2], base * n));
    EXPECT_TRUE(torch::equal(r[3], base));
    EXPECT_TRUE(torch::equal(r[4], base * total));
  }
}

TEST_P(CollectivesOnRanks, Bf16AllReduceTravelsAsFp32AndStaysBf16) {
  const int n = GetParam();
  auto results = launch(
      [](int index) {
        auto& comm = ProcessState::get().communicator();
        auto t = torch::full({3}, 0.5 * (index + 1), torch::kBFloat16);
        auto sum = comm.all_reduce(t, ReduceOp::kSum);
        comm.all_reduce_(t, ReduceOp::kMax);  // in place too
        return torch::stack({sum.to(torch::kFloat), t.to(torch::kFloat),
                             torch::full({3}, sum.scalar_type() == torch::kBFloat16 ? 1.0 : 0.0)});
      },
      ranks(n));
  for (const auto& r : results) {
    EXPECT_TRUE(torch::equal(r[0], torch::full({3}, 0.5 * n * (n + 1) / 2.0)));
    EXPECT_TRUE(torch::equal(r[1], torch::full({3}, 0.5 * n)));
    EXPECT_TRUE(torch::equal(r[2], torch::ones({3})));
  }
}

TEST_P(CollectivesOnRanks, GatherConcatenatesUnequalLengthsInRankOrder) {
  const int n = GetParam();
  auto results = launch(
      [](int index) {
        auto& comm = ProcessState::get().communicator();
        // Rank r contributes r + 1 rows of value r.
        return comm.gather(torch::full({index + 1, 3}, static_cast<float>(index)));
      },
      ranks(n));
  std::vector<torch::Tensor> expected_parts;
  for (int r = 0; r < n; ++r)
    expected_parts.push_back(torch::full({r + 1, 3}, static_cast<float>(r)));
  const auto expected = torch::cat(expected_parts);
  for (const auto& r : results) EXPECT_TRUE(torch::equal(r, expected)) << r;
}

TEST_P(CollectivesOnRanks, BroadcastTensorsStringsAndNumbers) {
  const int n = GetParam();
  auto results = launch(
      [n](int index) {
        auto& comm = ProcessState::get().communicator();
        const int src = n - 1;
        auto t = torch::full({2, 2}, static_cast<float>(index));
        comm.broadcast_(t, src);
        auto b = torch::full({2}, static_cast<float>(index), torch::kBFloat16);
        comm.broadcast_(b, src);
        std::string text =
            comm.broadcast_value(std::string(index == src ? "from the last rank" : "x"), src);
        double number = comm.broadcast_value(index == src ? 2.5 : -1.0, src);
        std::string empty = comm.broadcast_bytes(index == 0 ? "" : "ignored", 0);
        comm.barrier();
        return t.sum().item<double>() + b.sum().item<double>() + number +
               (text == "from the last rank" ? 1000 : 0) + (empty.empty() ? 10000 : 0);
      },
      ranks(n));
  const double expected = 4.0 * (n - 1) + 2.0 * (n - 1) + 2.5 + 1000 + 10000;
  for (double r : results) EXPECT_DOUBLE_EQ(r, expected);
}

TEST_P(CollectivesOnRanks, PadAcrossProcessesAndSplitBetweenProcesses) {
  const int n = GetParam();
  auto results = launch(
      [](int index) {
        auto& state = ProcessState::get();
        auto padded = state.communicator().pad_across_processes(torch::ones({index + 1}), 0, -1.0);
        std::vector<int64_t> items(10);
        for (int i = 0; i < 10; ++i) items[i] = i;
        auto share = state.split_between_processes(items);
        auto padded_share = state.split_between_processes(items, /*apply_padding=*/true);
        return torch::cat({padded, torch::tensor(share).to(torch::kFloat),
                           torch::tensor({static_cast<float>(padded_share.size())})});
      },
      ranks(n));
  std::vector<float> all_items;
  for (int r = 0; r < n; ++r) {
    auto row = results[r];
    auto padded = row.narrow(0, 0, n);
    EXPECT_EQ(padded.sum().item<float>(), (r + 1) - (n - r - 1)) << "rank " << r;
    const int base = 10 / n, extra = 10 % n;
    const int count = base + (r < extra ? 1 : 0);
    ASSERT_EQ(row.size(0), n + count + 1);
    for (int i = 0; i < count; ++i) all_items.push_back(row[n + i].item<float>());
    EXPECT_EQ(row[n + count].item<float>(), base + (extra ? 1 : 0));
  }
  ASSERT_EQ(all_items.size(), 10u);  // every item exactly once, in order
  for (int i = 0; i < 10; ++i) EXPECT_EQ(all_items[i], i);
}

TEST_P(CollectivesOnRanks, BoolTensorsGatherAndBroadcastThoughGlooHasNoBool) {
  const int n = GetParam();
  auto results = launch(
      [](int index) {
        auto& comm = ProcessState::get().communicator();
        auto flags = torch::tensor({index % 2 == 0, true, false});  // e.g. "prediction correct"
        auto gathered = comm.gather(flags);
        auto from_last = torch::tensor({index == 0, index != 0});
        comm.broadcast_(from_last, comm.world_size() - 1);
        return torch::cat({gathered.to(torch::kLong), from_last.to(torch::kLong),
                           torch::tensor({gathered.scalar_type() == torch::kBool ? 1L : 0L})});
      },
      ranks(n));
  for (const auto& r : results) {
    for (int rank = 0; rank < n; ++rank) {
      EXPECT_EQ(r[3 * rank].item<int64_t>(), rank % 2 == 0 ? 1 : 0);
      EXPECT_EQ(r[3 * rank + 1].item<int64_t>(), 1);
      EXPECT_EQ(r[3 * rank + 2].item<int64_t>(), 0);
    }
    EXPECT_EQ(r[3 * n].item<int64_t>(), 0);  // rank n-1's {false, true}
    EXPECT_EQ(r[3 * n + 1].item<int64_t>(), 1);
    EXPECT_EQ(r[3 * n + 2].item<int64_t>(), 1);  // still bool
  }
}

INSTANTIATE_TEST_SUITE_P(TwoAndFour, CollectivesOnRanks, ::testing::Values(2, 4));

TEST(Collectives, SingleProcessCollectivesReturnTheInput) {
  Communicator comm;
  auto t = torch::arange(4, torch::kFloat);
  EXPECT_TRUE(torch::equal(comm.all_reduce(t, ReduceOp::kMean), t));
  EXPECT_TRUE(torch::equal(comm.gather(t), t));
  EXPECT_EQ(comm.broadcast_value(std::string("same"), 0), "same");
  comm.barrier();
}

TEST(Collectives, MeanOfIntegersIsAClearError) {
  Communicator comm;
  auto t = torch::arange(4, torch::kLong);
  try {
    comm.all_reduce(t, ReduceOp::kMean);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("needs a floating-point tensor, got Long"),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("Fix:"), std::string::npos);
  }
}

TEST(Collectives, BadArgumentsAreClearErrors) {
  Communicator comm;
  try {
    comm.broadcast_bytes("x", 3);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("src 3 is not a rank of this world of 1 processes"),
              std::string::npos)
        << e.what();
  }
  try {
    comm.pad_across_processes(torch::ones({2, 2}), 5);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("dim 5 is out of range for a tensor of shape [2, 2]"),
              std::string::npos)
        << e.what();
  }
}

// Reduce-scatter and all-gather (issue 23, ZeRO): on 2 and 4 ranks, with the shared-memory path
// on and off. Each rank checks its own results against what it computes from every rank's input
// (each rank can make any rank's input from its seed) and returns what differed, "" when nothing.
namespace {

// Integer values: sums are exact in float whatever the order the transport adds in.
torch::Tensor input_of(int rank, int64_t n, torch::ScalarType dtype) {
  torch::manual_seed(100 + rank);
  return torch::randint(-1000, 1000, {n}, torch::kLong).to(dtype);
}

// Rank r's expected shard of the reduction of every rank's input.
torch::Tensor expected_shard(int n, int r, int64_t shard, torch::ScalarType dtype, ReduceOp op) {
  std::vector<torch::Tensor> all;
  for (int q = 0; q < n; ++q)
    all.push_back(input_of(q, n * shard, dtype).narrow(0, r * shard, shard));
  auto stacked = torch::stack(all);
  switch (op) {
    case ReduceOp::kMax:
      return std::get<0>(stacked.max(0));
    case ReduceOp::kMin:
      return std::get<0>(stacked.min(0));
    case ReduceOp::kMean:
      return stacked.sum(0).div(n);
    default:
      return stacked.sum(0);
  }
}

// Sizes of one shard: one element, odd, and (with the 256 KiB default slot) more than one step.
const std::vector<int64_t> kShards = {1, 7, 70001};

std::string mismatch(const std::string& what, const torch::Tensor& got,
                     const torch::Tensor& expected) {
  if (got.scalar_type() == expected.scalar_type() && torch::equal(got, expected)) return "";
  return what + " differs; ";
}

std::string path_mismatch(bool shm_expected) {
  const bool shm = ProcessState::get().communicator().shared_memory_all_reduce();
  return shm == shm_expected ? "" : "the shared-memory setting was not applied; ";
}

}  // namespace

class ShardedCollectives : public ::testing::TestWithParam<std::tuple<int, bool>> {
 protected:
  // Runs fn on GetParam() ranks with the shared-memory path on or off; each rank's string.
  std::vector<std::string> run(std::function<std::string(int, int, bool)> fn) {
    const auto [n, shm] = GetParam();
    ::setenv("ACCELERANT_SHM_ALLREDUCE", shm ? "1" : "0", 1);
    auto results = launch([&, n = n, shm = shm](int index) { return fn(index, n, shm); }, ranks(n));
    ::unsetenv("ACCELERANT_SHM_ALLREDUCE");
    return results;
  }
};

TEST_P(ShardedCollectives, ReduceScatterSumMeanMaxMinAreExact) {
  auto results = run([](int index, int n, bool shm) {
    auto& comm = ProcessState::get().communicator();
    std::string wrong = path_mismatch(shm);
    for (int64_t shard : kShards) {
      const std::string at = "S=" + std::to_string(shard) + " ";
      for (auto dtype : {torch::kFloat, torch::kLong, torch::kDouble}) {
        const auto input = input_of(index, n * shard, dtype);
        const auto before = input.clone();
        for (auto op : {ReduceOp::kSum, ReduceOp::kMean, ReduceOp::kMax, ReduceOp::kMin}) {
          if (op == ReduceOp::kMean && dtype == torch::kLong) continue;
          auto out = torch::full({shard}, -7, dtype);
          comm.reduce_scatter_(input, out, op);
          wrong += mismatch(at + c10::toString(dtype) + " " + to_string(op), out,
                            expected_shard(n, index, shard, dtype, op));
        }
        wrong += mismatch(at + "input (must stay unchanged)", input, before);
      }
    }
    return wrong;
  });
  for (size_t r = 0; r < results.size(); ++r) EXPECT_EQ(results[r], "") << "rank " << r;
}

TEST_P(ShardedCollectives, AllGatherPutsEveryRanksInputInRankOrder) {
  auto results = run([](int index, int n, bool shm) {
    auto& comm = ProcessState::get().communicator();
    std::string wrong = path_mismatch(shm);
    for (int64_t shard : kShards) {
      for (auto dtype : {torch::kFloat, torch::kLong, torch::kBFloat16, torch::kBool}) {
        const std::string at = "S=" + std::to_string(shard) + " " + c10::toString(dtype);
        auto out = torch::zeros({n * shard}, dtype);
        comm.all_gather_(input_of(index, shard, dtype), out);
        std::vector<torch::Tensor> parts;
        for (int q = 0; q < n; ++q) parts.push_back(input_of(q, shard, dtype));
        wrong += mismatch(at, out, torch::cat(parts));
      }
    }
    // In place (what ZeRO's parameter all-gather does): the input is this rank's own part of the
    // output, and the peers' parts arrive around it.
    for (int64_t shard : kShards) {
      auto out = torch::full({n * shard}, -7.0f);
      auto own = out.narrow(0, index * shard, shard);
      own.copy_(input_of(index, shard, torch::kFloat));
      comm.all_gather_(own, out);
      std::vector<torch::Tensor> parts;
      for (int q = 0; q < n; ++q) parts.push_back(input_of(q, shard, torch::kFloat));
      wrong += mismatch("in place, S=" + std::to_string(shard), out, torch::cat(parts));
    }
    // Shapes do not matter, only element counts: [2, 3] from each rank into [n, 2, 3].
    auto grid = torch::arange(6, torch::kFloat).reshape({2, 3}) + 10 * index;
    auto out = torch::empty({n, 2, 3});
    comm.all_gather_(grid, out);
    for (int q = 0; q < n; ++q) {
      wrong += mismatch("[2, 3] into [n, 2, 3]", out[q],
                        torch::arange(6, torch::kFloat).reshape({2, 3}) + 10 * q);
    }
    return wrong;
  });
  for (size_t r = 0; r < results.size(); ++r) EXPECT_EQ(results[r], "") << "rank " << r;
}

// What a gradient reducer relies on: a shard from reduce_scatter is the same bits as the same
// elements of all_reduce, bf16 included. Magnitudes per rank make the summation order show.
TEST_P(ShardedCollectives, ReduceScatterEqualsAllReduceSlicedBitForBit) {
  auto results = run([](int index, int n, bool shm) {
    auto& comm = ProcessState::get().communicator();
    std::string wrong = path_mismatch(shm);
    for (int64_t shard : kShards) {
      torch::manual_seed(7 + index);
      const auto input = torch::randn({n * shard}) * std::pow(1000.0f, index);
      for (auto dtype : {torch::kFloat, torch::kBFloat16}) {
        const auto typed = input.to(dtype);
        for (auto op : {ReduceOp::kSum, ReduceOp::kMean, ReduceOp::kMax}) {
          auto out = torch::empty({shard}, dtype);
          comm.reduce_scatter_(typed, out, op);
          const auto all = comm.all_reduce(typed, op).narrow(0, index * shard, shard);
          wrong += mismatch(
              "S=" + std::to_string(shard) + " " + c10::toString(dtype) + " " + to_string(op), out,
              all);
        }
      }
    }
    return wrong;
  });
  for (size_t r = 0; r < results.size(); ++r) EXPECT_EQ(results[r], "") << "rank " << r;
}

// Started one after another with an all_reduce between them, waited for in reverse order: each
// finishes with its own result, so the kinds complete in submission order on every transport.
TEST_P(ShardedCollectives, AsyncCollectivesOverlapAndCompleteInSubmissionOrder) {
  auto results = run([](int index, int n, bool shm) {
    auto& comm = ProcessState::get().communicator();
    std::string wrong = path_mismatch(shm);
    const int64_t shard = 70001;
    const auto input = input_of(index, n * shard, torch::kFloat);
    auto shard_out = torch::empty({shard});
    auto summed = input_of(index, 1000, torch::kFloat);
    const auto gathered_in = input_of(index, shard, torch::kFloat);
    auto gathered = torch::empty({n * shard});
    auto mean_out = torch::empty({shard});
    auto a = comm.reduce_scatter_async_(input, shard_out, ReduceOp::kSum);
    auto b = comm.all_reduce_async_(summed, ReduceOp::kMax);
    auto c = comm.all_gather_async_(gathered_in, gathered);
    auto d = comm.reduce_scatter_async_(input, mean_out, ReduceOp::kMean);
    if (!a.pending() || !c.pending()) wrong += "an async call did not return a pending handle; ";
    auto busy = torch::randn({256, 256}).matmul(torch::randn({256, 256}));  // overlapped work
    d.wait();
    c.wait();
    b.wait();
    a.wait();
    wrong += mismatch("reduce_scatter sum", shard_out,
                      expected_shard(n, index, shard, torch::kFloat, ReduceOp::kSum));
    wrong += mismatch("reduce_scatter mean", mean_out,
                      expected_shard(n, index, shard, torch::kFloat, ReduceOp::kMean));
    std::vector<torch::Tensor> maxes, parts;
    for (int q = 0; q < n; ++q) {
      maxes.push_back(input_of(q, 1000, torch::kFloat));
      parts.push_back(input_of(q, shard, torch::kFloat));
    }
    wrong += mismatch("all_reduce max", summed, std::get<0>(torch::stack(maxes).max(0)));
    wrong += mismatch("all_gather", gathered, torch::cat(parts));
    return wrong + (busy.numel() == 65536 ? "" : "?");
  });
  for (size_t r = 0; r < results.size(); ++r) EXPECT_EQ(results[r], "") << "rank " << r;
}

INSTANTIATE_TEST_SUITE_P(RanksAndShm, ShardedCollectives,
                         ::testing::Combine(::testing::Values(2, 4), ::testing::Bool()),
                         [](const auto& info) {
                           return std::to_string(std::get<0>(info.param)) + "Ranks" +
                                  (std::get<1>(info.param) ? "SharedMemory" : "Gloo");
                         });

TEST(Collectives, SingleProcessReduceScatterAndAllGatherCopy) {
  Communicator comm;
  auto t = torch::arange(4, torch::kFloat);
  auto out = torch::empty({4});
  comm.reduce_scatter_(t, out, ReduceOp::kMean);
  EXPECT_TRUE(torch::equal(out, t));
  auto grid = torch::empty({2, 2});
  comm.all_gather_(t, grid);
  EXPECT_TRUE(torch::equal(grid.reshape({-1}), t));
  auto pending = comm.reduce_scatter_async_(t * 2, out);
  pending.wait();
  EXPECT_TRUE(torch::equal(out, t * 2));
}

TEST(Collectives, BadArgumentsOfReduceScatterAndAllGatherAreClearErrors) {
  auto results = launch(
      [](int) {
        auto& comm = ProcessState::get().communicator();
        auto message = [](const std::function<void()>& f) -> std::string {
          try {
            f();
          } catch (const Error& e) {
            return std::string(e.what()) + "\n";
          }
          return "no error\n";
        };
        std::string all;
        all += message([&] { comm.reduce_scatter_(torch::ones({10}), torch::empty({4})); });
        all += message([&] { comm.reduce_scatter_(torch::ones({9}), torch::empty({4})); });
        all += message([&] { comm.all_gather_(torch::ones({3}), torch::empty({5})); });
        all += message([&] { comm.reduce_scatter_(torch::ones({4, 2}).t(), torch::empty({4})); });
        all +=
            message([&] { comm.all_gather_(torch::ones({2}), torch::empty({4}, torch::kDouble)); });
        all += message([&] {
          comm.reduce_scatter_(torch::ones({4}, torch::kLong), torch::empty({2}, torch::kLong),
                               ReduceOp::kMean);
        });
        all += message([&] { comm.barrier(); });  // nothing above broke the communicator
        return all;
      },
      ranks(2));
  for (int r = 0; r < 2; ++r) {
    const std::string& m = results[r];
    const std::string prefix = "[rank " + std::to_string(r) + "/2] ";
    SCOPED_TRACE(m);
    EXPECT_TRUE(contains(m, prefix + "reduce_scatter_: input has 10 elements and output 4"));
    EXPECT_TRUE(contains(m, "world_size() * output.numel() = 2 * 4 = 8"));
    EXPECT_TRUE(contains(m, "Fix: output must have input.numel()/world_size() elements (5)"));
    EXPECT_TRUE(contains(m, "and input.numel() must be a multiple of world_size() = 2"));
    EXPECT_TRUE(contains(m, prefix + "all_gather_: input has 3 elements and output 5"));
    EXPECT_TRUE(contains(m, "Fix: output must have world_size() * input.numel() elements"));
    EXPECT_TRUE(contains(m, "input is not contiguous"));
    EXPECT_TRUE(contains(m, "input is Float but output is Double"));
    EXPECT_TRUE(contains(m, "mean needs a floating-point tensor, got Long"));
    EXPECT_TRUE(m.size() >= 9 && m.substr(m.size() - 9) == "no error\n") << "barrier failed";
  }
}

// Gloo's allgather divided by the payload's size: gather_bytes("") on every rank died of SIGFPE.
TEST(Collectives, EmptyPayloadsGatherOnEveryRank) {
  auto results = launch(
      [](int index) {
        auto& comm = ProcessState::get().communicator();
        std::string out;
        for (const auto& b : comm.gather_bytes("")) out += "[" + b + "]";
        for (const auto& b : comm.gather_bytes(index == 0 ? "" : "ab")) out += "[" + b + "]";
        auto empty = torch::empty({0});
        comm.all_gather_(empty, torch::empty({0}));
        comm.reduce_scatter_(empty, torch::empty({0}));
        out += std::to_string(comm.gather(torch::empty({0, 3})).size(0));
        return out;
      },
      ranks(2));
  for (const auto& r : results) EXPECT_EQ(r, "[][][][ab]0");
}
