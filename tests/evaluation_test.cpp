// MeanMetrics' weighted means and refusals; Accelerator::evaluate on two processes with uneven
// shares (the weighted mean over every item, not the mean of the ranks' means), in eval mode
// without gradients, each module's mode put back also when the body throws, different metric
// names refused on every rank; and backward_per_token, whose gradient over uneven ranks and
// micro-batches is that of the mean over every target token (backward(mean loss) is not).
#include <accelerant/accelerant.h>
#include <accelerant/evaluation.h>
#include <gtest/gtest.h>

#include <cmath>

#include "test_support.h"

using namespace accelerant;
using accelerant::testing::contains;
using accelerant::testing::error_message;
using accelerant::testing::flat_parameters;

namespace {

LaunchOptions two_ranks() {
  return LaunchOptions()
      .processes_per_node(2)
      .collective_timeout(std::chrono::seconds(60))
      .verbose(false);
}

torch::Tensor value(double v) { return torch::tensor(v, torch::kDouble); }

}  // namespace

TEST(MeanMetrics, MeansAreWeightedByTheirItems) {
  MeanMetrics metrics;
  EXPECT_TRUE(metrics.empty());
  metrics.add("loss", value(2.0), 3);  // a batch of 3 with mean 2
  metrics.add("loss", value(4.0), 1);  // a batch of 1 with mean 4: (6 + 4) / 4, not (2 + 4) / 2
  metrics.add_sum("accuracy", value(3.0), 4);
  metrics.add("nothing", value(5.0), 0);
  metrics.add("b", torch::ones({1, 1}));  // one element of any shape; weight 1 by default
  EXPECT_FALSE(metrics.empty());
  EXPECT_EQ(metrics.names(), (std::vector<std::string>{"accuracy", "b", "loss", "nothing"}));
  const auto means = metrics.local_means();
  EXPECT_DOUBLE_EQ(means.at("loss"), 2.5);
  EXPECT_DOUBLE_EQ(means.at("accuracy"), 0.75);
  EXPECT_DOUBLE_EQ(means.at("b"), 1.0);
  EXPECT_TRUE(std::isnan(means.at("nothing")));
  // packed: [sum, weight] per name in names() order; means_of reads such sums back.
  EXPECT_TRUE(torch::equal(
      metrics.packed(), torch::tensor({3.0, 4.0, 1.0, 1.0, 10.0, 4.0, 0.0, 0.0}, torch::kDouble)));
  EXPECT_DOUBLE_EQ(metrics.means_of(metrics.packed() * 2).at("loss"), 2.5);
}

TEST(MeanMetrics, BadValuesWeightsAndNamesAreErrors) {
  MeanMetrics metrics;
  metrics.add("loss", value(1.0), 2);
  for (const auto& f : std::vector<std::function<void()>>{
           [&] { metrics.add("loss", torch::ones({2}), 1); },
           [&] { metrics.add("loss", torch::Tensor(), 1); },
           [&] { metrics.add("loss", value(1.0), -1); },
           [&] { metrics.add("loss", value(1.0), std::nan("")); },
           [&] { metrics.add("", value(1.0), 1); },
           [&] { metrics.add_sum("loss", torch::ones({3}), 1); },
           [&] { metrics.means_of(torch::zeros({4}, torch::kDouble)); }}) {
    EXPECT_TRUE(contains(error_message(f), "Fix:")) << error_message(f);
  }
  EXPECT_DOUBLE_EQ(metrics.local_means().at("loss"), 1.0) << "a refused value was added";
}

namespace {

// What evaluate's body saw and what the model's modes were after; filled on each rank.
struct Seen {
  double loss = 0, per_rank_mean = 0;
  bool grad_inside = true, training_inside = true, dropout_inside = true;
  bool training_after = false, dropout_after = false, frozen_after = true;
  bool thrown_restores = false;
};

// Rank 0 evaluates items 0..6 in batches of 3, 3 and 1; rank 1 items 7..9 in batches of 2 and 1.
// The "model" returns an item's number as its loss, through a Dropout that would zero half of
// them in train mode. The weighted mean is mean(0..9) = 4.5; the ranks' means are 3 and 8.
torch::Tensor evaluate_uneven(int index) {
  Accelerator acc(AcceleratorOptions().cpu(true));
  torch::nn::Sequential model(torch::nn::Linear(1, 1), torch::nn::Dropout(0.5),
                              torch::nn::Dropout(0.5));
  {
    torch::NoGradGuard no_grad;
    model[0]->as<torch::nn::Linear>()->weight.fill_(1.0);
    model[0]->as<torch::nn::Linear>()->bias.zero_();
  }
  model[2]->eval();  // set apart on purpose: it must stay in eval mode
  auto m = acc.prepare(model);
  const std::vector<std::vector<int64_t>> batches =
      index == 0 ? std::vector<std::vector<int64_t>>{{0, 1, 2}, {3, 4, 5}, {6}}
                 : std::vector<std::vector<int64_t>>{{7, 8}, {9}};
  Seen seen;
  const auto means = acc.evaluate(m, [&](MeanMetrics& metrics) {
    seen.grad_inside = torch::GradMode::is_enabled();
    seen.training_inside = m->is_training();
    seen.dropout_inside = m[1]->is_training();
    double sum_of_means = 0;
    for (const auto& items : batches) {
      auto x = torch::tensor(items, torch::kFloat).unsqueeze(1);
      auto loss = m->forward(x).mean();
      metrics.add("val/loss", loss, static_cast<double>(items.size()));
      sum_of_means += loss.item<double>() * items.size();
    }
    seen.per_rank_mean = sum_of_means / (index == 0 ? 7 : 3);
  });
  seen.loss = means.at("val/loss");
  seen.training_after = m->is_training();
  seen.dropout_after = m[1]->is_training();
  seen.frozen_after = m[2]->is_training();
  // A body that throws (on every rank, before any collective) still puts the modes back.
  try {
    acc.evaluate(m, [](MeanMetrics&) { throw std::runtime_error("the body failed"); });
  } catch (const std::runtime_error&) {
    seen.thrown_restores = m->is_training() && m[1]->is_training() && !m[2]->is_training() &&
                           torch::GradMode::is_enabled();
  }
  return torch::tensor(
      {seen.loss, seen.per_rank_mean, double(seen.grad_inside), double(seen.training_inside),
       double(seen.dropout_inside), double(seen.training_after), double(seen.dropout_after),
       double(seen.frozen_after), double(seen.thrown_restores)},
      torch::kDouble);
}

}  // namespace

TEST(Evaluate, UnevenRanksGiveTheMeanOverEveryItemInEvalModeWithoutGradients) {
  const auto results = launch(evaluate_uneven, two_ranks());
  const double mean_of_rank_means =
      (results[0][1].item<double>() + results[1][1].item<double>()) / 2;
  EXPECT_DOUBLE_EQ(mean_of_rank_means, 5.5) << "the ranks' own means: eval mode was not set";
  for (int r = 0; r < 2; ++r) {
    const auto& s = results[r];
    EXPECT_DOUBLE_EQ(s[0].item<double>(), 4.5) << "rank " << r;
    EXPECT_EQ(s[2].item<double>(), 0) << "rank " << r << ": gradients on inside the body";
    EXPECT_EQ(s[3].item<double>(), 0) << "rank " << r << ": the model trains inside the body";
    EXPECT_EQ(s[4].item<double>(), 0) << "rank " << r << ": a submodule trains inside the body";
    EXPECT_EQ(s[5].item<double>(), 1) << "rank " << r << ": train mode not put back";
    EXPECT_EQ(s[6].item<double>(), 1) << "rank " << r << ": a submodule's train mode not put back";
    EXPECT_EQ(s[7].item<double>(), 0) << "rank " << r << ": a module set to eval was put in train";
    EXPECT_EQ(s[8].item<double>(), 1) << "rank " << r << ": modes not put back after a throw";
  }
}

TEST(Evaluate, DifferentMetricNamesAreAnErrorOnEveryRank) {
  const auto messages = launch(
      [](int index) {
        Accelerator acc(AcceleratorOptions().cpu(true));
        auto m = acc.prepare(torch::nn::Linear(1, 1));
        return error_message([&] {
          acc.evaluate(m, [&](MeanMetrics& metrics) {
            metrics.add(index == 0 ? "val/loss" : "val/accuracy", value(1.0), 1);
          });
        });
      },
      two_ranks());
  for (int r = 0; r < 2; ++r)
    EXPECT_TRUE(contains(messages[r], "different metrics")) << "rank " << r << ": " << messages[r];
}

namespace {

constexpr double kLr = 0.1;

torch::nn::Linear classifier() {
  torch::manual_seed(21);
  return torch::nn::Linear(3, 4);
}

// Micro-batch k of rank r: tokens[r][k] rows, seeded by (r, k). 5 + 2 on rank 0, 1 + 4 on rank 1.
const int64_t kTokens[2][2] = {{5, 2}, {1, 4}};

std::pair<torch::Tensor, torch::Tensor> micro_batch(int rank, int k) {
  torch::manual_seed(300 + 10 * rank + k);
  const int64_t n = kTokens[rank][k];
  return {torch::randn({n, 3}), torch::randint(0, 4, {n}, torch::kLong)};
}

// One optimizer step of SGD(kLr) over both micro-batches; returns the parameters after it.
torch::Tensor step_on_rank(int rank, bool per_token, int stage) {
  Accelerator acc(AcceleratorOptions()
                      .cpu(true)
                      .gradient_accumulation_steps(2)
                      .zero_stage(stage)
                      .fused_optimizers(stage > 0));
  auto model = classifier();
  torch::optim::SGD sgd(model->parameters(), kLr);
  auto [m, opt] = acc.prepare(model, sgd);
  for (int k = 0; k < 2; ++k) {
    auto guard = acc.accumulate(m);
    auto [x, y] = micro_batch(rank, k);
    namespace F = torch::nn::functional;
    if (per_token) {
      acc.backward_per_token(
          F::cross_entropy(m->forward(x), y, F::CrossEntropyFuncOptions().reduction(torch::kSum)),
          y.numel());
    } else {
      acc.backward(F::cross_entropy(m->forward(x), y));
    }
    opt.step();
    opt.zero_grad();
  }
  return flat_parameters(*m);
}

// The step a single process takes on the mean loss over all 12 tokens at once.
torch::Tensor single_process_step() {
  auto model = classifier();
  std::vector<torch::Tensor> xs, ys;
  for (int r = 0; r < 2; ++r) {
    for (int k = 0; k < 2; ++k) {
      auto [x, y] = micro_batch(r, k);
      xs.push_back(x);
      ys.push_back(y);
    }
  }
  torch::nn::functional::cross_entropy(model->forward(torch::cat(xs)), torch::cat(ys)).backward();
  torch::optim::SGD(model->parameters(), kLr).step();
  return flat_parameters(*model);
}

}  // namespace

TEST(BackwardPerToken, UnevenRanksAndMicroBatchesGiveTheGradientOfTheMeanOverAllTokens) {
  const auto expected = single_process_step();
  const auto start = flat_parameters(*classifier());
  for (int stage : {0, 2}) {
    const auto results =
        launch([stage](int rank) { return step_on_rank(rank, true, stage); }, two_ranks());
    for (int r = 0; r < 2; ++r) {
      // The parameters moved by -lr * gradient: compare the gradients themselves.
      const double worst = ((results[r] - expected) / kLr).abs().max().item<double>();
      EXPECT_LT(worst, 1e-6) << "stage " << stage << ", rank " << r;
    }
  }
  // backward(mean loss) weighs rank 1's single token as much as rank 0's five: another gradient.
  const auto mean_of_means =
      launch([](int rank) { return step_on_rank(rank, false, 0); }, two_ranks());
  const double difference = ((mean_of_means[0] - expected) / kLr).abs().max().item<double>();
  EXPECT_GT(difference, 1e-3) << "the mean of means happens to equal the mean over tokens";
  EXPECT_GT((expected - start).abs().max().item<double>(), 1e-3) << "nothing trained";
}

TEST(BackwardPerToken, AStepWithoutTargetTokensIsAnErrorOnEveryRank) {
  const auto messages = launch(
      [](int) {
        Accelerator acc(AcceleratorOptions().cpu(true));
        auto m = acc.prepare(classifier());
        std::string out = error_message([&] {
          acc.backward_per_token(m->forward(torch::ones({2, 3})).sum() * 0, 0);
        });
        out += "\n" + error_message([&] {
                 acc.backward_per_token(m->forward(torch::ones({2, 3})).sum(), -1);
               });
        out += "\n" + error_message([&] {
                 acc.backward_per_token(m->forward(torch::ones({2, 3})), 6);
               });
        return out;
      },
      two_ranks());
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(contains(messages[r], "no target tokens on any process")) << messages[r];
    EXPECT_TRUE(contains(messages[r], "-1 tokens")) << messages[r];
    EXPECT_TRUE(contains(messages[r], "a tensor of shape [2, 4]")) << messages[r];
  }
}
