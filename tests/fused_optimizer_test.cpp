// The fused optimizers against torch::optim: same trajectories within rounding on both paths (CPU
// loop and whole-arena tensor operations), parameters packed into one arena, a skip flag that
// changes nothing, state that round-trips, schedulers followed, clear refusals; and through the
// Accelerator, on two ranks, with gradients living in the reducer's buckets.
#include <accelerant/accelerant.h>
#include <gtest/gtest.h>

#include <sstream>

#include "test_support.h"

using namespace accelerant;
namespace optim = torch::optim;

namespace {

// Several parameter tensors of different sizes; `unused` never gets a gradient.
struct Net : torch::nn::Module {
  torch::nn::Linear a{nullptr}, b{nullptr}, unused{nullptr};
  Net() {
    a = register_module("a", torch::nn::Linear(7, 33));
    b = register_module("b", torch::nn::Linear(33, 5));
    unused = register_module("unused", torch::nn::Linear(3, 3));
  }
  torch::Tensor forward(const torch::Tensor& x) { return b->forward(torch::tanh(a->forward(x))); }
};

std::shared_ptr<Net> make_net(uint64_t seed) {
  torch::manual_seed(seed);
  return std::make_shared<Net>();
}

torch::Tensor flat(const std::shared_ptr<Net>& net) {
  std::vector<torch::Tensor> parts;
  for (auto& p : net->parameters()) parts.push_back(p.detach().reshape({-1}).clone());
  return torch::cat(parts);
}

void train(const std::shared_ptr<Net>& net, optim::Optimizer& optimizer, int steps,
           uint64_t data_seed = 3) {
  torch::manual_seed(data_seed);
  for (int s = 0; s < steps; ++s) {
    auto x = torch::randn({16, 7});
    optimizer.zero_grad();
    net->forward(x).pow(2).mean().backward();
    optimizer.step();
  }
}

void expect_close(const torch::Tensor& fused, const torch::Tensor& reference) {
  const double scale = reference.abs().max().item<double>();
  const double diff = (fused - reference).abs().max().item<double>();
  EXPECT_LE(diff, 2e-6 * scale) << "max difference " << diff << " on values up to " << scale;
}

// Runs the same 25 steps with torch's optimizer and the fused one (from the same start).
template <class Torch, class Fused, class Options>
void compare(Options options, bool tensor_ops) {
  auto reference_net = make_net(1);
  Torch reference(reference_net->parameters(), options);
  train(reference_net, reference, 25);
  auto fused_net = make_net(1);
  Fused fused(fused_net->parameters(), options,
              FusedUpdaterOptions().tensor_ops_on_cpu(tensor_ops));
  train(fused_net, fused, 25);
  expect_close(flat(fused_net), flat(reference_net));
  EXPECT_FALSE(torch::equal(flat(reference_net), flat(make_net(1))))
      << "the reference did not train";
  // The parameter without gradients was left alone, as torch::optim leaves it.
  EXPECT_TRUE(torch::equal(fused_net->unused->weight, make_net(1)->unused->weight));
}

}  // namespace

class FusedPaths : public ::testing::TestWithParam<bool> {};

TEST_P(FusedPaths, SgdWithMomentumNesterovAndWeightDecayMatchesTorch) {
  compare<optim::SGD, FusedSGD>(
      optim::SGDOptions(0.05).momentum(0.9).nesterov(true).weight_decay(0.01), GetParam());
}

TEST_P(FusedPaths, SgdWithDampeningAndPlainSgdMatchTorch) {
  compare<optim::SGD, FusedSGD>(optim::SGDOptions(0.05).momentum(0.8).dampening(0.3), GetParam());
  compare<optim::SGD, FusedSGD>(optim::SGDOptions(0.05), GetParam());
}

TEST_P(FusedPaths, AdamWithWeightDecayMatchesTorch) {
  compare<optim::Adam, FusedAdam>(optim::AdamOptions(1e-2).weight_decay(0.1).betas({0.8, 0.99}),
                                  GetParam());
}

TEST_P(FusedPaths, AdamWMatchesTorch) {
  compare<optim::AdamW, FusedAdamW>(optim::AdamWOptions(1e-2).weight_decay(0.05).eps(1e-6),
                                    GetParam());
}

TEST_P(FusedPaths, ASkipFlagChangesNothingAndACleanFlagSteps) {
  auto net = make_net(1);
  FusedAdamW fused(net->parameters(), optim::AdamWOptions(1e-2),
                   FusedUpdaterOptions().tensor_ops_on_cpu(GetParam()));
  train(net, fused, 3);
  std::stringstream before;
  torch::serialize::OutputArchive saved;
  fused.save(saved);
  const auto params_before = flat(net);
  fused.zero_grad();
  net->forward(torch::randn({4, 7})).sum().backward();
  fused.step_unless(torch::ones({}));
  EXPECT_TRUE(torch::equal(flat(net), params_before)) << "a skipped step changed the parameters";
  // Continuing after the skipped step equals a twin that never saw it (state and counts unchanged).
  auto twin = make_net(1);
  FusedAdamW twin_optimizer(twin->parameters(), optim::AdamWOptions(1e-2));
  train(twin, twin_optimizer, 3);
  train(net, fused, 2, 9);
  train(twin, twin_optimizer, 2, 9);
  EXPECT_LE((flat(net) - flat(twin)).abs().max().item<double>(), 1e-6);
  fused.zero_grad();
  net->forward(torch::randn({4, 7})).sum().backward();
  const auto before_clean = flat(net);
  fused.step_unless(torch::zeros({}));
  EXPECT_FALSE(torch::equal(flat(net), before_clean)) << "a clean flag did not step";
}

TEST_P(FusedPaths, ASkippedOverflowLeavesNoNanBehind) {
  auto net = make_net(1);
  FusedAdamW fused(net->parameters(), optim::AdamWOptions(1e-2),
                   FusedUpdaterOptions().tensor_ops_on_cpu(GetParam()));
  auto twin = make_net(1);
  FusedAdamW twin_optimizer(twin->parameters(), optim::AdamWOptions(1e-2),
                            FusedUpdaterOptions().tensor_ops_on_cpu(GetParam()));
  train(net, fused, 2);
  train(twin, twin_optimizer, 2);
  fused.zero_grad();
  net->forward(torch::randn({4, 7})).sum().backward();
  net->a->weight.mutable_grad()[0][0] = std::numeric_limits<float>::infinity();
  net->b->bias.mutable_grad()[1] = std::numeric_limits<float>::quiet_NaN();
  fused.step_unless(torch::ones({}));
  EXPECT_TRUE(torch::equal(flat(net), flat(twin))) << "the skipped step changed something";
  train(net, fused, 3, 9);
  train(twin, twin_optimizer, 3, 9);
  EXPECT_TRUE(torch::isfinite(flat(net)).all().item<bool>())
      << "nan or inf leaked into the parameters";
  EXPECT_LE((flat(net) - flat(twin)).abs().max().item<double>(), 1e-6);
}

INSTANTIATE_TEST_SUITE_P(CpuLoopAndTensorOps, FusedPaths, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "TensorOps" : "CpuLoop"; });

TEST(FusedOptimizer, ParametersAndGradientsLiveInOneArenaInParameterOrder) {
  auto net = make_net(1);
  const auto values = flat(net);
  FusedAdamW fused(net->parameters(), optim::AdamWOptions(1e-3));
  EXPECT_TRUE(fused.updater().parameters_packed());
  EXPECT_EQ(fused.updater().numel(), values.numel());
  EXPECT_TRUE(torch::equal(flat(net), values)) << "packing changed a value";
  auto params = net->parameters();
  for (size_t i = 1; i < params.size(); ++i) {
    EXPECT_EQ(static_cast<float*>(params[i].data_ptr()),
              static_cast<float*>(params[i - 1].data_ptr()) + params[i - 1].numel())
        << "parameter " << i;
  }
  // The first step binds the gradients autograd made into the arena (those of a and b; the
  // unused layer's stay unset); later backwards accumulate there, and LibTorch's zero_grad
  // (which detaches) keeps them there.
  net->forward(torch::randn({2, 7})).sum().backward();
  fused.step();
  fused.zero_grad();
  net->forward(torch::randn({2, 7})).sum().backward();
  fused.step();
  for (size_t i = 1; i < 4; ++i) {
    EXPECT_EQ(static_cast<float*>(params[i].grad().data_ptr()),
              static_cast<float*>(params[i - 1].grad().data_ptr()) + params[i - 1].numel())
        << "gradient " << i;
  }
  EXPECT_FALSE(net->unused->weight.grad().defined());
  EXPECT_TRUE(fused.updater().parameters_packed());
}

TEST(FusedOptimizer, ParametersMovedAwayArePackedAgainWithTheirState) {
  auto reference_net = make_net(1);
  optim::Adam reference(reference_net->parameters(), optim::AdamOptions(1e-2));
  train(reference_net, reference, 10);
  auto net = make_net(1);
  FusedAdam fused(net->parameters(), optim::AdamOptions(1e-2));
  train(net, fused, 5);
  {
    torch::NoGradGuard no_grad;
    for (auto& p : net->parameters()) p.set_data(p.detach().clone());  // what model->to() does
  }
  EXPECT_FALSE(fused.updater().parameters_packed());
  torch::manual_seed(3);
  for (int s = 0; s < 5; ++s) torch::randn({16, 7});  // the data train() used so far
  for (int s = 0; s < 5; ++s) {
    auto x = torch::randn({16, 7});
    fused.zero_grad();
    net->forward(x).pow(2).mean().backward();
    fused.step();
  }
  EXPECT_TRUE(fused.updater().parameters_packed());
  expect_close(flat(net), flat(reference_net));
  EXPECT_FALSE(torch::equal(flat(reference_net), flat(make_net(1))))
      << "the reference did not train";
}

TEST(FusedOptimizer, StateRoundTripsAndResumesTheSameTrajectory) {
  auto uninterrupted = make_net(1);
  FusedAdamW straight(uninterrupted->parameters(), optim::AdamWOptions(1e-2).weight_decay(0.1));
  train(uninterrupted, straight, 6);
  train(uninterrupted, straight, 6, 11);

  auto first = make_net(1);
  FusedAdamW first_optimizer(first->parameters(), optim::AdamWOptions(1e-2).weight_decay(0.1));
  train(first, first_optimizer, 6);
  std::stringstream bytes;
  torch::serialize::OutputArchive archive;
  first_optimizer.save(archive);
  archive.save_to(bytes);
  const auto params = flat(first);

  auto resumed = make_net(2);
  {
    torch::NoGradGuard no_grad;
    int64_t offset = 0;
    for (auto& p : resumed->parameters()) {
      p.copy_(params.narrow(0, offset, p.numel()).view(p.sizes()));
      offset += p.numel();
    }
  }
  FusedAdamW resumed_optimizer(resumed->parameters(), optim::AdamWOptions(1e-2).weight_decay(0.1));
  torch::serialize::InputArchive in;
  in.load_from(bytes);
  resumed_optimizer.load(in);
  train(resumed, resumed_optimizer, 6, 11);
  EXPECT_TRUE(torch::equal(flat(resumed), flat(uninterrupted)));
}

TEST(FusedOptimizer, StateForOtherParametersIsRefusedWithTheirSizes) {
  auto net = make_net(1);
  FusedAdamW fused(net->parameters(), optim::AdamWOptions(1e-2));
  train(net, fused, 1);
  std::stringstream bytes;
  torch::serialize::OutputArchive archive;
  fused.save(archive);
  archive.save_to(bytes);
  auto other = torch::nn::Linear(4, 2);
  FusedAdamW other_optimizer(other->parameters(), optim::AdamWOptions(1e-2));
  torch::serialize::InputArchive in;
  in.load_from(bytes);
  try {
    other_optimizer.load(in);
    FAIL() << "loading state for other parameters succeeded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("6 parameters of sizes [231, 33, 165, 5, 9, 3]"),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("2 of sizes [8, 2]"), std::string::npos) << e.what();
  }
}

TEST(FusedOptimizer, FollowsAScheduleThatChangesTheLearningRate) {
  auto reference_net = make_net(1);
  optim::SGD reference(reference_net->parameters(), optim::SGDOptions(0.1).momentum(0.5));
  optim::StepLR reference_schedule(reference, 2, 0.5);
  auto net = make_net(1);
  FusedSGD fused(net->parameters(), optim::SGDOptions(0.1).momentum(0.5));
  optim::StepLR schedule(fused, 2, 0.5);
  for (int epoch = 0; epoch < 4; ++epoch) {
    train(reference_net, reference, 2, 20 + epoch);
    reference_schedule.step();
    train(net, fused, 2, 20 + epoch);
    schedule.step();
  }
  expect_close(flat(net), flat(reference_net));
  EXPECT_FALSE(torch::equal(flat(reference_net), flat(make_net(1))))
      << "the reference did not train";
}

TEST(FusedOptimizer, RefusesWhatItCannotDoAndSaysWhatToUse) {
  auto net = make_net(1);
  auto message = accelerant::testing::error_message;
  EXPECT_NE(message([&] {
              FusedAdam(net->parameters(), optim::AdamOptions(1e-3).amsgrad(true));
            }).find("amsgrad"),
            std::string::npos);
  auto doubles = torch::nn::Linear(2, 2);
  doubles->to(torch::kDouble);
  EXPECT_NE(message([&] {
              FusedSGD(doubles->parameters(), optim::SGDOptions(0.1));
            }).find("dense fp32 parameters"),
            std::string::npos);
  optim::RMSprop rmsprop(net->parameters());
  EXPECT_NE(message([&] { FusedUpdater updater(rmsprop); }).find("SGD, Adam and AdamW"),
            std::string::npos);
  optim::SGD stepped(net->parameters(), optim::SGDOptions(0.1).momentum(0.9));
  train(net, stepped, 1);
  EXPECT_NE(message([&] { FusedUpdater updater(stepped); }).find("already has state"),
            std::string::npos);
  // ZeRO's pieces: no element twice, and gradients in every piece or in none.
  optim::Adam adam(net->parameters(), optim::AdamOptions(1e-3));
  FusedUpdater sharded(adam);
  EXPECT_NE(message([&] {
              sharded.shard({{0, 0, 4, {}}, {0, 2, 4, {}}});
            }).find("overlap"),
            std::string::npos);
  EXPECT_NE(message([&] {
              sharded.shard({{0, 0, 2, torch::zeros({2})}, {0, 2, 2, {}}});
            }).find("1 of the 2 pieces carry a gradient"),
            std::string::npos);
}

TEST(FusedOptimizer, TheScalerSkipsAnOverflowedStepThroughTheDeviceFlag) {
  auto net = make_net(1);
  FusedAdamW fused(net->parameters(), optim::AdamWOptions(1e-2));
  GradScaler scaler(GradScalerOptions().init_scale(1024));
  fused.zero_grad();
  scaler.scale(net->forward(torch::randn({4, 7})).sum()).backward();
  net->a->weight.mutable_grad()[0][0] = std::numeric_limits<float>::infinity();
  const auto before = flat(net);
  EXPECT_FALSE(scaler.step(fused));
  scaler.update();
  EXPECT_TRUE(torch::equal(flat(net), before));
  EXPECT_EQ(scaler.current_scale(), 512);
  fused.zero_grad();
  scaler.scale(net->forward(torch::randn({4, 7})).sum()).backward();
  EXPECT_TRUE(scaler.step(fused));
  EXPECT_FALSE(torch::equal(flat(net), before));
}

namespace {

// AdamW on two ranks through prepare; returns the final parameters and, last, the gradient
// copies the reducer made in the last backward. On the CPU on a GPU machine too: two ranks cannot
// share its one GPU (NCCL refuses), and the inputs are made on the CPU.
torch::Tensor train_prepared(int rank, bool fused) {
  Accelerator acc(AcceleratorOptions().cpu(true).fused_optimizers(fused).bucket_cap_mb(1));
  torch::manual_seed(5);
  auto model =
      torch::nn::Sequential(torch::nn::Linear(16, 64), torch::nn::ReLU(), torch::nn::Linear(64, 4));
  optim::AdamW adamw(model->parameters(), optim::AdamWOptions(1e-2).weight_decay(0.01));
  auto [m, o] = acc.prepare(model, adamw);
  torch::manual_seed(17 + rank);
  for (int step = 0; step < 15; ++step) {
    auto x = torch::randn({8, 16});
    acc.backward(m->forward(x).pow(2).mean());
    o.step();
    o.zero_grad();
  }
  std::vector<torch::Tensor> parts;
  for (auto& p : m->parameters()) parts.push_back(p.detach().reshape({-1}));
  parts.push_back(torch::tensor(
      {static_cast<float>(acc.reducer_stats(m).gradient_copies),
       fused && o.fused_updater() && o.fused_updater()->parameters_packed() ? 1.0f : 0.0f}));
  return torch::cat(parts);
}

}  // namespace

TEST(FusedOptimizer, PreparedOnTwoRanksItMatchesTorchAdamWWithGradientsInTheBuckets) {
  auto options = LaunchOptions()
                     .processes_per_node(2)
                     .collective_timeout(std::chrono::seconds(60))
                     .verbose(false);
  auto fused = launch([](int rank) { return train_prepared(rank, true); }, options);
  auto plain = launch([](int rank) { return train_prepared(rank, false); }, options);
  const int64_t n = fused[0].numel() - 2;
  torch::manual_seed(5);  // the start train_prepared builds
  auto start =
      torch::nn::Sequential(torch::nn::Linear(16, 64), torch::nn::ReLU(), torch::nn::Linear(64, 4));
  std::vector<torch::Tensor> start_parts;
  for (auto& p : start->parameters()) start_parts.push_back(p.detach().reshape({-1}));
  const auto initial = torch::cat(start_parts);
  for (int r = 0; r < 2; ++r) {
    expect_close(fused[r].narrow(0, 0, n), plain[r].narrow(0, 0, n));
    EXPECT_FALSE(torch::equal(plain[r].narrow(0, 0, n), initial))
        << "rank " << r << ": nothing trained";
    EXPECT_TRUE(torch::equal(fused[r].narrow(0, 0, n), fused[0].narrow(0, 0, n)))
        << "ranks diverged";
    EXPECT_EQ(fused[r][n].item<float>(), 0) << "rank " << r << ": the reducer copied gradients";
    EXPECT_EQ(plain[r][n].item<float>(), 0) << "rank " << r << ": the reducer copied gradients";
    EXPECT_EQ(fused[r][n + 1].item<float>(), 1) << "rank " << r << ": parameters not in the arena";
  }
}
