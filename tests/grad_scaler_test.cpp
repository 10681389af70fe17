// GradScaler: scaling, unscaling to the true gradients, a skipped step on inf, backoff and growth.
#include <accelerant/error.h>
#include <accelerant/fused_optimizer.h>
#include <accelerant/grad_scaler.h>
#include <accelerant/prepared_optimizer.h>
#include <accelerant/process_state.h>
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

// A fused optimizer passed as a torch::optim optimizer: step() reads the skip decision on the
// host and calls its step() (its fused update); through its updater the decision stays on the
// device. Both update alike and both skip an overflowed step.
TEST(GradScaler, AFusedOptimizerStepsAlikeThroughEitherEntryPoint) {
  auto run = [](bool through_updater, bool overflow) {
    torch::manual_seed(0);
    torch::nn::Linear model(4, 2);
    FusedSGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    const auto x = torch::rand({8, 4});
    GradScaler scaler;
    scaler.scale(model->forward(x).pow(2).mean()).backward();
    if (overflow) model->bias.grad()[0] = std::numeric_limits<float>::infinity();
    const bool stepped =
        through_updater ? scaler.step(optimizer.updater()) : scaler.step(optimizer);
    EXPECT_EQ(stepped, !overflow);
    scaler.update();
    return torch::cat({model->weight.detach().reshape({-1}), model->bias.detach().reshape({-1})});
  };
  torch::manual_seed(0);
  torch::nn::Linear fresh(4, 2);
  const auto initial =
      torch::cat({fresh->weight.detach().reshape({-1}), fresh->bias.detach().reshape({-1})});
  EXPECT_TRUE(torch::equal(run(false, false), run(true, false)));
  EXPECT_FALSE(torch::equal(run(false, false), initial));
  EXPECT_TRUE(torch::equal(run(false, true), initial));
  EXPECT_TRUE(torch::equal(run(true, true), initial));
}

// PreparedOptimizer decides once which update runs: a fused optimizer's own updater, without
// one bound by prepare; under fp16-style scaling an overflow skips it and is counted.
TEST(GradScaler, APreparedFusedOptimizerUsesItsOwnUpdater) {
  torch::manual_seed(0);
  torch::nn::Linear model(4, 2);
  FusedSGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1));
  auto state = std::make_shared<TrainingState>();
  state->scaler = std::make_shared<GradScaler>();
  PreparedOptimizer prepared(optimizer, state);
  EXPECT_EQ(prepared.fused_updater(), &optimizer.updater());
  state->scaler->scale(model->forward(torch::rand({8, 4})).pow(2).mean()).backward();
  model->bias.grad()[1] = std::numeric_limits<float>::quiet_NaN();
  const auto before = model->weight.detach().clone();
  EXPECT_FALSE(prepared.step());
  EXPECT_TRUE(prepared.step_was_skipped());
  EXPECT_EQ(state->optimizer_steps, 0);
  EXPECT_TRUE(torch::equal(model->weight, before));
}

// Sharded gradients (ZeRO stage 2): the shares themselves are divided, an inf in one is found,
// and, as unscale_, twice in one step is refused. The agreement across processes is
// zero_test's Stage2WithALossScalerSkipsAnOverflowOnEveryProcess.
TEST(GradScaler, UnscaleSharesDividesTheSharesAndFindsAnInf) {
  auto& comm = ProcessState::get().communicator();  // this process alone
  GradScaler scaler(GradScalerOptions().init_scale(4.0));
  auto finite = torch::full({3}, 8.0f);
  auto with_inf = torch::tensor({4.0f, std::numeric_limits<float>::infinity()});
  EXPECT_FALSE(scaler.unscaled());
  scaler.unscale_shares_({finite, with_inf}, comm);
  EXPECT_TRUE(scaler.unscaled());
  EXPECT_TRUE(torch::equal(finite, torch::full({3}, 2.0f)));
  EXPECT_EQ(with_inf[0].item<float>(), 1.0f);
  EXPECT_EQ(scaler.found_inf().item<float>(), 1.0f);
  try {
    scaler.unscale_shares_({finite}, comm);
    FAIL() << "a second unscale in one step was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("twice in one step"), std::string::npos) << e.what();
  }
  scaler.update();
  EXPECT_FALSE(scaler.unscaled());
  EXPECT_EQ(scaler.current_scale(), 2.0);  // backed off after the overflow
}
