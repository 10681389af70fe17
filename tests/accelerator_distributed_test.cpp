// The Accelerator on real forked processes over loopback: data-parallel training equals
// single-process training on the combined batch, accumulation equals a bigger batch, the
// all-reduce overlaps backward, gather_for_metrics returns exactly the dataset, a parameter
// without a gradient is named instead of hanging, a rank that built another model is named
// instead of aborting, and training without a prepared loader is said once.
#include <accelerant/accelerant.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <iterator>

#include "test_support.h"

using namespace accelerant;

namespace {

LaunchOptions ranks(int n) {
  return LaunchOptions()
      .processes_per_node(n)
      .collective_timeout(std::chrono::seconds(60))
      .verbose(false);
}

constexpr int64_t kSamples = 640;

// Trains an MLP on fixed data for `updates` optimizer steps with `batch` samples per process and
// micro-step; returns the final parameters, flattened. Every rank builds the model from a
// different seed, so equal results also show that prepare broadcast rank 0's weights.
torch::Tensor train_mlp(int index, int64_t batch, int64_t accumulation, int64_t updates,
                        int64_t bucket_mb) {
  Accelerator acc(
      AcceleratorOptions().gradient_accumulation_steps(accumulation).bucket_cap_mb(bucket_mb));
  torch::manual_seed(100 + index);
  auto model =
      torch::nn::Sequential(torch::nn::Linear(16, 32), torch::nn::Tanh(), torch::nn::Linear(32, 32),
                            torch::nn::Tanh(), torch::nn::Linear(32, 4));
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  torch::manual_seed(7);  // the same data on every rank
  auto x = torch::randn({kSamples, 16});
  auto y = torch::randint(0, 4, {kSamples}, torch::kLong);
  auto [m, o, l] =
      acc.prepare(model, sgd, make_data_loader(x, y, DataLoaderOptions().batch_size(batch)));
  int64_t micro = 0;
  for (auto& b : l) {
    if (micro++ == updates * accumulation) break;
    auto guard = acc.accumulate(m);
    acc.backward(torch::nn::functional::cross_entropy(m->forward(b.data), b.target));
    o.step();
    o.zero_grad();
  }
  return accelerant::testing::flat_parameters(*m);
}

double relative_difference(const torch::Tensor& a, const torch::Tensor& b) {
  return ((a - b).abs().max() / b.abs().max()).item<double>();
}

torch::Tensor single_process(int64_t batch, int64_t accumulation, int64_t updates) {
  auto results = launch(
      [=](int index) { return train_mlp(index, batch, accumulation, updates, 25); }, ranks(1));
  // The single process seeds its model with 100 + 0, as rank 0 does.
  return results.at(0);
}

}  // namespace

class AcceleratorOnRanks : public ::testing::TestWithParam<int> {};

TEST_P(AcceleratorOnRanks, DataParallelEqualsOneProcessWithTheCombinedBatch) {
  const int n = GetParam();
  const int64_t b = 8;
  auto reference = single_process(b * n, 1, 20);
  auto results = launch([=](int index) { return train_mlp(index, b, 1, 20, 25); }, ranks(n));
  ASSERT_EQ(results.size(), static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    EXPECT_LE(relative_difference(results[r], reference), 1e-5) << "rank " << r;
    EXPECT_TRUE(torch::equal(results[r], results[0])) << "ranks diverged: rank " << r;
  }
}

TEST_P(AcceleratorOnRanks, AccumulatingFourMicroBatchesEqualsOneBatchFourTimesBigger) {
  const int n = GetParam();
  const int64_t b = 4;
  auto reference = single_process(4 * b * n, 1, 10);
  auto results = launch([=](int index) { return train_mlp(index, b, 4, 10, 25); }, ranks(n));
  for (int r = 0; r < n; ++r)
    EXPECT_LE(relative_difference(results[r], reference), 1e-5) << "rank " << r;
}

INSTANTIATE_TEST_SUITE_P(Processes, AcceleratorOnRanks, ::testing::Values(2, 4));

TEST(AcceleratorDistributed, AccumulationCommunicatesOnlyOnTheLastMicroStep) {
  auto results = launch(
      [](int) {
        Accelerator acc(AcceleratorOptions().gradient_accumulation_steps(4));
        auto model = torch::nn::Sequential(torch::nn::Linear(8, 8));
        auto m = acc.prepare(model);
        for (int micro = 0; micro < 8; ++micro) {
          auto guard = acc.accumulate(m);
          acc.backward(m->forward(torch::randn({2, 8})).sum());
        }
        return acc.reducer_stats(m).reductions;
      },
      ranks(2));
  for (auto reductions : results) EXPECT_EQ(reductions, 2);
}

TEST(AcceleratorDistributed, TheFirstBucketIsReducedWhileBackwardStillRuns) {
  auto results = launch(
      [](int) {
        Accelerator acc(AcceleratorOptions().bucket_cap_mb(1));
        // Six 1 MiB layers: several buckets, filled from the last layer backwards.
        torch::nn::Sequential model;
        for (int i = 0; i < 6; ++i) model->push_back(torch::nn::Linear(512, 512));
        auto m = acc.prepare(model);
        acc.backward(m->forward(torch::randn({32, 512})).pow(2).mean());
        auto stats = acc.reducer_stats(m);
        return torch::tensor(
            {stats.buckets, stats.buckets_started_during_backward, stats.reductions});
      },
      ranks(2));
  for (const auto& r : results) {
    EXPECT_GE(r[0].item<int64_t>(), 3) << "expected several buckets";
    EXPECT_GE(r[1].item<int64_t>(), 1) << "no all-reduce started before backward ended";
    EXPECT_EQ(r[2].item<int64_t>(), 1);
  }
}

TEST(AcceleratorDistributed, GatherForMetricsReturnsExactlyTheDatasetAndItsAccuracy) {
  for (int n : {2, 3}) {
    auto results = launch(
        [](int) {
          Accelerator acc;
          const int64_t size = 101;  // divisible by neither 2, 3 nor the batch
          torch::manual_seed(3);
          auto x = torch::randn({size, 6});
          auto y = torch::randint(0, 3, {size}, torch::kLong);
          auto classifier = torch::nn::Linear(6, 3);
          auto single_accuracy = (classifier->forward(x).argmax(1) == y).to(torch::kDouble).mean();
          auto ids = torch::arange(size, torch::kLong);
          auto [model, loader] = acc.prepare(
              classifier, make_data_loader(torch::cat({x, ids.unsqueeze(1).to(torch::kFloat)}, 1),
                                           y, DataLoaderOptions().batch_size(8)));
          std::vector<torch::Tensor> seen_ids, correct;
          torch::NoGradGuard no_grad;
          for (auto& batch : loader) {
            auto features = batch.data.narrow(1, 0, 6);
            auto predicted = model->forward(features).argmax(1);
            seen_ids.push_back(acc.gather_for_metrics(batch.data.select(1, 6).to(torch::kLong)));
            correct.push_back(acc.gather_for_metrics(predicted == batch.target));
          }
          auto all_ids = std::get<0>(torch::cat(seen_ids).sort());
          auto accuracy = torch::cat(correct).to(torch::kDouble).mean();
          return torch::stack({torch::tensor(static_cast<double>(all_ids.size(0))),
                               torch::equal(all_ids, ids) ? torch::tensor(1.0) : torch::tensor(0.0),
                               accuracy.to(torch::kDouble), single_accuracy.to(torch::kDouble)});
        },
        ranks(n));
    for (const auto& r : results) {
      EXPECT_EQ(r[0].item<double>(), 101.0) << n << " processes";
      EXPECT_EQ(r[1].item<double>(), 1.0)
          << "some sample missing or repeated, " << n << " processes";
      EXPECT_DOUBLE_EQ(r[2].item<double>(), r[3].item<double>()) << n << " processes";
    }
  }
}

TEST(AcceleratorDistributed, AParameterWithoutAGradientIsNamed) {
  struct TwoHeads : torch::nn::Module {
    TwoHeads() {
      used = register_module("used", torch::nn::Linear(4, 2));
      unused = register_module("unused_head", torch::nn::Linear(4, 2));
    }
    torch::Tensor forward(const torch::Tensor& x) { return used(x); }
    torch::nn::Linear used{nullptr}, unused{nullptr};
  };
  try {
    launch(
        [](int) {
          Accelerator acc;
          auto m = acc.prepare(std::make_shared<TwoHeads>());
          acc.backward(m->forward(torch::randn({3, 4})).sum());
        },
        ranks(2));
    FAIL() << "expected the launch to fail";
  } catch (const LaunchError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("unused_head.weight"), std::string::npos) << message;
    EXPECT_NE(message.find("allow_unused_parameters"), std::string::npos) << message;
  }
  // Allowed: the step completes and the unused head gets a zero gradient.
  auto results = launch(
      [](int) {
        Accelerator acc(AcceleratorOptions().allow_unused_parameters(true));
        auto m = acc.prepare(std::make_shared<TwoHeads>());
        acc.backward(m->forward(torch::randn({3, 4})).sum());
        return m->unused->weight.grad().abs().sum().item<double>();
      },
      ranks(2));
  for (double g : results) EXPECT_EQ(g, 0.0);
}

TEST(AcceleratorDistributed, FrozenLayersAreLeftAloneAndTheRestTrainsInStep) {
  auto results = launch(
      [](int index) {
        Accelerator acc;
        torch::manual_seed(index);
        auto model = torch::nn::Sequential(torch::nn::Linear(4, 4), torch::nn::Linear(4, 2));
        for (auto& p : model[0]->parameters()) p.set_requires_grad(false);
        torch::optim::SGD sgd(model->parameters(), 0.1);
        auto [m, o] = acc.prepare(model, sgd);
        auto frozen = m[0]->parameters()[0].clone();
        auto trained = m[1]->parameters()[0].clone();
        acc.backward(
            m->forward(torch::randn({3, 4}) * (index + 1)).sum());  // different data per rank
        o.step();
        const bool frozen_kept = torch::equal(m[0]->parameters()[0], frozen);
        const bool trained_moved = !torch::equal(m[1]->parameters()[0], trained);
        return torch::cat({torch::tensor({frozen_kept ? 1.0f : 0.0f, trained_moved ? 1.0f : 0.0f}),
                           m[1]->parameters()[0].detach().reshape({-1})});
      },
      ranks(2));
  for (const auto& r : results) {
    EXPECT_EQ(r[0].item<float>(), 1.0f) << "a frozen weight changed";
    EXPECT_EQ(r[1].item<float>(), 1.0f) << "a trainable weight did not change";
  }
  EXPECT_TRUE(torch::equal(results[0], results[1])) << "the ranks' trained weights differ";
}

TEST(AcceleratorDistributed, CpuDefaultsTakeTheLauncherThreadCountForBothPools) {
  auto results = launch(
      [](int) {
        Accelerator acc;
        auto x = torch::randn({512, 512});
        (void)torch::mm(x, x).sum();  // BLAS and OpenMP at 2 threads in a forked worker
        return torch::tensor(
            {static_cast<int64_t>(acc.threads()), static_cast<int64_t>(torch::get_num_threads())});
      },
      ranks(2).threads_per_process(2));  // not cores / processes (1 on 2 cores), so it shows
  for (const auto& r : results) {
    EXPECT_EQ(r[0].item<int64_t>(), 2);
    EXPECT_EQ(r[1].item<int64_t>(), 2);
  }
}

TEST(AcceleratorDistributed, GradientsLiveInTheBucketsAndAReplacedGradientIsBoundAgain) {
  auto results = launch(
      [](int rank) {
        auto& comm = ProcessState::get().communicator();
        torch::nn::Sequential model(torch::nn::Linear(4, 8), torch::nn::Linear(8, 2));
        GradientReducer reducer(model->named_parameters(), comm);
        auto x = torch::full({3, 4}, static_cast<float>(rank + 1));
        std::vector<float> out;
        auto pass = [&] {
          model->forward(x).sum().backward();
          out.push_back(static_cast<float>(reducer.stats().gradient_copies));
        };
        pass();  // bound at construction: nothing to copy
        for (auto& p : model->parameters()) p.mutable_grad().zero_();
        pass();
        out.push_back(model[1]->as<torch::nn::Linear>()->bias.grad()[0].item<float>());
        for (auto& p : model->parameters()) p.mutable_grad() = torch::Tensor();  // set to none
        pass();  // each replaced .grad copied once, and bound again
        for (auto& p : model->parameters()) p.mutable_grad().zero_();
        pass();
        return torch::tensor(out);
      },
      ranks(2));
  for (const auto& r : results) {
    EXPECT_EQ(r[0].item<float>(), 0);
    EXPECT_EQ(r[1].item<float>(), 0);
    EXPECT_EQ(r[2].item<float>(), 3)
        << "the bias gradient is the batch size on every rank, averaged";
    EXPECT_EQ(r[3].item<float>(), 4) << "four replaced gradients";
    EXPECT_EQ(r[4].item<float>(), 0) << "not bound again after being replaced";
  }
}

TEST(AcceleratorDistributed, ARankThatBuiltAnotherModelIsNamedOnEveryRank) {
  // Before prepare checked, the broadcast of rank 0's weights aborted inside Gloo (SIGABRT).
  auto messages = launch(
      [](int rank) -> std::string {
        Accelerator acc;
        auto model = torch::nn::Sequential(torch::nn::Linear(16, rank == 1 ? 64 : 32),
                                           torch::nn::Tanh(), torch::nn::Linear(32, 4));
        try {
          acc.prepare(model);
          return "prepared";
        } catch (const Error& e) {
          return e.what();
        }
      },
      ranks(2));
  ASSERT_EQ(messages.size(), 2u);
  for (int r = 0; r < 2; ++r) {
    const std::string& m = messages[r];
    EXPECT_TRUE(accelerant::testing::contains(m, "[rank " + std::to_string(r) + "/2]")) << m;
    EXPECT_TRUE(
        accelerant::testing::contains(m, "the ranks built different models (rank 1 differs"))
        << m;
    EXPECT_TRUE(accelerant::testing::contains(
        m,
        "First difference: parameter 0.weight is [32, 16] Float on rank 0 but [64, 16] Float on "
        "rank 1"))
        << m;
    EXPECT_TRUE(accelerant::testing::contains(m, "Fix: build the same model on every rank")) << m;
  }
}

namespace {

// How often the unprepared-loader warning appears in the workers' stderr, all ranks together,
// after three steps of a prepared model whose loader is (or is not) prepared.
int unsharded_warnings(bool prepare_loader) {
  accelerant::testing::ScratchDir logs;
  launch(
      [prepare_loader](int) {
        Accelerator acc;
        auto model = torch::nn::Linear(4, 2);
        torch::optim::SGD sgd(model->parameters(), 0.1);
        auto loader = make_data_loader(torch::randn({24, 4}), torch::randn({24, 2}),
                                       DataLoaderOptions().batch_size(4));
        auto [m, o] = acc.prepare(model, sgd);
        if (prepare_loader) loader = acc.prepare(loader);
        int steps = 0;
        for (auto& b : loader) {
          acc.backward(torch::mse_loss(m->forward(b.data), b.target));
          o.step();
          o.zero_grad();
          if (++steps == 3) break;
        }
      },
      ranks(2).log_dir(logs.path));
  int count = 0;
  for (int r = 0; r < 2; ++r) {
    std::ifstream in(logs.path + "/attempt_0/rank_" + std::to_string(r) + ".stderr");
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    for (size_t at = text.find("every rank sees the whole data set"); at != std::string::npos;
         at = text.find("every rank sees the whole data set", at + 1)) {
      EXPECT_TRUE(accelerant::testing::contains(text, "Fix: pass the loader to prepare")) << text;
      ++count;
    }
  }
  return count;
}

}  // namespace

TEST(AcceleratorDistributed, TrainingWithoutAPreparedLoaderWarnsOnce) {
  EXPECT_EQ(unsharded_warnings(/*prepare_loader=*/false), 1);
  EXPECT_EQ(unsharded_warnings(/*prepare_loader=*/true), 0);
}
