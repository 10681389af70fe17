// Graph mode on the CPU: a compiled step trains exactly as the eager loop, every new input shape
// is counted (and warned about past the threshold, naming what changed), step closures run after
// their step in order, bucketed padding bounds the recompiles that dynamic padding causes, and
// ACCELERANT_METRICS=1 makes every forked worker print its report as it exits.
#include <accelerant/accelerant.h>
#include <gtest/gtest.h>

#include <random>

#include "test_support.h"

using namespace accelerant;

namespace {

using accelerant::testing::contains;
using accelerant::testing::small_mlp;

using accelerant::testing::flat_parameters;

GraphStep::Outputs train_step(torch::nn::Sequential& model, torch::optim::Optimizer& optimizer,
                              const GraphStep::Inputs& in) {
  optimizer.zero_grad();
  auto loss = torch::nn::functional::cross_entropy(model->forward(in[0]), in[1]);
  loss.backward();
  optimizer.step();
  return {loss.detach()};
}

// A GraphStep that only records the shapes it was given.
GraphStep shape_counter(const std::string& name, int warn_after = 8) {
  return GraphStep([](const GraphStep::Inputs& in) { return GraphStep::Outputs{in[0].sum()}; },
                   GraphStepOptions().name(name).recompile_warning_after(warn_after));
}

const GraphStepMetrics& metrics_of(const MetricsSnapshot& snapshot, const std::string& name) {
  for (const auto& s : snapshot.steps) {
    if (s.name == name) return s;
  }
  throw std::runtime_error("no metrics for " + name);
}

}  // namespace

TEST(GraphStep, ACompiledStepTrainsExactlyAsTheEagerLoop) {
  torch::manual_seed(11);
  std::vector<torch::Tensor> xs, ys;
  for (int i = 0; i < 12; ++i) {
    xs.push_back(torch::randn({4 + (i % 3) * 2, 8}));  // three shapes
    ys.push_back(torch::randint(0, 3, {xs.back().size(0)}, torch::kLong));
  }
  auto eager = small_mlp();
  torch::optim::SGD eager_sgd(eager->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  std::vector<float> eager_losses;
  for (int i = 0; i < 12; ++i)
    eager_losses.push_back(train_step(eager, eager_sgd, {xs[i], ys[i]})[0].item<float>());

  auto compiled = small_mlp();
  torch::optim::SGD sgd(compiled->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  GraphStep step([&](const GraphStep::Inputs& in) { return train_step(compiled, sgd, in); });
  std::vector<float> losses;
  for (int i = 0; i < 12; ++i) losses.push_back(step({xs[i], ys[i]})[0].item<float>());
  EXPECT_TRUE(torch::equal(flat_parameters(*compiled), flat_parameters(*eager)));
  EXPECT_FALSE(torch::equal(flat_parameters(*compiled), flat_parameters(*small_mlp())))
      << "nothing trained";
  EXPECT_EQ(step.signatures(), 3);
  EXPECT_EQ(losses, eager_losses) << "the step's outputs are the eager step's";
}

TEST(GraphStep, EveryNewShapeIsACaptureAndKnownShapesAreCacheHits) {
  reset_metrics();
  auto step = shape_counter("counting");
  for (int64_t rows : {4, 4, 4, 6, 6, 4, 9}) step({torch::ones({rows, 8})});
  const auto m = metrics_of(metrics(), "counting");
  EXPECT_EQ(m.steps, 7);
  EXPECT_EQ(m.captures, 3);
  EXPECT_EQ(m.cache_hits, 4);
  EXPECT_EQ(m.replays, 4);
  EXPECT_EQ(m.mode, "eager");
  EXPECT_EQ(m.timed_steps, 7);
  EXPECT_GE(m.step_p99, m.step_p50);
  ASSERT_EQ(m.signatures.size(), 3u);
  EXPECT_EQ(m.signatures[0], "Float[4, 8]");
  EXPECT_EQ(m.signatures[2], "Float[9, 8]");
  EXPECT_EQ(step.signatures(), 3);
  // A dtype is part of the signature too.
  step({torch::ones({4, 8}, torch::kDouble)});
  EXPECT_EQ(metrics_of(metrics(), "counting").captures, 4);
  const std::string report = metrics_report();
  EXPECT_TRUE(
      contains(report, "step 'counting' (eager): 8 steps, 4 captures (3 recompiles), 4 cache hits"))
      << report;
  EXPECT_TRUE(contains(report, "signature 4: Double[4, 8]")) << report;
}

TEST(GraphStep, BeyondTheThresholdEachNewShapeIsWarnedAboutNamingWhatChanged) {
  auto step = shape_counter("warned", 2);
  ::testing::internal::CaptureStderr();
  step({torch::ones({4, 8}), torch::zeros({4}, torch::kLong)});
  step({torch::ones({5, 8}), torch::zeros({5}, torch::kLong)});
  step({torch::ones({4, 8}), torch::zeros({4}, torch::kLong)});  // known: no warning
  const std::string quiet = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(quiet, "") << "warned before the threshold";
  ::testing::internal::CaptureStderr();
  step({torch::ones({4, 12}), torch::zeros({4}, torch::kLong)});
  const std::string warned = ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE(
      contains(warned, "graph step 'warned' met its input signature number 3 (a recompile)"))
      << warned;
  EXPECT_TRUE(contains(warned, "input 0 Float[4, 8] -> Float[4, 12]")) << warned;
  EXPECT_FALSE(contains(warned, "input 1")) << "the unchanged input is not named: " << warned;
  EXPECT_TRUE(contains(warned, "pad_to_bucket")) << "the fix is named: " << warned;
}

TEST(GraphStep, ABatchKeysTheCacheByEveryTensorAndItsName) {
  auto step = shape_counter("batches", 100);
  auto batch = [](int64_t mask_length) {
    return Batch{torch::ones({4, 8}), torch::zeros({4}, torch::kLong)}.set(
        "mask", torch::ones({4, mask_length}, torch::kBool));
  };
  step(batch(8));
  step(batch(8));  // the same shapes: a cache hit
  EXPECT_EQ(step.signatures(), 1);
  step(batch(16));  // only the third tensor differs
  EXPECT_EQ(step.signatures(), 2) << "the third tensor's shape is not in the cache key";
  Batch renamed{torch::ones({4, 8}), torch::zeros({4}, torch::kLong)};
  renamed.set("lengths", torch::ones({4, 8}, torch::kBool));  // batch(8)'s shapes, another name
  step(renamed);
  EXPECT_EQ(step.signatures(), 3) << "the names are not in the cache key";
  const auto m = metrics_of(metrics(), "batches");
  ASSERT_EQ(m.signatures.size(), 3u);
  EXPECT_EQ(m.signatures[0], "data Float[4, 8]; target Long[4]; mask Bool[4, 8]");
}

TEST(GraphStep, StepClosuresRunAfterTheirStepInTheOrderAdded) {
  std::vector<std::string> events;
  int k = 0;
  GraphStep step([&](const GraphStep::Inputs& in) {
    const int mine = k++;
    events.push_back("step " + std::to_string(mine));
    auto value = in[0].sum();
    add_step_closure([&events, mine] { events.push_back(std::to_string(mine) + ".a"); });
    add_step_closure([&events, mine, value] {
      events.push_back(std::to_string(mine) +
                       ".b=" + std::to_string(static_cast<int>(value.item<float>())));
    });
    events.push_back("step " + std::to_string(mine) + " returns");
    return GraphStep::Outputs{value};
  });
  step({torch::ones({2})});
  step({torch::ones({3})});
  const std::vector<std::string> expected = {"step 0", "step 0 returns", "0.a", "0.b=2",
                                             "step 1", "step 1 returns", "1.a", "1.b=3"};
  EXPECT_EQ(events, expected);
}

TEST(GraphStep, AThrowingClosureDoesNotStopTheOthersAndItsErrorArrives) {
  std::vector<int> ran;
  add_step_closure([&] { ran.push_back(1); });
  add_step_closure([] { throw std::runtime_error("closure failed"); });
  add_step_closure([&] { ran.push_back(3); });
  EXPECT_THROW(
      {
        try {
          mark_step();
        } catch (const std::runtime_error& e) {
          EXPECT_STREQ(e.what(), "closure failed");
          throw;
        }
      },
      std::runtime_error);
  EXPECT_EQ(ran, (std::vector<int>{1, 3}));
  mark_step();  // nothing left
  EXPECT_EQ(ran.size(), 2u);
}

TEST(StaticShapes, PaddingGivesValuesMaskAndLengths) {
  std::vector<torch::Tensor> seqs{torch::tensor({1, 2, 3}, torch::kLong),
                                  torch::tensor({4}, torch::kLong)};
  auto fixed = pad_to_length(seqs, 5, 9);
  EXPECT_TRUE(
      torch::equal(fixed.values, torch::tensor({{1, 2, 3, 9, 9}, {4, 9, 9, 9, 9}}, torch::kLong)));
  EXPECT_TRUE(
      torch::equal(fixed.mask, torch::tensor({{1, 1, 1, 0, 0}, {1, 0, 0, 0, 0}}).to(torch::kBool)));
  EXPECT_TRUE(torch::equal(fixed.lengths, torch::tensor({3, 1}, torch::kLong)));
  EXPECT_EQ(pad_to_longest(seqs).values.size(1), 3);
  EXPECT_EQ(pad_to_bucket(seqs, {2, 4, 8}).values.size(1), 4);
  EXPECT_EQ(pad_to_length(seqs, 2, 0, /*truncate=*/true).lengths[0].item<int64_t>(), 2);
  EXPECT_EQ(bucket_lengths(128, 4), (std::vector<int64_t>{32, 64, 96, 128}));
  EXPECT_EQ(bucket_lengths(100, 3), (std::vector<int64_t>{40, 72, 100}));
}

TEST(StaticShapes, BadInputIsRefusedWithTheFix) {
  std::vector<torch::Tensor> seqs{torch::ones({7}, torch::kLong)};
  auto message = accelerant::testing::error_message;
  EXPECT_TRUE(contains(message([&] { pad_to_length(seqs, 5); }),
                       "sequence 0 has 7 elements, more than the length 5"));
  EXPECT_TRUE(contains(message([&] {
                         pad_to_bucket(seqs, {2, 4});
                       }),
                       "add a bucket of at least 7"));
  EXPECT_TRUE(contains(message([&] { pad_to_bucket(seqs, {8, 4}); }), "positive and ascending"));
  EXPECT_TRUE(contains(message([&] { pad_to_longest({}); }), "no sequences"));
  EXPECT_TRUE(contains(message([&] {
                         pad_to_longest({torch::ones({2, 2})});
                       }),
                       "must be a 1-D tensor"));
  EXPECT_TRUE(contains(message([&] {
                         pad_to_longest({torch::ones({2}), torch::ones({2}, torch::kLong)});
                       }),
                       "convert them to one dtype"));
}

TEST(StaticShapes, BucketsBoundTheRecompilesThatDynamicPaddingCauses) {
  std::mt19937 rng(5);
  std::uniform_int_distribution<int64_t> length(5, 120);
  std::vector<std::vector<torch::Tensor>> batches(60);
  for (auto& batch : batches) {
    for (int i = 0; i < 8; ++i) batch.push_back(torch::ones({length(rng)}, torch::kLong));
  }
  auto signatures =
      [&](const std::function<PaddedSequences(const std::vector<torch::Tensor>&)>& collate) {
        auto step = shape_counter("collate", 1000);
        for (const auto& batch : batches) {
          auto padded = collate(batch);
          step({padded.values, padded.mask});
        }
        return step.signatures();
      };
  const auto buckets = bucket_lengths(128, 4);
  const int64_t dynamic = signatures([](const auto& b) { return pad_to_longest(b); });
  const int64_t bucketed = signatures([&](const auto& b) { return pad_to_bucket(b, buckets); });
  const int64_t fixed = signatures([](const auto& b) { return pad_to_length(b, 128); });
  EXPECT_GT(dynamic, 15) << "dynamic padding should give many shapes";
  EXPECT_LE(bucketed, 4);
  EXPECT_EQ(fixed, 1);
}

TEST(Metrics, EachForkedWorkerPrintsItsReportAtExitWhenAsked) {
  ::setenv("ACCELERANT_METRICS", "1", 1);
  ::testing::internal::CaptureStderr();
  launch(
      [](int) {
        auto step = shape_counter("worker");
        step({torch::ones({2, 3})});
        step({torch::ones({2, 3})});
      },
      LaunchOptions().processes_per_node(2).collective_timeout(std::chrono::seconds(60)));
  const std::string out = ::testing::internal::GetCapturedStderr();
  ::unsetenv("ACCELERANT_METRICS");
  size_t reports = 0;
  for (size_t at = out.find("Accelerant metrics report"); at != std::string::npos;
       at = out.find("Accelerant metrics report", at + 1)) {
    ++reports;
  }
  EXPECT_EQ(reports, 2u) << out;
  EXPECT_TRUE(
      contains(out, "step 'worker' (eager): 2 steps, 1 captures (0 recompiles), 1 cache hits"))
      << out;
}
