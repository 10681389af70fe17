// GradScaler: scaling, unscaling to the true gradients, a skipped step on inf, backoff and growth.
#include <accelerant/error.h>
#include <accelerant/grad_scaler.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <limits>

using namespace accelerant;

namespace {

struct Fixture {
  torch::nn::Linear model{4, 2};
  torch::optim::SGD optimizer{model->parameters(), torch::optim::SGDOptions(0.1)};
  torch::Tensor x = torch::rand({8, 4});

  torch::Tensor loss() { return model->forward(x).pow(2).mean(); }
};

}  // namespace

TEST(GradScaler, UnscaledGradientsEqualTheUnscaledBackward) {
  torch::manual_seed(0);
  Fixture f;
  f.loss().backward();
  auto expected = f.model->weight.grad().clone();
  f.optimizer.zero_grad();
  GradScaler scaler;
  auto scaled = scaler.scale(f.loss());
  EXPECT_FLOAT_EQ(scaled.item<float>(), f.loss().item<float>() * 65536.0f);
  scaled.backward();
  scaler.unscale_(f.optimizer);
  EXPECT_TRUE(torch::allclose(f.model->weight.grad(), expected, 1e-5, 1e-7));
  EXPECT_EQ(scaler.found_inf().item<float>(), 0.0f);
  auto before = f.model->weight.detach().clone();
  EXPECT_TRUE(scaler.step(f.optimizer));
  EXPECT_FALSE(torch::equal(f.model->weight, before));
  scaler.update();
  EXPECT_EQ(scaler.current_scale(), 65536.0);
}

TEST(GradScaler, AnInfSkipsTheStepHalvesTheScaleAndLeavesParametersUnchanged) {
  Fixture f;
  GradScaler scaler;
  scaler.scale(f.loss()).backward();
  f.model->bias.grad()[0] = std::numeric_limits<float>::infinity();  // injected overflow
  auto weight = f.model->weight.detach().clone();
  auto bias = f.model->bias.detach().clone();
  EXPECT_FALSE(scaler.step(f.optimizer));
  EXPECT_EQ(scaler.found_inf().item<float>(), 1.0f);
  EXPECT_TRUE(torch::equal(f.model->weight, weight));
  EXPECT_TRUE(torch::equal(f.model->bias, bias));
  scaler.update();
  EXPECT_EQ(scaler.current_scale(), 32768.0);
  EXPECT_EQ(scaler.found_inf().item<float>(), 0.0f);  // reset for the next step
}

TEST(GradScaler, NanCountsAsOverflowAndTheScaleGrowsAfterTheInterval) {
  Fixture f;
  GradScaler scaler(GradScalerOptions().init_scale(8).growth_interval(3));
  auto run_step = [&](bool poison) {
    f.optimizer.zero_grad();
    scaler.scale(f.loss()).backward();
    if (poison) f.model->weight.grad()[0][0] = std::numeric_limits<float>::quiet_NaN();
    scaler.step(f.optimizer);
    scaler.update();
  };
  run_step(true);
  EXPECT_EQ(scaler.current_scale(), 4.0);
  run_step(false);
  run_step(false);
  EXPECT_EQ(scaler.current_scale(), 4.0);
  run_step(false);  // third clean step in a row
  EXPECT_EQ(scaler.current_scale(), 8.0);
}

TEST(GradScaler, DisabledPassesThroughAndBadOptionsAreErrors) {
  Fixture f;
  GradScaler off(GradScalerOptions().enabled(false));
  auto loss = f.loss();
  EXPECT_TRUE(off.scale(loss).is_same(loss));
  EXPECT_THROW(GradScaler(GradScalerOptions().backoff_factor(1.5)), Error);
  GradScaler scaler;
  scaler.scale(f.loss()).backward();
  scaler.unscale_(f.optimizer);
  EXPECT_THROW(scaler.unscale_(f.optimizer), Error);  // twice in one step
}
