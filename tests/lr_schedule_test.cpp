// LrSchedule and ScheduledLR: the factors are nanoGPT's get_lr at every step, segments compose,
// bad arguments are refused; the scheduler sets each group's rate from its own base rate, and
// prepared by an Accelerator it counts optimizer updates only (not accumulating micro-steps, not
// fp16 steps skipped for overflow) and resumes from save_state at the step it stopped at.
#include <accelerant/accelerant.h>
#include <accelerant/lr_schedule.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "test_support.h"

using namespace accelerant;
using accelerant::testing::contains;
using accelerant::testing::error_message;
using accelerant::testing::ScratchDir;

namespace {

// nanoGPT's train.py get_lr, transcribed.
double nanogpt_lr(int64_t it) {
  const double learning_rate = 1e-3, min_lr = 1e-4;
  const int64_t warmup_iters = 100, lr_decay_iters = 2000;
  if (it < warmup_iters) return learning_rate * (it + 1) / (warmup_iters + 1);
  if (it > lr_decay_iters) return min_lr;
  const double ratio =
      static_cast<double>(it - warmup_iters) / static_cast<double>(lr_decay_iters - warmup_iters);
  const double coeff = 0.5 * (1.0 + std::cos(M_PI * ratio));
  return min_lr + coeff * (learning_rate - min_lr);
}

std::vector<double> group_lrs(const torch::optim::Optimizer& optimizer) {
  std::vector<double> lrs;
  for (const auto& group : optimizer.param_groups()) lrs.push_back(group.options().get_lr());
  return lrs;
}

// A model in two parameter groups with different base rates, so that a schedule applied with one
// base rate for all would show.
struct TwoGroups {
  torch::nn::Linear model;
  torch::optim::SGD sgd;
  explicit TwoGroups(uint64_t seed)
      : model((torch::manual_seed(seed), torch::nn::Linear(4, 2))),
        sgd(
            std::vector<torch::optim::OptimizerParamGroup>{
                {{model->weight}, std::make_unique<torch::optim::SGDOptions>(0.1)},
                {{model->bias}, std::make_unique<torch::optim::SGDOptions>(0.01)}},
            torch::optim::SGDOptions(0.1)) {}
};

torch::Tensor step_loss(torch::nn::Linear model, int64_t step) {
  torch::manual_seed(500 + step);
  return model->forward(torch::randn({8, 4})).pow(2).mean();
}

}  // namespace

TEST(LrSchedule, WarmupThenCosineIsNanoGptsGetLrAtEveryStep) {
  const auto schedule = LrSchedule::warmup(100).then(LrSchedule::cosine(1900, 0.1));
  EXPECT_EQ(schedule.steps(), 2000);
  for (int64_t it = 0; it <= 2100; ++it)
    ASSERT_NEAR(1e-3 * schedule.factor(it), nanogpt_lr(it), 1e-15) << "step " << it;
}

TEST(LrSchedule, SegmentsFollowOneAnotherAndTheLastValueHolds) {
  // 3 steps at 0.5, a linear from 1 down to 0 over 4 steps, then 0.05 from then on.
  const auto schedule = LrSchedule::constant(0.5, 3)
                            .then(LrSchedule::linear(4, 0.0))
                            .then(LrSchedule::constant(0.05));
  const std::vector<double> expected = {0.5, 0.5, 0.5, 1.0, 0.75, 0.5, 0.25, 0.05, 0.05};
  for (size_t s = 0; s < expected.size(); ++s)
    EXPECT_DOUBLE_EQ(schedule.factor(static_cast<int64_t>(s)), expected[s]) << "step " << s;
  EXPECT_DOUBLE_EQ(schedule.factor(1000), 0.05);
  EXPECT_EQ(schedule.steps(), 7);
  // A linear with an explicit start, and a cosine's midpoint and end.
  EXPECT_DOUBLE_EQ(LrSchedule::linear(10, 1.0, 0.0).factor(3), 0.3);
  EXPECT_DOUBLE_EQ(LrSchedule::cosine(10, 0.2).factor(5), 0.6);
  EXPECT_DOUBLE_EQ(LrSchedule::cosine(10, 0.2).factor(10), 0.2);
  // No segment: factor 1; a warmup of 0 steps: the next segment starts at step 0.
  EXPECT_DOUBLE_EQ(LrSchedule().factor(7), 1.0);
  EXPECT_DOUBLE_EQ(LrSchedule::warmup(0).then(LrSchedule::cosine(10, 0.0)).factor(0), 1.0);
  // The warmup never runs at rate 0 and reaches 1 on the step after it.
  EXPECT_DOUBLE_EQ(LrSchedule::warmup(3).factor(0), 0.25);
  EXPECT_DOUBLE_EQ(LrSchedule::warmup(3).factor(3), 1.0);
}

TEST(LrSchedule, DescribeNamesTheSegments) {
  EXPECT_EQ(LrSchedule::warmup(100).then(LrSchedule::cosine(1900, 0.1)).describe(),
            "warmup 100, then cosine 1900 from 1 to 0.1");
  EXPECT_EQ(LrSchedule::constant(0.5, 3).then(LrSchedule::linear(4, 0.0)).describe(),
            "constant 0.5 for 3, then linear 4 from 1 to 0");
  EXPECT_EQ(LrSchedule().describe(), "constant 1");
}

TEST(LrSchedule, BadArgumentsAreErrors) {
  for (const auto& f : std::vector<std::function<void()>>{
           [] { LrSchedule::warmup(-1); }, [] { LrSchedule::constant(1.0, -1); },
           [] { LrSchedule::linear(0, 0.1); }, [] { LrSchedule::cosine(0, 0.1); },
           [] { LrSchedule::warmup(5).factor(-1); }}) {
    EXPECT_TRUE(contains(error_message(f), "Fix:")) << error_message(f);
  }
  TwoGroups net(1);
  ScheduledLR scheduler(net.sgd, LrSchedule::warmup(2));
  EXPECT_FALSE(error_message([&] { scheduler.lr_at(0, 2); }).empty()) << "group 2 of 2";
  // A group added after the scheduler was made would have no base rate.
  net.sgd.add_param_group({{torch::zeros({1}, torch::requires_grad())}});
  EXPECT_TRUE(contains(error_message([&] { scheduler.step(); }), "add_param_group"));
}

TEST(ScheduledLR, SetsStepZeroAtOnceAndScalesEachGroupsOwnBaseRate) {
  TwoGroups net(1);
  ScheduledLR scheduler(net.sgd, LrSchedule::warmup(3).then(LrSchedule::linear(4, 0.5)));
  EXPECT_EQ(scheduler.base_lrs(), (std::vector<double>{0.1, 0.01}));
  EXPECT_EQ(scheduler.step_count(), 0);
  // Before any update the first step's rate is in force (a quarter of the base rate).
  const std::vector<double> factors = {0.25, 0.5, 0.75, 1.0, 0.875, 0.75, 0.625, 0.5, 0.5};
  for (size_t s = 0; s < factors.size(); ++s) {
    const auto lrs = group_lrs(net.sgd);
    EXPECT_DOUBLE_EQ(lrs[0], 0.1 * factors[s]) << "step " << s;
    EXPECT_DOUBLE_EQ(lrs[1], 0.01 * factors[s]) << "step " << s;
    EXPECT_DOUBLE_EQ(scheduler.lr_at(static_cast<int64_t>(s), 1), lrs[1]);
    scheduler.step();
    EXPECT_EQ(scheduler.step_count(), static_cast<int64_t>(s) + 1);
  }
}

// The scheduler's step() is called on every micro-step, as a loop that does not know about
// accumulation would; prepared, it advances once per optimizer update. The unprepared scheduler
// would advance four times as fast.
TEST(ScheduledLR, PreparedWithAccumulationItAdvancesOncePerFourMicroSteps) {
  Accelerator acc(AcceleratorOptions().cpu(true).gradient_accumulation_steps(4));
  TwoGroups net(1);
  ScheduledLR scheduler(net.sgd, LrSchedule::linear(10, 0.0));
  auto [m, opt, sched] = acc.prepare(net.model, net.sgd, scheduler);
  for (int64_t micro = 1; micro <= 14; ++micro) {
    auto guard = acc.accumulate(m);
    acc.backward(step_loss(m, micro));
    opt.step();
    sched.step();
    opt.zero_grad();
    const int64_t updates = micro / 4;
    ASSERT_EQ(scheduler.step_count(), updates) << "micro-step " << micro;
    ASSERT_EQ(acc.state()->optimizer_steps, updates);
    EXPECT_DOUBLE_EQ(group_lrs(net.sgd)[0], 0.1 * (1.0 - updates / 10.0));
  }
}

// fp16's loss scaler needs no GPU: set on the Accelerator's state it scales, unscales and skips
// an overflowed step on the CPU (as zero_test does). The skipped step must not count.
TEST(ScheduledLR, AnFp16StepSkippedForOverflowDoesNotAdvanceTheSchedule) {
  Accelerator acc(AcceleratorOptions().cpu(true));
  acc.state()->scaler =
      std::make_shared<GradScaler>(GradScalerOptions().init_scale(1024), torch::kCPU);
  TwoGroups net(1);
  ScheduledLR scheduler(net.sgd, LrSchedule::linear(10, 0.0));
  auto [m, opt, sched] = acc.prepare(net.model, net.sgd, scheduler);
  int64_t skipped = 0;
  for (int64_t step = 0; step < 6; ++step) {
    auto loss = step_loss(m, step);
    if (step == 2) loss = loss + m->bias[0] * std::numeric_limits<float>::infinity();
    acc.backward(loss);
    opt.step();
    sched.step();
    opt.zero_grad();
    skipped += opt.step_was_skipped() ? 1 : 0;
    EXPECT_EQ(opt.step_was_skipped(), step == 2) << "step " << step;
  }
  ASSERT_EQ(skipped, 1);
  EXPECT_EQ(scheduler.step_count(), 5);
  EXPECT_DOUBLE_EQ(group_lrs(net.sgd)[0], 0.1 * 0.5);
}

// A run stopped after 5 updates and resumed by a fresh process-worth of objects continues with
// the step count, the rates and the next rates of the run that never stopped.
TEST(ScheduledLR, AResumedScheduleContinuesAtTheStepItStoppedAt) {
  ScratchDir scratch;
  const std::string dir = scratch.path + "/ckpt";
  const auto schedule = LrSchedule::warmup(3).then(LrSchedule::cosine(6, 0.1));
  const int64_t stop = 5, total = 9;
  int64_t count_after_load = -1;
  auto train = [&](Accelerator& acc, TwoGroups& net, ScheduledLR& scheduler, int64_t from,
                   int64_t to, bool save) {
    auto [m, opt, sched] = acc.prepare(net.model, net.sgd, scheduler);
    std::vector<std::vector<double>> lrs;
    if (from > 0) {
      acc.load_state(dir);
      count_after_load = scheduler.step_count();
    }
    for (int64_t step = from; step < to; ++step) {
      lrs.push_back(group_lrs(net.sgd));  // the rate this update uses
      acc.backward(step_loss(m, step));
      opt.step();
      sched.step();
      opt.zero_grad();
      if (save && step + 1 == stop) acc.save_state(dir);
    }
    lrs.push_back(group_lrs(net.sgd));
    return lrs;
  };
  TwoGroups whole_net(1);
  std::vector<std::vector<double>> whole;
  {
    Accelerator first(AcceleratorOptions().cpu(true));
    ScheduledLR whole_scheduler(whole_net.sgd, schedule);
    whole = train(first, whole_net, whole_scheduler, 0, total, true);
  }

  Accelerator second(AcceleratorOptions().cpu(true));
  TwoGroups resumed_net(2);  // other weights: load_state must bring the saved ones
  ScheduledLR resumed_scheduler(resumed_net.sgd, schedule);
  ASSERT_NE(group_lrs(resumed_net.sgd), whole[stop]) << "the fresh scheduler is at step 0";
  const auto resumed = train(second, resumed_net, resumed_scheduler, stop, total, false);
  EXPECT_EQ(count_after_load, stop);
  EXPECT_EQ(resumed_scheduler.step_count(), total);
  for (int64_t step = stop; step <= total; ++step) {
    EXPECT_EQ(resumed[step - stop], whole[step]) << "step " << step;
    EXPECT_DOUBLE_EQ(whole[step][1], resumed_scheduler.lr_at(step, 1)) << "step " << step;
  }
  EXPECT_TRUE(torch::allclose(resumed_net.model->weight, whole_net.model->weight, 0, 1e-7));
}
