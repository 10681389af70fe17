// The host side of a captured step, checked on the CPU with replay emulation
// (GraphStepOptions::emulate_replays): after a signature's first step, the step's host-side
// bookkeeping is not run inline but from what was recorded, as a GPU replay does. A whole
// Accelerator step (accumulation, fused AdamW, a scheduler, fp16 loss scaling with an injected
// inf) must then train exactly as the eager loop and keep the same counters; what a capture
// cannot do (host reads, host-computed step sizes) is refused with the fix.
#include <accelerant/accelerant.h>
#include <gtest/gtest.h>

#include <limits>

#include "test_support.h"

using namespace accelerant;
using accelerant::testing::error_message;

namespace {

using accelerant::testing::contains;
using accelerant::testing::small_mlp;

using accelerant::testing::flat_parameters;

struct Batches {
  std::vector<torch::Tensor> x, y;
};

Batches make_batches(int n, uint64_t seed) {
  torch::manual_seed(seed);
  Batches b;
  for (int i = 0; i < n; ++i) {
    b.x.push_back(torch::randn({6, 8}));
    b.y.push_back(torch::randint(0, 3, {6}, torch::kLong));
  }
  return b;
}

// What a run leaves behind: the parameters, then [optimizer steps, lr, micro-steps, signatures].
// On the CPU on a GPU machine too (cpu(true)): this is the emulation, and it must not touch CUDA,
// or a later test's fork would inherit the CUDA context (tests/gpu_test.cpp replays on the GPU).
torch::Tensor train_accelerated(bool compiled, int steps, uint64_t data_seed) {
  Accelerator acc(
      AcceleratorOptions().cpu(true).fused_optimizers(true).gradient_accumulation_steps(2));
  auto model = small_mlp();
  torch::optim::AdamW adamw(model->parameters(),
                            torch::optim::AdamWOptions(1e-2).weight_decay(0.1));
  torch::optim::StepLR schedule(adamw, 2, 0.5);
  auto [m, opt, sched] = acc.prepare(model, adamw, schedule);
  auto body = [&, m = m, opt = opt, sched = sched](const GraphStep::Inputs& in) mutable {
    auto loss = torch::nn::functional::cross_entropy(m->forward(in[0]), in[1]);
    acc.backward(loss);
    opt.step();
    sched.step();
    opt.zero_grad();
    return GraphStep::Outputs{loss.detach()};
  };
  const Batches data = make_batches(steps, data_seed);
  int64_t signatures = 0;
  if (compiled) {
    GraphStep step = acc.compile(body, GraphStepOptions().name("replayed").emulate_replays(true));
    for (int i = 0; i < steps; ++i) step({data.x[i], data.y[i]});
    signatures = step.signatures();
  } else {
    for (int i = 0; i < steps; ++i) {
      auto guard = acc.accumulate(m);
      body({data.x[i], data.y[i]});
    }
  }
  auto tail = torch::tensor(
      {static_cast<double>(acc.state()->optimizer_steps),
       adamw.param_groups()[0].options().get_lr(), static_cast<double>(acc.state()->micro_steps),
       static_cast<double>(signatures)},
      torch::kDouble);
  return torch::cat({flat_parameters(*m).to(torch::kDouble), tail});
}

void expect_same_training(const torch::Tensor& compiled, const torch::Tensor& eager,
                          const char* what) {
  const int64_t n = eager.numel() - 4;
  auto cp = compiled.slice(0, 0, n), ep = eager.slice(0, 0, n);
  // The emulated replays take the fused update's device path, the eager loop its CPU loop: the
  // two agree to float rounding.
  EXPECT_TRUE(torch::allclose(cp, ep, 1e-5, 1e-6))
      << what << ": largest difference " << (cp - ep).abs().max().item<double>();
  EXPECT_EQ(compiled[n].item<double>(), eager[n].item<double>()) << what << ": optimizer steps";
  EXPECT_DOUBLE_EQ(compiled[n + 1].item<double>(), eager[n + 1].item<double>())
      << what << ": the scheduled lr";
  EXPECT_EQ(compiled[n + 2].item<double>(), eager[n + 2].item<double>()) << what << ": micro-steps";
}

}  // namespace

TEST(GraphReplay, AWholeAcceleratorStepWithAccumulationAndASchedulerTrainsAsTheEagerLoop) {
  const int steps = 12;
  const auto eager = train_accelerated(false, steps, 21);
  const auto compiled = train_accelerated(true, steps, 21);
  expect_same_training(compiled, eager, "one process");
  const int64_t n = eager.numel() - 4;
  EXPECT_EQ(eager[n].item<double>(), steps / 2);  // one update per two micro-steps
  // LibTorch's StepLR(2, 0.5) halves on its 3rd and 5th step: twice in 6 updates.
  EXPECT_DOUBLE_EQ(eager[n + 1].item<double>(), 1e-2 / 4);
  EXPECT_EQ(compiled[n + 3].item<double>(), 2);  // accumulate and sync: two graphs
  // The parameters moved: a comparison of untrained models would prove nothing.
  EXPECT_GT((compiled.slice(0, 0, n) - flat_parameters(*small_mlp()).to(torch::kDouble))
                .abs()
                .max()
                .item<double>(),
            1e-3);
}

TEST(GraphReplay, OnTwoRanksTheReplayedStepAveragesGradientsAsTheEagerLoop) {
  auto options = LaunchOptions()
                     .processes_per_node(2)
                     .collective_timeout(std::chrono::seconds(60))
                     .verbose(false);
  auto compiled = launch([](int rank) { return train_accelerated(true, 8, 40 + rank); }, options);
  auto eager = launch([](int rank) { return train_accelerated(false, 8, 40 + rank); }, options);
  ASSERT_EQ(compiled.size(), 2u);
  expect_same_training(compiled[0], eager[0], "rank 0");
  expect_same_training(compiled[1], eager[1], "rank 1");
  // Both ranks hold the same parameters: the gradients were averaged on every update.
  const int64_t n = eager[0].numel() - 4;
  EXPECT_TRUE(torch::equal(compiled[0].slice(0, 0, n), compiled[1].slice(0, 0, n)));
}

// fp16 loss scaling on the CPU (the Accelerator refuses fp16 there, so the pieces are put
// together by hand): a gradient made inf on the device at step `poisoned`, which is a replay.
struct ScaledRun {
  torch::Tensor params;
  std::vector<bool> skipped;  // step_was_skipped after each step
  int64_t optimizer_steps = 0;
  double scale = 0;
};

ScaledRun train_scaled(bool replayed, int steps, int poisoned) {
  auto model = small_mlp();
  torch::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(1e-2));
  auto fused = std::make_shared<FusedUpdater>(adam);
  auto state = std::make_shared<TrainingState>();
  state->scaler = std::make_shared<GradScaler>(GradScalerOptions().init_scale(1024));
  PreparedOptimizer opt(adam, state, fused);
  auto body = [&](const GraphStep::Inputs& in) {
    auto loss = torch::nn::functional::cross_entropy(model->forward(in[0]), in[1]);
    state->scaler->scale(loss).backward();
    // in[2] is 0 or 1: inf enters a gradient with no host branch, as it would on a GPU.
    auto& g = model->parameters()[0].mutable_grad();
    g.add_(torch::where(in[2] > 0, torch::full({}, std::numeric_limits<float>::infinity()),
                        torch::zeros({})));
    opt.step();
    opt.zero_grad();
    return GraphStep::Outputs{loss.detach()};
  };
  const Batches data = make_batches(steps, 9);
  GraphStep step(body, GraphStepOptions().name("scaled").emulate_replays(true));
  ScaledRun run;
  for (int i = 0; i < steps; ++i) {
    GraphStep::Inputs in{data.x[i], data.y[i], torch::tensor(i == poisoned ? 1.0f : 0.0f)};
    if (replayed) {
      step(in);
    } else {
      body(in);
    }
    run.skipped.push_back(opt.step_was_skipped());
  }
  run.params = flat_parameters(*model);
  run.optimizer_steps = state->optimizer_steps;
  run.scale = state->scaler->current_scale();
  return run;
}

TEST(GraphReplay, AnInfInjectedIntoAReplayedFp16StepIsSkippedAndCountedAfterTheStep) {
  const int steps = 8, poisoned = 5;  // step 0 records; step 5 is a replay
  const ScaledRun eager = train_scaled(false, steps, poisoned);
  const ScaledRun replayed = train_scaled(true, steps, poisoned);
  for (const ScaledRun* run : {&eager, &replayed}) {
    const char* what = run == &eager ? "eager" : "replayed";
    EXPECT_EQ(run->optimizer_steps, steps - 1) << what;
    for (int i = 0; i < steps; ++i)
      EXPECT_EQ(run->skipped[i], i == poisoned) << what << " step " << i;
    EXPECT_EQ(run->scale, 512.0) << what << ": halved once by the overflow";
    EXPECT_FALSE(torch::isnan(run->params).any().item<bool>())
        << what << ": the inf leaked into the parameters";
  }
  EXPECT_TRUE(torch::allclose(replayed.params, eager.params, 1e-5, 1e-6))
      << "largest difference " << (replayed.params - eager.params).abs().max().item<float>();
}

TEST(GraphReplay, TheScalersStateIsUpdatedInPlaceSoThatACapturedStepKeepsReadingIt) {
  auto model = small_mlp();
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
  FusedUpdater fused(sgd);
  GradScaler scaler(GradScalerOptions().init_scale(8).growth_interval(1));
  const void* scale = scaler.scale_tensor().data_ptr();
  const void* found_inf = scaler.found_inf().data_ptr();
  for (int i = 0; i < 3; ++i) {
    scaler.scale(model->forward(torch::randn({2, 8})).sum()).backward();
    scaler.step_on_device(fused);
    scaler.update();
    sgd.zero_grad();
  }
  EXPECT_EQ(scaler.current_scale(), 64.0);  // grew every clean step
  EXPECT_EQ(scaler.scale_tensor().data_ptr(), scale);
  EXPECT_EQ(scaler.found_inf().data_ptr(), found_inf);
}

TEST(GraphReplay, StepClosuresAddedInsideTheStepRunAfterEveryStepWithThatStepsValues) {
  std::vector<float> logged, returned;
  GraphStep step(
      [&](const GraphStep::Inputs& in) {
        auto total = in[0].sum();
        add_step_closure([&logged, total] { logged.push_back(total.item<float>()); });
        return GraphStep::Outputs{total};
      },
      GraphStepOptions().emulate_replays(true));
  for (int i = 0; i < 5; ++i)
    returned.push_back(step({torch::full({3}, static_cast<float>(i))})[0].item<float>());
  EXPECT_EQ(logged, returned);
  EXPECT_EQ(logged, (std::vector<float>{0, 3, 6, 9, 12}));
}

TEST(GraphReplay, WhatACaptureCannotDoIsRefusedWithTheFix) {
  auto model = small_mlp();
  torch::optim::Adam adam(model->parameters());
  auto state = std::make_shared<TrainingState>();
  PreparedOptimizer unfused(adam, state);
  const auto x = torch::randn({4, 8});
  auto in_a_graph_step = [&](std::function<void()> body) {
    GraphStep step(
        [&](const GraphStep::Inputs&) {
          body();
          return GraphStep::Outputs{};
        },
        GraphStepOptions().emulate_replays(true));
    return error_message([&] { step({x}); });
  };
  auto backward = [&] { model->forward(x).sum().backward(); };

  auto message = in_a_graph_step([&] {
    backward();
    unfused.step();
  });
  EXPECT_TRUE(contains(message, "unfused")) << message;
  EXPECT_TRUE(contains(message, "fused_optimizers(true)")) << message;
  EXPECT_EQ(state->optimizer_steps, 0);

  FusedUpdater fused(adam);
  GradScaler scaler;
  message = in_a_graph_step([&] {
    backward();
    scaler.step(fused);
  });
  EXPECT_TRUE(contains(message, "step_on_device")) << message;
  torch::optim::Adam plain_adam(model->parameters());  // no fused update bound to it
  message = in_a_graph_step([&] {
    backward();
    scaler.step(plain_adam);
  });
  EXPECT_TRUE(contains(message, "found_inf on the host")) << message;

  Accelerator acc(AcceleratorOptions().gradient_accumulation_steps(2));
  auto prepared = acc.prepare(small_mlp());
  message = in_a_graph_step([&] { auto guard = acc.accumulate(prepared); });
  EXPECT_TRUE(contains(message, "accelerator.compile")) << message;
  message = in_a_graph_step([&] {
    backward();
    acc.clip_grad_norm_(model->parameters(), 1.0);
  });
  EXPECT_TRUE(contains(message, "clip_grad_norm_tensor")) << message;
  EXPECT_TRUE(contains(error_message([&] {
                         acc.compile(
                             [](const GraphStep::Inputs&) { return GraphStep::Outputs{}; },
                             GraphStepOptions().phase([] { return GraphStepOptions::Phase{}; }));
                       }),
                       "sets GraphStepOptions::phase itself"));

  GraphStep inner([](const GraphStep::Inputs&) { return GraphStep::Outputs{}; },
                  GraphStepOptions().emulate_replays(true));
  message = in_a_graph_step([&] { inner({x}); });
  EXPECT_TRUE(contains(message, "inside another graph step")) << message;
}

TEST(GraphReplay, ClipGradNormTensorClipsAsClipGradNormWithoutAHostRead) {
  Accelerator acc;
  for (double norm_type : {2.0, 1.0, std::numeric_limits<double>::infinity()}) {
    for (double max_norm : {0.05, 1e3}) {  // clipping, and not
      auto a = small_mlp(), b = small_mlp();
      const auto x = torch::randn({4, 8});
      a->forward(x).pow(2).sum().backward();
      b->forward(x).pow(2).sum().backward();
      const double expected =
          torch::nn::utils::clip_grad_norm_(a->parameters(), max_norm, norm_type);
      const torch::Tensor got = acc.clip_grad_norm_tensor(b->parameters(), max_norm, norm_type);
      EXPECT_NEAR(got.item<double>(), expected, 1e-5 * expected) << "norm " << norm_type;
      for (size_t i = 0; i < a->parameters().size(); ++i) {
        EXPECT_TRUE(
            torch::allclose(a->parameters()[i].grad(), b->parameters()[i].grad(), 1e-5, 1e-7))
            << "norm " << norm_type << " max " << max_norm << " parameter " << i;
      }
    }
  }
}
