// Collectives between real forked ranks over loopback: exact results on 2 and 4 processes.
#include <accelerant/accelerant.h>
#include <gtest/gtest.h>

using namespace accelerant;

namespace {

LaunchOptions ranks(int n) {
  return LaunchOptions().processes_per_node(n).timeout(std::chrono::seconds(60)).verbose(false);
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
        comm.broadcast_(from_last, comm.size() - 1);
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
