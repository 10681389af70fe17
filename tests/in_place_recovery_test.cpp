// In-place recovery (issue 37, Recovery::kReplaceFailedWorker): a worker SIGKILLed in the middle
// of training is replaced alone; the survivors are not restarted, the group forms again with the
// replacement, the replacement takes a survivor's state, the abandoned step is done again from
// its batch, and the run ends bit for bit as the uninterrupted one.
#include <accelerant/accelerant.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <csignal>
#include <fstream>

#include "test_support.h"

using namespace accelerant;
using namespace accelerant::testing;

namespace {

constexpr int64_t kSamples = 96;

// Dropout draws from the global generator: the replacement must draw as the failed one would.
torch::nn::Sequential make_net(int64_t hidden) {
  return torch::nn::Sequential(torch::nn::Linear(8, hidden), torch::nn::ReLU(),
                               torch::nn::Dropout(0.2), torch::nn::Linear(hidden, 3));
}

// What a run varies besides where the victim dies: the hidden layer's width (600 makes the
// gradients 1.4 MiB: two buckets of at most 1 MiB, so that a failure leaves one in flight) and
// the collective timeout (above 10 s the collective watchdog runs beside the recovery).
struct RunShape {
  int64_t hidden = 32;
  std::chrono::seconds collective_timeout{4};
  int64_t step_breakdown_every = 100;  // the step-time exchange, a collective after a step
};

// Where the victim dies: between a step's forward and backward, inside its backward (while the
// others wait in the gradients' all-reduce), between its backward and its optimizer step (the
// others then wait in the step-time exchange, when one falls on that step), or as the others save
// a checkpoint after the step.
enum class Death { kBeforeBackward, kInBackward, kAfterBackward, kDuringSave };

// Three epochs of SGD with momentum, a step schedule and a shuffled loader, with a checkpoint
// saved into `dir` after step 5. In generation 0, rank `victim` SIGKILLs itself where `death`
// says, in the step after `kill_after` steps (-1: nobody); in generation 1, rank `second_victim`
// before the backward of the step after `second_after` steps. Records each process's pid in `dir`.
// Returns the final parameters, then the generation, the optimizer steps taken and whether the
// save after step 5 wrote a checkpoint.
torch::Tensor train(const std::string& dir, int victim, int64_t kill_after,
                    Death death = Death::kBeforeBackward, int second_victim = -1,
                    int64_t second_after = -1, RunShape shape = {}) {
  std::ofstream(dir + "/pid." + std::to_string(::getpid())) << ::getpid();
  Accelerator acc(AcceleratorOptions()
                      .seed(11)
                      .fused_optimizers(false)
                      .project_dir(dir + "/project")
                      .log_with({"csv"})
                      .bucket_cap_mb(1)
                      .step_breakdown_every(shape.step_breakdown_every));
  acc.init_trackers("run", {});
  torch::manual_seed(3);
  auto net = make_net(shape.hidden);
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  torch::optim::StepLR schedule(sgd, 4, 0.5);
  torch::manual_seed(5);
  auto x = torch::randn({kSamples, 8});
  auto y = torch::randint(0, 3, {kSamples}, torch::kLong);
  auto [model, opt, sched, loader] = acc.prepare(
      net, sgd, schedule, make_data_loader(x, y, DataLoaderOptions().batch_size(8).shuffle(true)));
  auto& process = ProcessState::get();
  auto dies_now = [&](Death where) {
    const int64_t steps = acc.state()->optimizer_steps;
    if (process.restart_count() == 1 && where == Death::kBeforeBackward &&
        acc.rank() == second_victim && steps == second_after) {
      return true;
    }
    return where == death && process.restart_count() == 0 && acc.rank() == victim &&
           steps == kill_after;
  };
  // The first layer's gradient comes last in backward, when the rest of the gradients are ready.
  model->parameters()[0].register_hook([&](torch::Tensor grad) {
    if (dies_now(Death::kInBackward)) ::raise(SIGKILL);
    return grad;
  });
  double saved = -1;
  while (loader.epoch() < 3) {
    for (auto& batch : loader) {
      // Gradients cleared first: a save after the step sees that step's (the in-place recovery
      // of a save must not take them for gradient accumulation in progress).
      opt.zero_grad();
      auto loss = torch::nn::functional::cross_entropy(model->forward(batch.data), batch.target);
      if (dies_now(Death::kBeforeBackward)) ::raise(SIGKILL);
      acc.backward(loss);
      if (dies_now(Death::kAfterBackward)) ::raise(SIGKILL);
      opt.step();
      sched.step();
      if (acc.state()->optimizer_steps == 5) {
        if (dies_now(Death::kDuringSave)) ::raise(SIGKILL);
        saved = acc.save_state(dir + "/step_5").empty() ? 0 : 1;
      }
    }
  }
  torch::Tensor flat;
  {
    std::vector<torch::Tensor> parts;
    for (const auto& p : model->parameters()) parts.push_back(p.detach().reshape(-1));
    flat = torch::cat(parts);
  }
  return torch::cat({flat.to(torch::kDouble),
                     torch::tensor({static_cast<double>(process.restart_count()),
                                    static_cast<double>(acc.state()->optimizer_steps), saved},
                                   torch::kDouble)});
}

// A run's result (its parameters, then `tail` counters: the generation, the optimizer steps and
// for train() whether a save wrote) ends as `uninterrupted`'s parameters, bit for bit, in
// `generation` after `steps` steps.
void expect_ends_as(const torch::Tensor& result, const torch::Tensor& uninterrupted, int64_t tail,
                    double generation, double steps) {
  const int64_t n = result.numel();
  EXPECT_EQ(result[n - tail].item<double>(), generation);
  EXPECT_EQ(result[n - tail + 1].item<double>(), steps);
  EXPECT_TRUE(torch::equal(result.narrow(0, 0, n - tail), uninterrupted.narrow(0, 0, n - tail)));
}

LaunchOptions in_place(int n, std::chrono::seconds collective_timeout = std::chrono::seconds(4)) {
  return LaunchOptions()
      .processes_per_node(n)
      .collective_timeout(collective_timeout)
      .max_restarts(1)
      .recovery(Recovery::kReplaceFailedWorker)
      .verbose(false);
}

void recovers_bit_for_bit(int processes, int victim, int64_t kill_after, int64_t steps,
                          Death death = Death::kBeforeBackward, RunShape shape = {}) {
  const std::string clean_dir = make_temp_dir(), failed_dir = make_temp_dir();
  const auto uninterrupted =
      launch([&](int) { return train(clean_dir, -1, -1, death, -1, -1, shape); },
             in_place(processes, shape.collective_timeout));
  const auto start = std::chrono::steady_clock::now();
  const auto recovered =
      launch([&](int) { return train(failed_dir, victim, kill_after, death, -1, -1, shape); },
             in_place(processes, shape.collective_timeout));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (int r = 0; r < processes; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    const int64_t n = uninterrupted[r].numel();
    EXPECT_EQ(uninterrupted[r][n - 3].item<double>(), 0.0);
    EXPECT_EQ(recovered[r][n - 3].item<double>(), 1.0) << "generation 1: one regroup";
    EXPECT_EQ(recovered[r][n - 2].item<double>(), static_cast<double>(steps));
    EXPECT_EQ(uninterrupted[r][n - 1].item<double>(), 1.0) << "the save after step 5 wrote";
    // The survivors abandoned a save during which a process died; a replacement that joined
    // after step 5 never reached that save.
    const double saved =
        r == victim ? (kill_after >= 5 ? -1.0 : 1.0) : (death == Death::kDuringSave ? 0.0 : 1.0);
    EXPECT_EQ(recovered[r][n - 1].item<double>(), saved);
    const torch::Tensor got = recovered[r].narrow(0, 0, n - 3);
    const torch::Tensor want = uninterrupted[r].narrow(0, 0, n - 3);
    EXPECT_TRUE(torch::equal(got, want))
        << "max difference " << (got - want).abs().max().item<double>();
  }
  // The membership change is in the trackers, at the step the run went on from; the survivors'
  // main process also logs how long it took and what was done again.
  const std::string scalars = slurp(failed_dir + "/project/run/scalars.csv");
  // A death after backward is met by the next step's backward: that step is done again.
  const int64_t resumed_at = death == Death::kDuringSave      ? 5
                             : death == Death::kAfterBackward ? kill_after + 1
                                                              : kill_after;
  EXPECT_TRUE(contains(scalars, std::to_string(resumed_at) + ",recovery/generation,1\n"))
      << scalars;
  if (victim != 0) {
    EXPECT_TRUE(contains(scalars, std::to_string(resumed_at) + ",recovery/steps_done_again," +
                                      (death == Death::kDuringSave ? "0" : "1") + "\n"))
        << scalars;
    EXPECT_TRUE(contains(scalars, ",recovery/seconds_to_resume,")) << scalars;
  }
  // Each worker started once, and one replacement: the survivors were not restarted.
  const auto pids = read_pid_files(failed_dir);
  EXPECT_EQ(pids.size(), static_cast<size_t>(processes + 1));
  EXPECT_TRUE(wait_until_dead(pids, std::chrono::milliseconds(0)).empty()) << "orphan workers";
  EXPECT_LT(seconds, 60.0) << "bounded";
  remove_tree(clean_dir);
  remove_tree(failed_dir);
}

}  // namespace

TEST(InPlaceRecovery, AWorkerKilledMidStepOnTwoProcessesIsReplacedAndTheRunEndsBitForBit) {
  // 96 samples / (8 x 2) = 6 steps per epoch: step 8 is in the middle of the second epoch.
  recovers_bit_for_bit(2, 1, 7, 18);
}

TEST(InPlaceRecovery, AWorkerKilledMidStepOnFourProcessesIsReplacedAndTheRunEndsBitForBit) {
  recovers_bit_for_bit(4, 2, 4, 9);
}

TEST(InPlaceRecovery, AWorkerKilledInBackwardWhileTheOthersAllReduce) {
  recovers_bit_for_bit(2, 1, 7, 18, Death::kInBackward);
  recovers_bit_for_bit(4, 3, 4, 9, Death::kInBackward);
}

TEST(InPlaceRecovery, AWorkerKilledAsTheOthersSaveAbandonsTheSaveAndTrainingGoesOn) {
  recovers_bit_for_bit(2, 1, 5, 18, Death::kDuringSave);
  recovers_bit_for_bit(4, 0, 5, 9, Death::kDuringSave);
}

// Gradients in two buckets, one still in flight when the peer dies, and the collective watchdog
// running (a 30 s timeout): neither gets in the recovery's way.
TEST(InPlaceRecovery, TwoBucketsAndTheWatchdogRunning) {
  RunShape shape;
  shape.hidden = 600;
  shape.collective_timeout = std::chrono::seconds(30);
  recovers_bit_for_bit(2, 1, 7, 18, Death::kInBackward, shape);
  recovers_bit_for_bit(4, 2, 4, 9, Death::kBeforeBackward, shape);
}

// The victim dies after its backward, as the others wait in the step-time exchange after step 8
// (step_breakdown_every 4): they skip that exchange, the next step's backward meets the broken
// group and recovers, and the run still ends bit for bit.
TEST(InPlaceRecovery, AWorkerKilledAsTheOthersExchangeStepTimes) {
  RunShape shape;
  shape.step_breakdown_every = 4;
  recovers_bit_for_bit(2, 1, 7, 18, Death::kAfterBackward, shape);
  recovers_bit_for_bit(4, 0, 7, 9, Death::kAfterBackward, shape);
}

// Two failures, one after the other, within max_restarts, each recovered in place: rank 1 in
// generation 0, then rank 0 (the main process) in generation 1.
TEST(InPlaceRecovery, RepeatedFailuresWithinMaxRestartsAreEachRecovered) {
  const std::string clean_dir = make_temp_dir(), failed_dir = make_temp_dir();
  const auto options = in_place(2).max_restarts(2);
  const auto uninterrupted = launch([&](int) { return train(clean_dir, -1, -1); }, options);
  const auto recovered =
      launch([&](int) { return train(failed_dir, 1, 3, Death::kBeforeBackward, 0, 11); }, options);
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    expect_ends_as(recovered[r], uninterrupted[r], 3, 2.0, 18.0);  // generation 2: two regroups
  }
  EXPECT_EQ(read_pid_files(failed_dir).size(), 4u) << "2 workers and 2 replacements";
  EXPECT_TRUE(wait_until_dead(read_pid_files(failed_dir), std::chrono::milliseconds(0)).empty());
  remove_tree(clean_dir);
  remove_tree(failed_dir);
}

// Over Gloo alone, the main process (rank 0) the one that dies: its replacement takes rank 1's
// state.
TEST(InPlaceRecovery, OverGlooTheMainProcessKilledIsReplacedToo) {
  ::setenv("ACCELERANT_SHM_ALLREDUCE", "0", 1);
  recovers_bit_for_bit(4, 0, 4, 9);
  recovers_bit_for_bit(2, 0, 7, 18, Death::kInBackward);
  ::unsetenv("ACCELERANT_SHM_ALLREDUCE");
}

// Under ZeRO each process holds only its shard of the state, which a replacement could not take
// from a survivor: the recovery falls back to the last checkpoint and says so. Rank 1 dies after
// step 7; the whole group restarts (new processes), resumes from the checkpoint of step 5 and
// ends as the uninterrupted run.
namespace {

torch::Tensor train_sharded(const std::string& dir, int stage, int victim) {
  std::ofstream(dir + "/pid." + std::to_string(::getpid())) << ::getpid();
  Accelerator acc(AcceleratorOptions()
                      .seed(11)
                      .fused_optimizers(false)
                      .zero_stage(stage)
                      .project_dir(dir + "/project")
                      .auto_resume(true));
  torch::manual_seed(3);
  auto net = make_net(32);
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  torch::manual_seed(5);
  auto x = torch::randn({kSamples, 8});
  auto y = torch::randint(0, 3, {kSamples}, torch::kLong);
  auto [model, opt, loader] = acc.prepare(
      net, sgd, make_data_loader(x, y, DataLoaderOptions().batch_size(8).shuffle(true)));
  while (loader.epoch() < 3) {
    for (auto& batch : loader) {
      opt.zero_grad();
      auto loss = torch::nn::functional::cross_entropy(model->forward(batch.data), batch.target);
      if (ProcessState::get().restart_count() == 0 && acc.rank() == victim &&
          acc.state()->optimizer_steps == 7) {
        ::raise(SIGKILL);
      }
      acc.backward(loss);
      opt.step();
      if (acc.state()->optimizer_steps == 5) acc.save_state();
    }
  }
  std::vector<torch::Tensor> parts;
  for (const auto& p : model->parameters()) parts.push_back(p.detach().reshape(-1));
  parts.push_back(torch::tensor({static_cast<float>(ProcessState::get().restart_count()),
                                 static_cast<float>(acc.state()->optimizer_steps)}));
  return torch::cat(parts);
}

}  // namespace

class ZeroUnderInPlaceRecovery : public ::testing::TestWithParam<int> {};

TEST_P(ZeroUnderInPlaceRecovery, FallsBackToTheLastCheckpointAndSaysSo) {
  const int stage = GetParam();
  const std::string clean_dir = make_temp_dir(), failed_dir = make_temp_dir();
  const auto options = in_place(2).verbose(true);
  const auto uninterrupted =
      launch([&](int) { return train_sharded(clean_dir, stage, -1); }, options);
  ::testing::internal::CaptureStdout();
  ::testing::internal::CaptureStderr();
  const auto restarted = launch([&](int) { return train_sharded(failed_dir, stage, 1); }, options);
  const std::string said =
      ::testing::internal::GetCapturedStdout() + ::testing::internal::GetCapturedStderr();
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    expect_ends_as(restarted[r], uninterrupted[r], 2, 1.0, 18.0);  // generation 1: one restart
  }
  // Said by the workers as they start, and by the launcher as it restarts them.
  EXPECT_TRUE(contains(said,
                       "In-place recovery (Recovery::kReplaceFailedWorker) falls back to "
                       "the last checkpoint: under ZeRO stage " +
                           std::to_string(stage)))
      << said;
  EXPECT_TRUE(contains(said, "The failed worker is not replaced in place: under ZeRO stage"))
      << said;
  EXPECT_TRUE(contains(said, "The group restarts from the last checkpoint instead.")) << said;
  const auto pids = read_pid_files(failed_dir);
  EXPECT_EQ(pids.size(), 4u) << "2 workers, then 2 again: the whole group restarted";
  EXPECT_TRUE(wait_until_dead(pids, std::chrono::milliseconds(0)).empty()) << "orphan workers";
  remove_tree(clean_dir);
  remove_tree(failed_dir);
}

INSTANTIATE_TEST_SUITE_P(Stages, ZeroUnderInPlaceRecovery, ::testing::Values(1, 2));

// A loop without a prepared data loader, which the recovery could neither rewind nor hand over, is
// refused at its first backward, with the fix.
TEST(InPlaceRecovery, ALoopWithoutAPreparedLoaderIsRefusedWithTheFix) {
  const std::string error = error_message([] {
    launch(
        [](int) {
          Accelerator acc;
          auto net = make_net(8);
          torch::optim::SGD sgd(net->parameters(), 0.1);
          auto [model, opt] = acc.prepare(net, sgd);
          acc.backward(model->forward(torch::randn({4, 8})).sum());
          return 0;
        },
        in_place(2).max_restarts(0));
  });
  EXPECT_TRUE(contains(error, "without a prepared data loader")) << error;
  EXPECT_TRUE(contains(error, "Fix: prepare the loader")) << error;
}
