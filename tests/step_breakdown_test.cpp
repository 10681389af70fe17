// The step-time breakdown: one process's steps split into data, forward+backward, all-reduce
// wait, optimizer and other, with each phase made slow on purpose and found where it belongs;
// the straggler rules on synthetic ranks; on two real ranks over loopback, the breakdown logged
// by rank 0 for both ranks and a rank made slow at loading data named as the straggler.
#include "accelerator/step_breakdown.h"

#include <accelerant/accelerant.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "test_support.h"

using namespace accelerant;
using accelerant::detail::StepPhase;
using accelerant::detail::StepTime;
using accelerant::testing::contains;
using accelerant::testing::error_message;
using accelerant::testing::ScratchDir;

namespace {

void sleep_ms(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

// 64 samples of 8 features; get() sleeps `get_ms` per sample (a slow loader).
struct SlowDataset {
  int get_ms = 0;
  Batch get(size_t i) const {
    if (get_ms > 0) sleep_ms(get_ms);
    auto x = torch::full({8}, static_cast<float>(i % 5) / 5);
    return Batch{x, torch::tensor(static_cast<int64_t>(i % 3))};
  }
  std::optional<size_t> size() const { return 64; }
};

// A linear layer whose forward sleeps `forward_ms` (a slow model).
struct SlowNetImpl : torch::nn::Module {
  explicit SlowNetImpl(int forward_ms) : forward_ms(forward_ms) {
    torch::manual_seed(0);
    fc = register_module("fc", torch::nn::Linear(8, 3));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    if (forward_ms > 0) sleep_ms(forward_ms);
    return fc(x);
  }
  int forward_ms;
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(SlowNet);

struct Slowness {
  int get_ms = 0;      // per sample, in the loader
  int forward_ms = 0;  // per step, in forward
  int between_ms = 0;  // per step, after the optimizer step (the user's code)
};

// Trains `steps` optimizer steps of batch 2 under `acc`.
void train(Accelerator& acc, const Slowness& slow, int steps) {
  SlowNet net(slow.forward_ms);
  torch::optim::SGD sgd(net->parameters(), 0.1);
  auto model = acc.prepare(net);
  auto optimizer = acc.prepare(sgd);
  auto loader =
      acc.prepare(make_data_loader(SlowDataset{slow.get_ms}, DataLoaderOptions().batch_size(2)));
  int done = 0;
  while (done < steps) {
    for (auto& batch : loader) {
      optimizer.zero_grad();
      acc.backward(torch::nn::functional::cross_entropy(model->forward(batch.data), batch.target));
      optimizer.step();
      if (slow.between_ms > 0) sleep_ms(slow.between_ms);
      if (++done == steps) break;
    }
  }
}

double ms(double seconds) { return seconds * 1e3; }

// A rank's step from its phases in milliseconds.
StepTime step_time(double data, double compute, double all_reduce, double optimizer, double other) {
  StepTime t;
  t.phase = {data / 1e3, compute / 1e3, all_reduce / 1e3, optimizer / 1e3, other / 1e3};
  t.step = (data + compute + all_reduce + optimizer + other) / 1e3;
  return t;
}

}  // namespace

TEST(StepBreakdown, EachSlowPhaseIsFoundWhereItBelongs) {
  // Sleeps far above the steps' own cost (a linear layer of 8x3): lower bounds hold on a busy
  // machine, and the upper bounds only say that the time did not land in another phase.
  Accelerator acc(AcceleratorOptions().cpu(true).step_breakdown_every(5));
  reset_metrics();
  train(acc, {/*get_ms=*/4, /*forward_ms=*/12, /*between_ms=*/6}, 11);
  const MetricsSnapshot m = metrics();
  EXPECT_EQ(m.timed_optimizer_steps, 10) << "the first step has no known start";
  const StepTimeMetrics& t = m.step_time;
  EXPECT_GE(ms(t.data), 8) << "2 samples of 4 ms";
  EXPECT_LT(ms(t.data), 12 + 8);
  EXPECT_GE(ms(t.forward_backward), 12);
  EXPECT_GE(ms(t.other), 6);
  EXPECT_LT(ms(t.other), 12 + 6);
  EXPECT_GT(t.optimizer, 0);
  EXPECT_EQ(t.all_reduce, 0) << "one process: nothing to wait for";
  EXPECT_GE(ms(t.step), 8 + 12 + 6);
  ASSERT_EQ(m.step_time_by_rank.size(), 1u) << "an exchange every 5 steps, of one rank";
  EXPECT_EQ(m.straggler, -1);
  EXPECT_TRUE(contains(metrics_report(), "step time, median of the last 10 optimizer steps"))
      << metrics_report();
}

TEST(StepBreakdown, ASecondTrainingInTheSameProcessIsTimedToo) {
  // Each training has its own optimizer: the new one ends the steps, and an older Accelerator
  // still alive does not take the newer one's exchange away when it goes.
  auto first =
      std::make_unique<Accelerator>(AcceleratorOptions().cpu(true).step_breakdown_every(2));
  train(*first, {}, 3);
  Accelerator second(AcceleratorOptions().cpu(true).step_breakdown_every(2));
  first.reset();
  reset_metrics();
  train(second, {}, 5);
  const MetricsSnapshot m = metrics();
  EXPECT_EQ(m.timed_optimizer_steps, 4);
  EXPECT_EQ(m.step_time_by_rank_at, 4) << "the second training's exchange still runs (at 2, 4)";
}

TEST(StepBreakdown, TurnedOffItTimesNothing) {
  Accelerator acc(AcceleratorOptions().cpu(true).step_breakdown_every(0));
  reset_metrics();
  train(acc, {}, 6);
  EXPECT_EQ(metrics().timed_optimizer_steps, 0);
  EXPECT_FALSE(contains(metrics_report(), "step time"));
}

TEST(StepBreakdown, ANegativeIntervalIsRefusedWithTheFix) {
  const std::string message = error_message(
      [] { Accelerator acc(AcceleratorOptions().cpu(true).step_breakdown_every(-1)); });
  EXPECT_TRUE(contains(message, "step_breakdown_every is -1")) << message;
  EXPECT_TRUE(contains(message, "0 to turn")) << message;
}

TEST(Straggler, TheRankBusyLongestBeyondTheThresholdIsNamed) {
  // Rank 2 loads slowly; ranks 0 and 1 wait for it in the all-reduce, so every step is as long.
  std::vector<StepTime> ranks = {step_time(1, 10, 21, 1, 0), step_time(1, 10, 21, 1, 0),
                                 step_time(22, 10, 0, 1, 0)};
  ASSERT_EQ(accelerant::detail::find_straggler(ranks), 2);
  const std::string text = accelerant::detail::describe_straggler(ranks, 2);
  EXPECT_TRUE(contains(text, "rank 2 is 175% slower")) << text;  // busy 33 vs 12
  EXPECT_TRUE(contains(text, "waiting for data")) << text;
  EXPECT_TRUE(contains(text, "22.0 ms vs 1.0 ms")) << text;

  ranks[2] = step_time(1, 31, 0, 1, 0);  // slow in compute instead
  EXPECT_TRUE(contains(accelerant::detail::describe_straggler(ranks, 2), "compute")) << "compute";
  ranks[2] = step_time(1, 10, 0, 1, 21);  // slow in its own code between steps
  EXPECT_TRUE(contains(accelerant::detail::describe_straggler(ranks, 2), "between steps"));
}

TEST(Straggler, RanksWithinTheThresholdOrAloneHaveNone) {
  EXPECT_EQ(
      accelerant::detail::find_straggler({step_time(1, 10, 2, 1, 0), step_time(1, 11, 1, 1, 0)}),
      -1);
  // 19 % above the median of three: under the 20 % threshold.
  EXPECT_EQ(
      accelerant::detail::find_straggler(
          {step_time(0, 100, 0, 0, 0), step_time(0, 100, 0, 0, 0), step_time(0, 119, 0, 0, 0)}),
      -1);
  EXPECT_EQ(
      accelerant::detail::find_straggler(
          {step_time(0, 100, 0, 0, 0), step_time(0, 100, 0, 0, 0), step_time(0, 121, 0, 0, 0)}),
      2);
  EXPECT_EQ(accelerant::detail::find_straggler({step_time(50, 10, 0, 0, 0)}), -1);
  // Of two ranks, against the other one: 25 % slower is named, 15 % is not.
  EXPECT_EQ(
      accelerant::detail::find_straggler({step_time(0, 100, 25, 0, 0), step_time(0, 125, 0, 0, 0)}),
      1);
  EXPECT_EQ(
      accelerant::detail::find_straggler({step_time(0, 115, 0, 0, 0), step_time(0, 100, 15, 0, 0)}),
      -1);
}

TEST(Straggler, ADifferenceUnderAMillisecondPerStepIsNoStraggler) {
  // 50 % slower, but by 0.1 ms of a 0.3 ms step: scheduler jitter on shared cores, not a rank
  // worth a warning (this fired in clean runs of tiny steps before the floor).
  EXPECT_EQ(accelerant::detail::find_straggler(
                {step_time(0, 0.2, 0.1, 0, 0), step_time(0, 0.3, 0, 0, 0)}),
            -1);
  // The same ratio at 10 times the size is a millisecond longer per step: named.
  EXPECT_EQ(
      accelerant::detail::find_straggler({step_time(0, 2, 1, 0, 0), step_time(0, 3, 0, 0, 0)}), 1);
}

TEST(Straggler, TheWarningWaitsForTheSameRankAtTwoExchangesInARowAndNamesItOnce) {
  accelerant::detail::StragglerWarnings w;
  EXPECT_EQ(w.observe(1), -1) << "one window is not a pattern";
  EXPECT_EQ(w.observe(-1), -1);
  EXPECT_EQ(w.observe(1), -1) << "not in a row";
  EXPECT_EQ(w.observe(0), -1) << "another rank starts its own count";
  EXPECT_EQ(w.observe(0), 0) << "rank 0, slowest at two exchanges in a row";
  EXPECT_EQ(w.observe(0), -1) << "named once";
  EXPECT_EQ(w.observe(1), -1);
  EXPECT_EQ(w.observe(1), 1);
}

TEST(Straggler, TheScalarsNameEachRankAndPhaseInMilliseconds) {
  const TrackerScalars s = accelerant::detail::step_time_scalars(
      {step_time(1, 2, 0, 0.5, 0), step_time(0, 0, 0, 0, 0)}, -1);
  ASSERT_EQ(s.size(), 13u);
  EXPECT_EQ(s[0].first, "step_time/rank_0/data_ms");
  EXPECT_DOUBLE_EQ(s[0].second, 1.0);
  EXPECT_EQ(s[1].first, "step_time/rank_0/forward_backward_ms");
  EXPECT_EQ(s[3].first, "step_time/rank_0/optimizer_ms");
  EXPECT_DOUBLE_EQ(s[3].second, 0.5);
  EXPECT_EQ(s[5].first, "step_time/rank_0/step_ms");
  EXPECT_DOUBLE_EQ(s[5].second, 3.5);
  EXPECT_EQ(s[11].first, "step_time/rank_1/step_ms");
  EXPECT_EQ(s[12].first, "step_time/straggler");
  EXPECT_EQ(s[12].second, -1);
}

TEST(StepBreakdown, TwoRanksLogBothBreakdownsAndNameTheRankSlowAtLoadingData) {
  ScratchDir dir;
  auto results = launch(
      [&](int rank) {
        Accelerator acc(AcceleratorOptions()
                            .cpu(true)
                            .project_dir(dir.path)
                            .log_with({"jsonl"})
                            .step_breakdown_every(4));
        acc.init_trackers("run");
        reset_metrics();
        // Rank 0 prints the warning: kept in a file to check below.
        if (rank == 0 && !std::freopen((dir.path + "/rank0.err").c_str(), "w", stderr)) {
          throw std::runtime_error("cannot redirect stderr");
        }
        // Rank 1's loader takes 10 ms per sample; rank 0 waits for it in the all-reduce.
        train(acc, {rank == 1 ? 10 : 0, 0, 0}, 13);
        std::fflush(stderr);
        const MetricsSnapshot m = metrics();
        std::vector<double> out{static_cast<double>(m.straggler),
                                static_cast<double>(m.step_time_by_rank.size())};
        for (const auto& r : m.step_time_by_rank) out.insert(out.end(), {r.data, r.all_reduce});
        acc.end_training();
        return torch::tensor(out, torch::kFloat64);
      },
      LaunchOptions()
          .processes_per_node(2)
          .collective_timeout(std::chrono::seconds(60))
          .verbose(false));
  ASSERT_EQ(results.size(), 2u);
  for (const auto& r : results) {
    ASSERT_EQ(r.numel(), 6) << "both ranks hold both ranks' breakdown";
    EXPECT_EQ(r[0].item<double>(), 1) << "rank 1 is the straggler, on every rank";
    EXPECT_GE(ms(r[2 + 2].item<double>()), 20) << "rank 1 waits for data (2 samples of 10 ms)";
    EXPECT_LT(ms(r[2].item<double>()), 10) << "rank 0 does not";
    EXPECT_GE(ms(r[3].item<double>()), 10) << "rank 0 waits for rank 1 in the all-reduce";
  }
  EXPECT_TRUE(torch::equal(results[0], results[1])) << "the same table on both ranks";

  // Rank 0 logged both ranks' breakdown at each exchange, at the optimizer steps that are
  // multiples of 4 (4 over steps 2-4, the first step being untimed; 8; 12), as a user's own
  // logging counts them.
  std::ifstream in(dir.path + "/run/scalars.jsonl");
  ASSERT_TRUE(in) << "rank 0's JSON Lines tracker";
  std::vector<int64_t> steps;
  std::string line;
  while (std::getline(in, line)) {
    const auto record = nlohmann::json::parse(line);
    if (!record.contains("values")) continue;
    const auto& values = record.at("values");
    if (!values.contains("step_time/rank_1/data_ms")) continue;
    steps.push_back(record.at("step").get<int64_t>());
    EXPECT_GE(values.at("step_time/rank_1/data_ms").get<double>(), 20);
    EXPECT_GE(values.at("step_time/rank_0/all_reduce_ms").get<double>(), 10);
    EXPECT_EQ(values.at("step_time/straggler").get<double>(), 1);
    for (const char* tag : {"step_time/rank_0/forward_backward_ms", "step_time/rank_0/optimizer_ms",
                            "step_time/rank_0/other_ms", "step_time/rank_1/step_ms"})
      EXPECT_TRUE(values.contains(tag)) << tag;
  }
  EXPECT_EQ(steps, (std::vector<int64_t>{4, 8, 12}));

  // Slowest at the exchanges of steps 4 and 8: named once, at the second.
  std::ifstream err(dir.path + "/rank0.err");
  const std::string printed((std::istreambuf_iterator<char>(err)),
                            std::istreambuf_iterator<char>());
  const std::string warning = "accelerant: warning: rank 1 is ";
  ASSERT_NE(printed.find(warning), std::string::npos) << printed;
  EXPECT_EQ(printed.find(warning, printed.find(warning) + 1), std::string::npos) << "named once:\n"
                                                                                 << printed;
  EXPECT_TRUE(contains(printed, "waiting for data")) << printed;
  EXPECT_TRUE(contains(printed,
                       "the slowest at the last 2 step-time exchanges, the latest over "
                       "steps 5-8"))
      << printed;
}
