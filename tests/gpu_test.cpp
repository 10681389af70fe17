// The CUDA paths of graph mode, for a machine with a GPU and a CUDA LibTorch (scripts/gpu-check
// builds and runs them there). Without a GPU every test here is skipped, and says so: CI has
// none. They use only LibTorch's public C++ API, so that they compile in the CPU build too.
//
// - A compiled whole step (fused AdamW, StepLR) replays CUDA graphs and trains as the eager loop.
// - fp16: an inf injected on the device at a replayed step is skipped, counted after the step,
//   and backs the scale off.
// - The captured scaled update does not wait for the device: queued behind ~0.3 s of GPU work,
//   the replay returns at once.
#include <accelerant/accelerant.h>
#include <gtest/gtest.h>

#include <chrono>
#include <limits>
#include <optional>

#include "test_support.h"

using namespace accelerant;

namespace {

#define SKIP_WITHOUT_GPU()          \
  if (!torch::cuda::is_available()) \
  GTEST_SKIP() << "no CUDA device: this test runs on a GPU machine (scripts/gpu-check)"

const torch::Device kGpu(torch::kCUDA, 0);

torch::nn::Sequential make_mlp() {
  torch::manual_seed(3);
  return torch::nn::Sequential(torch::nn::Linear(32, 256), torch::nn::GELU(),
                               torch::nn::Linear(256, 10));
}

torch::Tensor flat(const torch::nn::Module& m) {
  return accelerant::testing::flat_parameters(m).to(torch::kDouble);
}

std::optional<GraphStepMetrics> metrics_of(const std::string& name) {
  for (const auto& s : metrics().steps) {
    if (s.name == name) return s;
  }
  return std::nullopt;
}

struct TrainingRun {
  torch::Tensor params;
  int64_t optimizer_steps = 0;
  std::vector<bool> skipped;
  double scale = 0;
};

// `compiled`: through accelerator.compile; `poisoned`: the step whose gradients get an inf.
TrainingRun train(bool compiled, MixedPrecision precision, int steps, int poisoned,
                  const std::string& name) {
  Accelerator acc(AcceleratorOptions().fused_optimizers(true).mixed_precision(precision));
  auto model = make_mlp();
  torch::optim::AdamW adamw(model->parameters(), torch::optim::AdamWOptions(1e-3));
  torch::optim::StepLR schedule(adamw, 3, 0.5);
  auto [m, opt, sched] = acc.prepare(model, adamw, schedule);
  auto body = [&, m = m, opt = opt, sched = sched](const GraphStep::Inputs& in) mutable {
    torch::Tensor loss;
    {
      auto autocast = acc.autocast();
      loss = torch::nn::functional::cross_entropy(m->forward(in[0]), in[1]);
    }
    acc.backward(loss);
    // in[2] is 0 or 1 on the device: an inf enters a gradient with no host branch.
    auto& g = m->parameters()[0].mutable_grad();
    g.add_(torch::where(in[2] > 0,
                        torch::full({}, std::numeric_limits<float>::infinity(), g.options()),
                        torch::zeros({}, g.options())));
    opt.step();
    sched.step();
    opt.zero_grad();
    return GraphStep::Outputs{loss.detach()};
  };
  GraphStep step = acc.compile(body, GraphStepOptions().name(name));
  torch::manual_seed(7);
  TrainingRun run;
  for (int i = 0; i < steps; ++i) {
    GraphStep::Inputs in{torch::randn({64, 32}).to(kGpu),
                         torch::randint(0, 10, {64}, torch::kLong).to(kGpu),
                         torch::tensor(i == poisoned ? 1.0f : 0.0f).to(kGpu)};
    if (compiled) {
      step(in);
    } else {
      body(in);
    }
    run.skipped.push_back(opt.step_was_skipped());
  }
  torch::cuda::synchronize();
  run.params = flat(*m);
  run.optimizer_steps = acc.state()->optimizer_steps;
  run.scale = acc.state()->scaler ? acc.state()->scaler->current_scale() : 0;
  return run;
}

}  // namespace

TEST(Gpu, ACompiledWholeStepReplaysCudaGraphsAndTrainsAsTheEagerLoop) {
  SKIP_WITHOUT_GPU();
  const int steps = 16;
  const TrainingRun eager = train(false, MixedPrecision::kNo, steps, -1, "eager-reference");
  const TrainingRun compiled = train(true, MixedPrecision::kNo, steps, -1, "compiled");
  const auto m = metrics_of("compiled");
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->mode, "CUDA graphs");
  EXPECT_EQ(m->replays, steps - GraphStepOptions().warmup_steps());  // the capture's own run counts
  EXPECT_EQ(compiled.optimizer_steps, steps);
  EXPECT_TRUE(torch::allclose(compiled.params, eager.params, 1e-4, 1e-5))
      << "largest difference " << (compiled.params - eager.params).abs().max().item<double>();
  EXPECT_GT((compiled.params - flat(*make_mlp())).abs().max().item<double>(), 1e-3);  // it trained
}

TEST(Gpu, AnInfInjectedAtAReplayedFp16StepIsSkippedCountedAndBacksTheScaleOff) {
  SKIP_WITHOUT_GPU();
  const int steps = 12, poisoned = 8;  // warm-up 0-2, capture 3, replays after
  const TrainingRun eager = train(false, MixedPrecision::kFp16, steps, poisoned, "fp16-eager");
  const TrainingRun compiled = train(true, MixedPrecision::kFp16, steps, poisoned, "fp16-compiled");
  for (const TrainingRun* run : {&eager, &compiled}) {
    const char* what = run == &eager ? "eager" : "compiled";
    EXPECT_EQ(run->optimizer_steps, steps - 1) << what;
    for (int i = 0; i < steps; ++i)
      EXPECT_EQ(run->skipped[i], i == poisoned) << what << " step " << i;
    EXPECT_EQ(run->scale, 65536.0 / 2) << what;
    EXPECT_FALSE(torch::isnan(run->params).any().item<bool>()) << what;
  }
  EXPECT_TRUE(torch::allclose(compiled.params, eager.params, 1e-3, 1e-4))
      << "largest difference " << (compiled.params - eager.params).abs().max().item<double>();
}

TEST(Gpu, TheCapturedScaledUpdateDoesNotWaitForTheDevice) {
  SKIP_WITHOUT_GPU();
  auto model = make_mlp();
  model->to(kGpu);
  torch::optim::AdamW adamw(model->parameters());
  FusedUpdater fused(adamw);
  GradScaler scaler(GradScalerOptions(), kGpu);
  GraphStep step([&](const GraphStep::Inputs& in) {
    auto loss = torch::nn::functional::cross_entropy(model->forward(in[0]), in[1]);
    scaler.scale(loss).backward();
    scaler.step_on_device(fused);
    scaler.update();
    adamw.zero_grad();
    return GraphStep::Outputs{loss.detach()};
  });
  const GraphStep::Inputs in{
      torch::randn({64, 32}, kGpu),
      torch::randint(0, 10, {64}, torch::TensorOptions(torch::kLong).device(kGpu))};
  for (int i = 0; i < 6; ++i) step(in);  // warm-up, capture, replays
  torch::cuda::synchronize();
  // About 0.3 s of queued device work, measured.
  const auto a = torch::randn({4096, 4096}, kGpu);
  auto queue_work = [&] {
    for (int i = 0; i < 40; ++i) a.mm(a);
  };
  using Clock = std::chrono::steady_clock;
  auto t0 = Clock::now();
  queue_work();
  torch::cuda::synchronize();
  const double work = std::chrono::duration<double>(Clock::now() - t0).count();
  queue_work();
  t0 = Clock::now();
  step(in);
  const double replay = std::chrono::duration<double>(Clock::now() - t0).count();
  torch::cuda::synchronize();
  EXPECT_LT(replay, work / 4) << "the replay waited for the device: " << replay << " s behind "
                              << work << " s of queued work";
}
