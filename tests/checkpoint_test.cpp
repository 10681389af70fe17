// save_state / load_state: every piece of state round-trips; a run resumed mid-epoch on 2
// processes ends bit-identical to the uninterrupted run (also after a restart by the launcher,
// with auto_resume); resuming on another number of processes neither skips nor repeats a sample;
// damaged, mismatched or unknown checkpoints are refused without changing anything; total_limit
// removes old checkpoints only once the new one is complete.
#include <accelerant/accelerant.h>
#include <accelerant/checkpoint.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <csignal>
#include <fstream>
#include <set>

#include "test_support.h"

using namespace accelerant;
using accelerant::testing::make_temp_dir;
using accelerant::testing::remove_tree;
using accelerant::testing::ScratchDir;

namespace {

LaunchOptions ranks(int n) {
  return LaunchOptions()
      .processes_per_node(n)
      .collective_timeout(std::chrono::seconds(60))
      .verbose(false);
}

using accelerant::testing::contains;

// A user object registered for checkpointing.
struct Counter {
  int64_t value = 0;
  void save(torch::serialize::OutputArchive& a) const { a.write("value", torch::tensor(value)); }
  void load(torch::serialize::InputArchive& a) {
    torch::Tensor t;
    a.read("value", t);
    value = t.item<int64_t>();
  }
};

torch::nn::Sequential make_net(int64_t hidden = 32) {
  // Dropout draws from the global generator: resuming must restore it too.
  return torch::nn::Sequential(torch::nn::Linear(8, hidden), torch::nn::ReLU(),
                               torch::nn::Dropout(0.2), torch::nn::Linear(hidden, 3));
}

torch::Tensor flat_parameters(const torch::nn::Module& m) {
  std::vector<torch::Tensor> parts;
  for (const auto& p : m.parameters()) parts.push_back(p.detach().reshape({-1}).clone());
  return torch::cat(parts);
}

std::string optimizer_bytes(const torch::optim::Optimizer& o) {
  torch::serialize::OutputArchive a;
  o.save(a);
  std::ostringstream out;
  a.save_to(out);
  return out.str();
}

constexpr int64_t kSamples = 96;

// What run_training prepared, for a `before` that changes it.
struct PreparedRun {
  Accelerator& acc;
  torch::nn::Module& model;
  torch::optim::SGD& sgd;
  PreparedScheduler& sched;
  DataLoader& loader;
};

// One training run on fixed data: `epochs` epochs, SGD with momentum, a step LR schedule, a
// shuffled loader. `before` runs after prepare; `after_step` after each optimizer step, and
// ends the run early by returning true. Returns the final parameters.
torch::Tensor run_training(const AcceleratorOptions& options, int64_t epochs,
                           const std::function<void(PreparedRun&)>& before,
                           const std::function<bool(Accelerator&)>& after_step) {
  Accelerator acc(options);
  auto net = make_net();
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  torch::optim::StepLR schedule(sgd, 4, 0.5);
  torch::manual_seed(5);
  auto x = torch::randn({kSamples, 8});
  auto y = torch::randint(0, 3, {kSamples}, torch::kLong);
  torch::manual_seed(11 + acc.rank());
  auto [model, opt, sched, loader] = acc.prepare(
      net, sgd, schedule, make_data_loader(x, y, DataLoaderOptions().batch_size(8).shuffle(true)));
  PreparedRun run{acc, *model, sgd, sched, loader};
  before(run);
  while (loader.epoch() < epochs) {
    for (auto& batch : loader) {
      acc.backward(torch::nn::functional::cross_entropy(model->forward(batch.data), batch.target));
      opt.step();
      opt.zero_grad();
      sched.step();
      if (after_step(acc)) return flat_parameters(*model);
    }
  }
  return flat_parameters(*model);
}

// run_training with a `before` that needs only the Accelerator.
torch::Tensor run_training(const AcceleratorOptions& options, int64_t epochs,
                           const std::function<void(Accelerator&)>& before,
                           const std::function<bool(Accelerator&)>& after_step) {
  return run_training(
      options, epochs, [&](PreparedRun& run) { before(run.acc); }, after_step);
}

// With `stop_after` >= 0 it saves into `dir` after that many steps and stops; with `resume` it
// first loads `dir`. `fused`: prepare steps the SGD with the fused update.
torch::Tensor train(const std::string& dir, int64_t stop_after, bool resume, int64_t epochs = 3,
                    bool fused = false) {
  return run_training(
      AcceleratorOptions().seed(11).fused_optimizers(fused), epochs,
      [&](Accelerator& acc) {
        if (resume) acc.load_state(dir);
      },
      [&](Accelerator& acc) {
        if (acc.state()->optimizer_steps != stop_after) return false;
        acc.save_state(dir);
        return true;
      });
}

}  // namespace

TEST(Checkpoint, EveryPieceOfStateRoundTrips) {
  ScratchDir scratch;
  const std::string dir = scratch.path + "/ckpt";
  auto results = launch(
      [dir](int) {
        Accelerator acc(AcceleratorOptions().seed(3));
        auto net = make_net();
        torch::optim::Adam adam(net->parameters(), torch::optim::AdamOptions(1e-2));
        torch::optim::StepLR schedule(adam, 2, 0.5);
        auto x = torch::randn({40, 8});
        auto y = torch::randint(0, 3, {40}, torch::kLong);
        Counter counter;
        acc.register_for_checkpointing(counter);
        auto [model, opt, sched, loader] =
            acc.prepare(net, adam, schedule,
                        make_data_loader(x, y, DataLoaderOptions().batch_size(4).shuffle(true)));
        auto train_steps = [&](int n) {
          int done = 0;
          while (done < n) {
            for (auto& b : loader) {
              acc.backward(torch::nn::functional::cross_entropy(model->forward(b.data), b.target));
              opt.step();
              opt.zero_grad();
              sched.step();
              ++counter.value;
              if (++done == n) break;
            }
          }
        };
        train_steps(13);  // into the second epoch
        acc.save_state(dir);
        const auto params = flat_parameters(*model);
        const auto adam_state = optimizer_bytes(adam);
        const double lr = adam.param_groups()[0].options().get_lr();
        const auto position = loader.position();
        const auto draw = torch::rand({4});  // the generator right after saving
        const int64_t steps = acc.state()->optimizer_steps;

        train_steps(7);
        counter.value = -1;
        acc.load_state(dir);
        std::vector<std::string> wrong;
        if (!torch::equal(flat_parameters(*model), params)) wrong.push_back("parameters");
        if (optimizer_bytes(adam) != adam_state) wrong.push_back("optimizer state");
        if (adam.param_groups()[0].options().get_lr() != lr) wrong.push_back("learning rate");
        if (loader.position().epoch != position.epoch ||
            loader.position().samples_done != position.samples_done) {
          wrong.push_back("data position");
        }
        if (!torch::equal(torch::rand({4}), draw)) wrong.push_back("random generator");
        if (acc.state()->optimizer_steps != steps) wrong.push_back("step counter");
        if (counter.value != 13) wrong.push_back("registered object");
        // The schedule continues from the restored step count: StepLR(2) halved the rate at its
        // steps 2, 4, ..., 12 (0.5^6 after 13 steps) and halves it again on the 15th.
        if (adam.param_groups()[0].options().get_lr() != 1e-2 * std::pow(0.5, 6))
          wrong.push_back("restored rate");
        train_steps(2);
        if (adam.param_groups()[0].options().get_lr() != 1e-2 * std::pow(0.5, 7))
          wrong.push_back("schedule after load");
        for (const auto& w : wrong) std::cerr << "did not round-trip: " << w << "\n";
        return torch::tensor(static_cast<int64_t>(wrong.size()));
      },
      ranks(1));
  EXPECT_EQ(results.at(0).item<int64_t>(), 0) << "see stderr for what did not round-trip";
  auto manifest = verify_checkpoint(dir);
  EXPECT_EQ(manifest.format_version, kCheckpointFormatVersion);
  EXPECT_EQ(manifest.world_size, 1);
  EXPECT_EQ(manifest.step, 13);
  EXPECT_EQ(manifest.epoch, 1);
  EXPECT_EQ(manifest.models, 1);
  EXPECT_EQ(manifest.custom_objects, 1);
  EXPECT_EQ(manifest.files.size(), 5u);  // rng, model, optimizer, custom, state
}

TEST(Checkpoint, ResumingMidEpochOnTwoProcessesEndsBitIdenticalToTheUninterruptedRun) {
  ScratchDir scratch;
  const std::string dir = scratch.path + "/mid_epoch";
  auto uninterrupted = launch([](int) { return train("", -1, false); }, ranks(2));
  // 96 samples / (8 × 2) = 6 steps per epoch: step 8 is in the middle of the second epoch.
  launch([dir](int) { return train(dir, 8, false); }, ranks(2));
  auto resumed = launch([dir](int) { return train(dir, -1, true); }, ranks(2));
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(torch::equal(resumed[r], uninterrupted[r]))
        << "rank " << r << " max difference "
        << (resumed[r] - uninterrupted[r]).abs().max().item<double>();
  }
  EXPECT_FALSE(torch::equal(uninterrupted[0],
                            launch([dir](int) { return train(dir, 8, false); }, ranks(2))[0]))
      << "the comparison cannot fail: stopping early gives the same parameters";
}

// Loads the step-8 checkpoint in `dir` on every process; then process 1 becomes what a process
// that joins the running job holds after its prepare: other weights, no momentum, its schedule,
// step counter and data at the start (its random generators stay the loaded ones: a process's
// generators are its own, and what a failed process's held is not on any other). With `sync` it
// takes process 0's state by sync_state_from; without, its data position is left as loaded (so that
// both processes still take as many steps). Trains on to the end of epoch 3; returns the final
// parameters and the step counter.
torch::Tensor train_with_a_newcomer(const std::string& dir, bool sync) {
  int64_t steps = 0;
  const torch::Tensor parameters = run_training(
      AcceleratorOptions().seed(11).fused_optimizers(false), 3,
      [&](PreparedRun& run) {
        run.acc.load_state(dir);
        if (run.acc.rank() == 1) {
          {
            // Not drawn from the global generator, which the newcomer keeps as its own: the
            // run's dropout draws from it, so a drawn value would change the result through it.
            torch::NoGradGuard no_grad;
            for (auto& p : run.model.parameters()) p.fill_(0.5);
          }
          run.sgd.state().clear();
          for (int k = 0; k < 3; ++k) run.sched.step();
          if (sync) run.loader.set_position({0, 0});
          run.acc.state()->optimizer_steps = 0;
        }
        if (sync) run.acc.sync_state_from(0);
      },
      [&](Accelerator& acc) {
        steps = acc.state()->optimizer_steps;
        return false;
      });
  return torch::cat({parameters, torch::tensor({static_cast<double>(steps)})});
}

// A process brought up to date from another's memory (sync_state_from, issue 37's in-place
// recovery) continues the run exactly: the end is the uninterrupted run's, bit for bit, on every
// process; without the sync the newcomer's state would change the result.
TEST(Checkpoint, SyncStateFromBringsAJoiningProcessUpToDateBitForBit) {
  ScratchDir scratch;
  const std::string dir = scratch.path + "/step_8";
  auto uninterrupted = launch([](int) { return train("", -1, false); }, ranks(2));
  launch([dir](int) { return train(dir, 8, false); }, ranks(2));
  auto synced = launch([dir](int) { return train_with_a_newcomer(dir, true); }, ranks(2));
  for (int r = 0; r < 2; ++r) {
    const torch::Tensor parameters = synced[r].narrow(0, 0, uninterrupted[r].numel());
    EXPECT_TRUE(torch::equal(parameters, uninterrupted[r]))
        << "rank " << r << " max difference "
        << (parameters - uninterrupted[r]).abs().max().item<double>();
    EXPECT_EQ(synced[r][-1].item<double>(), 18.0) << "3 epochs of 6 steps, counted alike";
  }
  auto unsynced = launch([dir](int) { return train_with_a_newcomer(dir, false); }, ranks(2));
  EXPECT_FALSE(torch::equal(unsynced[0].narrow(0, 0, uninterrupted[0].numel()), uninterrupted[0]))
      << "the comparison cannot fail: the newcomer's state changes nothing";
}

// What is not the same on every process cannot be copied from one: refused on every process,
// naming it, with nothing changed.
TEST(Checkpoint, SyncStateFromRefusesZeroShardsAndABadRank) {
  auto errors = launch(
      [](int) {
        Accelerator acc(AcceleratorOptions().zero_stage(1));
        auto net = make_net();
        torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
        auto [model, opt] = acc.prepare(net, sgd);
        const torch::Tensor before = flat_parameters(*model);
        const std::string sharded =
            accelerant::testing::error_message([&] { acc.sync_state_from(0); });
        const std::string bad_rank =
            accelerant::testing::error_message([&] { acc.sync_state_from(2); });
        const bool unchanged = torch::equal(before, flat_parameters(*model));
        return sharded + "\n" + bad_rank + (unchanged ? "" : "\nCHANGED");
      },
      ranks(2));
  for (const auto& e : errors) {
    EXPECT_TRUE(contains(e, "optimizer 0's state is sharded (ZeRO)")) << e;
    EXPECT_TRUE(contains(e, "load_state from a checkpoint instead")) << e;
    EXPECT_TRUE(contains(e, "there is no process 2 among 2")) << e;
    EXPECT_FALSE(contains(e, "CHANGED")) << e;
  }
}

TEST(Checkpoint, AFusedOptimizerResumesMidEpochBitIdenticalAndFromAPlainCheckpoint) {
  ScratchDir scratch;
  const std::string dir = scratch.path + "/fused", plain = scratch.path + "/plain";
  auto uninterrupted = launch([](int) { return train("", -1, false, 3, true); }, ranks(2));
  launch([dir](int) { return train(dir, 8, false, 3, true); }, ranks(2));
  auto resumed = launch([dir](int) { return train(dir, -1, true, 3, true); }, ranks(2));
  for (int r = 0; r < 2; ++r)
    EXPECT_TRUE(torch::equal(resumed[r], uninterrupted[r])) << "rank " << r;
  // A checkpoint saved without fused state (fused_optimizers off) gives its momentum buffers to
  // the fused update (issue 38: it was refused): the run continues as the unfused one does, up to
  // the rounding of the other kernel, and far from a restart without momentum.
  const auto unfused = launch([](int) { return train("", -1, false); }, ranks(1));
  launch([plain](int) { return train(plain, 8, false); }, ranks(1));
  const auto continued = launch([plain](int) { return train(plain, -1, true, 3, true); }, ranks(1));
  const double difference = (continued[0] - unfused[0]).abs().max().item<double>();
  EXPECT_LT(difference, 1e-5) << "the fused run did not continue the unfused one";
}

TEST(Checkpoint, AutoResumeAfterARestartEndsBitIdenticalToTheUninterruptedRun) {
  ScratchDir scratch;
  auto uninterrupted = launch([](int) { return train("", -1, false); }, ranks(2));
  const std::string project = scratch.path;
  auto elastic = launch(
      [project](int index) {
        const bool first_attempt = read_launch_contract().restart_count == 0;
        return run_training(
            AcceleratorOptions()
                .seed(11)
                .project_dir(project)
                .auto_resume(true)
                .checkpoint_total_limit(2),
            3, [](Accelerator&) {},
            [&](Accelerator& acc) {
              const int64_t step = acc.state()->optimizer_steps;
              if (step % 5 == 0) acc.save_state();
              // Rank 1 dies mid-epoch, two steps after the checkpoint of step 10.
              if (first_attempt && index == 1 && step == 12) ::raise(SIGKILL);
              return false;
            });
      },
      ranks(2).max_restarts(1));
  for (int r = 0; r < 2; ++r)
    EXPECT_TRUE(torch::equal(elastic[r], uninterrupted[r])) << "rank " << r;
  // Steps 5 and 10 saved checkpoints 0 and 1; the restart resumed from 1 and saved 2 at step 15;
  // total_limit 2 removed 0.
  auto kept = list_checkpoints(project + "/checkpoints");
  ASSERT_EQ(kept.size(), 2u);
  EXPECT_EQ(checkpoint_iteration(kept[0]), 1);
  EXPECT_EQ(verify_checkpoint(kept[1]).step, 15);
}

// auto_resume loads at the loop's begin(), through one hook: the loader's getters before the
// first batch read the fresh position and run nothing (no load, no collective).
TEST(Checkpoint, AutoResumeRunsAtTheFirstBeginNotInTheLoadersGetters) {
  ScratchDir scratch;
  const std::string project = scratch.path;
  // 96 samples in global steps of 2 x 8: 6 steps per epoch; the checkpoint is taken after 5.
  launch(
      [project](int) {
        return run_training(
            AcceleratorOptions().seed(11).project_dir(project), 1, [](Accelerator&) {},
            [](Accelerator& acc) {
              if (acc.state()->optimizer_steps != 5) return false;
              acc.save_state();
              return true;
            });
      },
      ranks(2));
  auto seen = launch(
      [project](int) {
        Accelerator acc(AcceleratorOptions().seed(11).project_dir(project).auto_resume(true));
        auto net = make_net();
        torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
        torch::optim::StepLR schedule(sgd, 4, 0.5);
        auto x = torch::randn({kSamples, 8});
        auto y = torch::randint(0, 3, {kSamples}, torch::kLong);
        auto [model, opt, sched, loader] =
            acc.prepare(net, sgd, schedule,
                        make_data_loader(x, y, DataLoaderOptions().batch_size(8).shuffle(true)));
        const DataPosition before = loader.position();
        const int64_t epoch_before = loader.epoch();
        const int64_t batches_per_epoch = loader.size();
        const int64_t steps_before = acc.state()->optimizer_steps;
        int64_t batches_left = 0;
        for (auto it = loader.begin(); it != loader.end(); ++it)
          ++batches_left;  // resumes at begin()
        return torch::tensor({before.epoch, before.samples_done, epoch_before, batches_per_epoch,
                              steps_before, acc.state()->optimizer_steps, batches_left},
                             torch::kLong);
      },
      ranks(2));
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(torch::equal(seen[r], torch::tensor({0, 0, 0, 6, 0, 5, 1}, torch::kLong)))
        << "rank " << r << ": " << seen[r];
  }
}

TEST(Checkpoint, ResumingOnOneProcessContinuesAtTheSampleTwoProcessesStoppedAt) {
  ScratchDir scratch;
  const std::string dir = scratch.path + "/reshard";
  auto ids_of = [](int world, const std::string& dir, bool resume) {
    return launch(
        [=](int) {
          Accelerator acc;
          auto ids = torch::arange(50, torch::kLong).to(torch::kFloat).unsqueeze(1);
          auto model = torch::nn::Linear(1, 1);
          auto [m, loader] =
              acc.prepare(model, make_data_loader(ids, torch::zeros({50}),
                                                  DataLoaderOptions().batch_size(4).shuffle(true)));
          if (resume) acc.load_state(dir);
          std::vector<int64_t> seen;
          int64_t batches = 0;
          for (auto& b : loader) {
            auto all = acc.gather_for_metrics(b.data.squeeze(1));
            for (int64_t i = 0; i < all.size(0); ++i)
              seen.push_back(static_cast<int64_t>(all[i].item<float>()));
            if (!resume && ++batches == 3) {
              acc.save_state(dir);
              break;
            }
          }
          return torch::tensor(seen);
        },
        ranks(world));
  };
  auto before = ids_of(2, dir, false)[0];  // 3 global steps × 2 ranks × 4 = 24 samples
  auto after = ids_of(1, dir, true)[0];    // the other 26
  std::multiset<int64_t> all;
  for (int64_t i = 0; i < before.size(0); ++i) all.insert(before[i].item<int64_t>());
  for (int64_t i = 0; i < after.size(0); ++i) all.insert(after[i].item<int64_t>());
  EXPECT_EQ(before.size(0), 24);
  EXPECT_EQ(after.size(0), 26);
  std::multiset<int64_t> expected;
  for (int64_t i = 0; i < 50; ++i) expected.insert(i);
  EXPECT_EQ(all, expected) << "a sample was skipped or repeated across the resume";
}

namespace {

constexpr int64_t kAccumulation = 4, kLastMicroStep = 16;

// A run of kLastMicroStep micro-steps with gradient accumulation 4 over several epochs (SGD with
// momentum, dropout, a shuffled loader). With `save_at` >= 0 it saves into `dir` after that
// micro-step, inside the accumulation guard as a loop that saves "every n steps" would, and
// stops; with `resume` it first loads `dir`. Returns the final parameters.
torch::Tensor train_accumulating(const std::string& dir, int64_t save_at, bool resume) {
  Accelerator acc(AcceleratorOptions().seed(11).gradient_accumulation_steps(kAccumulation));
  auto net = make_net();
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  torch::manual_seed(5);
  auto x = torch::randn({kSamples, 8});
  auto y = torch::randint(0, 3, {kSamples}, torch::kLong);
  torch::manual_seed(11 + acc.rank());
  auto [model, opt, loader] = acc.prepare(
      net, sgd, make_data_loader(x, y, DataLoaderOptions().batch_size(8).shuffle(true)));
  if (resume) acc.load_state(dir);
  while (loader.epoch() < 10) {
    for (auto& batch : loader) {
      auto guard = acc.accumulate(model);
      acc.backward(torch::nn::functional::cross_entropy(model->forward(batch.data), batch.target));
      opt.step();
      opt.zero_grad();
      const int64_t micro = acc.state()->micro_steps;
      if (micro == save_at) acc.save_state(dir);
      if (micro == save_at || micro == kLastMicroStep) return flat_parameters(*model);
    }
  }
  return flat_parameters(*model);
}

}  // namespace

TEST(Checkpoint, SavedInTheMiddleOfGradientAccumulationItResumesBitIdentical) {
  // Micro-step 7 is the third of the second accumulation (7 % 4 = 3) and no epoch's last (96
  // samples make 12 micro-steps of 8 on one process, 6 on each of two), so the gradients of
  // micro-steps 5 to 7 are pending, different on each rank, and only the checkpoint has them.
  for (int n : {1, 2}) {
    ScratchDir scratch;
    const std::string dir = scratch.path + "/mid_accumulation";
    auto uninterrupted = launch([](int) { return train_accumulating("", -1, false); }, ranks(n));
    launch([dir](int) { return train_accumulating(dir, 7, false); }, ranks(n));
    for (int r = 0; r < n; ++r) {
      EXPECT_TRUE(std::ifstream(dir + "/rank_" + std::to_string(r) + "/gradients.pt").good())
          << "rank " << r << " saved no gradients, " << n << " process(es)";
    }
    auto resumed = launch([dir](int) { return train_accumulating(dir, -1, true); }, ranks(n));
    for (int r = 0; r < n; ++r) {
      EXPECT_TRUE(torch::equal(resumed[r], uninterrupted[r]))
          << "rank " << r << " of " << n << ", max difference "
          << (resumed[r] - uninterrupted[r]).abs().max().item<double>();
    }
  }
}

TEST(Checkpoint, MidAccumulationGradientsAreNotLoadedOnAnotherNumberOfProcesses) {
  ScratchDir scratch;
  const std::string dir = scratch.path + "/mid_accumulation";
  launch([dir](int) { return train_accumulating(dir, 7, false); }, ranks(2));
  try {
    launch([dir](int) { return train_accumulating(dir, -1, true); }, ranks(1));
    FAIL() << "partial gradients of 2 processes were loaded on 1";
  } catch (const std::exception& e) {
    EXPECT_TRUE(contains(e.what(), "(in the middle of gradient accumulation) by 2 process(es)"))
        << e.what();
    EXPECT_TRUE(contains(e.what(), "this run has 1")) << e.what();
    EXPECT_TRUE(contains(e.what(), "sync_gradients() is true")) << e.what();
  }
}

// ---- refusals ----------------------------------------------------------------------------------

namespace {

// Saves one checkpoint of a small model on one process, then runs `check` in a second process.
std::string error_loading(const std::string& dir,
                          const std::function<void(const std::string&)>& damage,
                          int64_t hidden_when_loading = 32) {
  launch(
      [dir](int) {
        Accelerator acc;
        auto net = make_net();
        torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1));
        acc.prepare(net, sgd);
        acc.save_state(dir);
        return 0;
      },
      ranks(1));
  damage(dir);
  auto outcome = launch(
      [dir, hidden_when_loading](int) -> std::string {
        Accelerator acc;
        torch::manual_seed(1);
        auto net = make_net(hidden_when_loading);
        torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1));
        acc.prepare(net, sgd);
        const auto before = flat_parameters(*net);
        try {
          acc.load_state(dir);
          return "loaded";
        } catch (const CheckpointError& e) {
          const bool untouched = torch::equal(flat_parameters(*net), before);
          return std::string(untouched ? "" : "PARAMETERS CHANGED ") + e.what();
        }
      },
      ranks(1));
  return outcome.at(0);
}

void flip_byte(const std::string& path, size_t offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(offset));
  char c;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x5a);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(&c, 1);
}

void rewrite(const std::string& path, const std::string& from, const std::string& to) {
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto at = text.find(from);
  ASSERT_NE(at, std::string::npos) << from << " not in " << path;
  text.replace(at, from.size(), to);
  std::ofstream(path, std::ios::trunc) << text;
}

}  // namespace

// Bytes this process has read through read(2) and its kin, page cache included (/proc/self/io).
uint64_t bytes_read_so_far() {
  std::ifstream io("/proc/self/io");
  std::string key;
  uint64_t value = 0;
  while (io >> key >> value) {
    if (key == "rchar:") return value;
  }
  ADD_FAILURE() << "no rchar in /proc/self/io";
  return 0;
}

// A load checks each file's CRC-32 as it reads it: a checkpoint is read once, not verified by one
// read and loaded by another (twice the disk time of a large checkpoint).
TEST(Checkpoint, LoadReadsEachFileOnce) {
  ScratchDir scratch;
  const std::string dir = scratch.path + "/once";
  auto read_per_saved = launch(
      [dir](int) {
        Accelerator acc;
        torch::manual_seed(0);
        auto net = torch::nn::Linear(1024, 1024);  // 4 MiB of weights, 8 MiB of Adam state
        torch::optim::Adam adam(net->parameters(), torch::optim::AdamOptions(1e-3));
        auto [m, opt] = acc.prepare(net, adam);
        acc.backward(m->forward(torch::ones({2, 1024})).sum());
        opt.step();
        acc.save_state(dir);
        uint64_t saved = 0;
        for (const auto& f : read_checkpoint_manifest(dir).files) saved += f.size;
        const uint64_t before = bytes_read_so_far();
        acc.load_state(dir);
        return static_cast<double>(bytes_read_so_far() - before) / static_cast<double>(saved);
      },
      ranks(1));
  EXPECT_GT(read_per_saved[0], 0.9) << "the load read less than the checkpoint holds";
  EXPECT_LT(read_per_saved[0], 1.5) << "the load read the checkpoint's files more than once";
}

TEST(CheckpointRefusals, OneCorruptedByteIsACheckumErrorNamingTheFile) {
  ScratchDir scratch;
  auto error = error_loading(scratch.path + "/c",
                             [](const std::string& d) { flip_byte(d + "/model_0.pt", 100); });
  EXPECT_TRUE(contains(error, "model_0.pt is corrupted: CRC-32")) << error;
  EXPECT_TRUE(contains(error, "Nothing was loaded")) << error;
  EXPECT_FALSE(contains(error, "PARAMETERS CHANGED")) << error;
}

// state.json is read once too, its CRC-32 checked before it is parsed.
TEST(CheckpointRefusals, AnEditedStateJsonIsACheckumErrorNamingIt) {
  ScratchDir scratch;
  auto error = error_loading(scratch.path + "/s",
                             [](const std::string& d) { flip_byte(d + "/state.json", 20); });
  EXPECT_TRUE(contains(error, "state.json is corrupted: CRC-32")) << error;
  EXPECT_TRUE(contains(error, "Nothing was loaded")) << error;
}

TEST(CheckpointRefusals, ATruncatedOrMissingFileIsNamed) {
  ScratchDir scratch;
  auto error = error_loading(scratch.path + "/t", [](const std::string& d) {
    ::truncate((d + "/optimizer_0.pt").c_str(), 10);
  });
  EXPECT_TRUE(contains(error, "optimizer_0.pt has 10 bytes")) << error;
  EXPECT_TRUE(contains(error, "(truncated)")) << error;
  error = error_loading(scratch.path + "/m",
                        [](const std::string& d) { ::unlink((d + "/rank_0/rng.pt").c_str()); });
  EXPECT_TRUE(contains(error, "rank_0/rng.pt is missing")) << error;
}

TEST(CheckpointRefusals, AnUnknownFormatVersionSaysWhichVersionsAreRead) {
  ScratchDir scratch;
  auto error = error_loading(scratch.path + "/v", [](const std::string& d) {
    rewrite(d + "/manifest.json", "\"format_version\": 1", "\"format_version\": 7");
  });
  EXPECT_TRUE(contains(error, "has format version 7; this Accelerant reads versions 1 to 1"))
      << error;
  EXPECT_TRUE(contains(error, "newer Accelerant")) << error;
}

TEST(CheckpointRefusals, AModelOfAnotherShapeListsTheParametersThatDiffer) {
  ScratchDir scratch;
  auto error = error_loading(
      scratch.path + "/s", [](const std::string&) {}, /*hidden_when_loading=*/16);
  EXPECT_TRUE(contains(
      error, "shapes differ: 0.bias saved [32], model [16]; 0.weight saved [32, 8], model [16, 8]"))
      << error;
  EXPECT_TRUE(contains(error, "3.weight saved [3, 32], model [3, 16]")) << error;
  EXPECT_FALSE(contains(error, "PARAMETERS CHANGED")) << error;
}

TEST(CheckpointRefusals, AMalformedManifestIsNamedAndNotAChecksumError) {
  ScratchDir scratch;
  auto error = error_loading(scratch.path + "/j", [](const std::string& d) {
    std::ofstream(d + "/manifest.json", std::ios::trunc)
        << "{\"format\": \"accelerant-checkpoint\", \"format_ver";
  });
  EXPECT_TRUE(contains(error, "manifest.json is not valid JSON")) << error;
}

TEST(CheckpointRefusals, ADirectoryThatIsNoCheckpointSaysSo) {
  ScratchDir scratch;
  EXPECT_THROW(read_checkpoint_manifest(scratch.path), CheckpointError);
  try {
    read_checkpoint_manifest(scratch.path);
  } catch (const CheckpointError& e) {
    EXPECT_TRUE(contains(e.what(), "has no manifest.json")) << e.what();
  }
}

// A checkpoint holds its own files: a symbolic link inside one (to a file with the very bytes
// the manifest lists, so that every checksum matches) is refused naming the link, where before
// it was read through.
TEST(CheckpointRefusals, ASymbolicLinkInsideTheCheckpointIsRefusedNamingIt) {
  ScratchDir scratch;
  const std::string outside = scratch.path;
  auto error = error_loading(scratch.path + "/l", [outside](const std::string& d) {
    ASSERT_EQ(std::rename((d + "/model_0.pt").c_str(), (outside + "/model_0.pt").c_str()), 0);
    ASSERT_EQ(::symlink((outside + "/model_0.pt").c_str(), (d + "/model_0.pt").c_str()), 0);
  });
  EXPECT_TRUE(contains(error, "model_0.pt is a symbolic link")) << error;
  EXPECT_TRUE(contains(error, "Nothing was loaded")) << error;

  const std::string d = scratch.path + "/l";
  ASSERT_EQ(std::rename((d + "/rank_0").c_str(), (outside + "/rank_0").c_str()), 0);
  ASSERT_EQ(::symlink((outside + "/rank_0").c_str(), (d + "/rank_0").c_str()), 0);
  error = accelerant::testing::error_message([&] { verify_checkpoint(d); });
  EXPECT_TRUE(contains(error, "rank_0 is a symbolic link")) << error;

  ASSERT_EQ(std::rename((d + "/manifest.json").c_str(), (outside + "/manifest.json").c_str()), 0);
  ASSERT_EQ(::symlink((outside + "/manifest.json").c_str(), (d + "/manifest.json").c_str()), 0);
  error = accelerant::testing::error_message([&] { verify_checkpoint(d); });
  EXPECT_TRUE(contains(error, d + "/manifest.json is a symbolic link")) << error;
}

// The manifest's counts and world size say which files a checkpoint has; a list that disagrees
// is named, file by file, before LibTorch is asked for a tensor that is not there (or a rank's
// generators are silently left as they were).
TEST(CheckpointRefusals, AManifestWhoseFilesDisagreeWithItsCountsNamesTheFile) {
  ScratchDir scratch;
  auto error = error_loading(scratch.path + "/w", [](const std::string& d) {
    rewrite(d + "/manifest.json", "\"world_size\": 1", "\"world_size\": 2");
  });
  EXPECT_TRUE(contains(error,
                       "rank_1/rng.pt (the random generators of rank 1) is not in the "
                       "manifest's file list although its counts"))
      << error;
  EXPECT_TRUE(contains(error, "world size 2")) << error;
  error = error_loading(scratch.path + "/m", [](const std::string& d) {
    rewrite(d + "/manifest.json", "\"models\": 1", "\"models\": 2");
  });
  EXPECT_TRUE(contains(error, "model_1.pt (the model) is not in the manifest's file list"))
      << error;
  error = error_loading(scratch.path + "/o", [](const std::string& d) {
    rewrite(d + "/manifest.json", "\"optimizers\": 1", "\"optimizers\": 0");
  });
  EXPECT_TRUE(contains(error, "optimizer_0.pt is in the manifest's file list but has no role"))
      << error;
}

namespace {

// Saves checkpoint_0 at step 3 and checkpoint_1 at step 6 under `project` (one process).
void save_two_checkpoints(const std::string& project) {
  launch(
      [project](int) {
        run_training(
            AcceleratorOptions().seed(11).project_dir(project), 1, [](Accelerator&) {},
            [](Accelerator& acc) {
              const int64_t step = acc.state()->optimizer_steps;
              if (step == 3 || step == 6) acc.save_state();
              return step == 6;
            });
        return 0;
      },
      ranks(1));
}

// A process that resumes with auto_resume: the step it resumed at, then what it wrote to stderr.
std::string auto_resume_output(const std::string& project) {
  return launch(
             [project](int) -> std::string {
               const std::string log = project + "/stderr.txt";
               const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
               ::dup2(fd, 2);
               ::close(fd);
               int64_t resumed_at = -1;
               run_training(
                   AcceleratorOptions().seed(11).project_dir(project).auto_resume(true), 1,
                   [&](Accelerator& acc) {
                     acc.auto_resume_now();
                     resumed_at = acc.state()->optimizer_steps;
                   },
                   [](Accelerator&) { return true; });
               std::fflush(stderr);
               std::ifstream in(log);
               return std::to_string(resumed_at) + "\n" +
                      std::string(std::istreambuf_iterator<char>(in), {});
             },
             ranks(1))
      .at(0);
}

}  // namespace

// auto_resume never retries a damaged checkpoint on every restart, nor starts over silently: it
// takes the newest one that verifies and says which it skipped, why, and which it used.
TEST(CheckpointRefusals, AutoResumeFallsBackToTheNewestCheckpointThatVerifiesAndSaysWhy) {
  ScratchDir scratch;
  const std::string project = scratch.path;
  const std::string checkpoints = project + "/checkpoints";
  save_two_checkpoints(project);
  flip_byte(checkpoints + "/checkpoint_1/model_0.pt", 100);
  ASSERT_EQ(::mkdir((checkpoints + "/checkpoint_2").c_str(), 0755), 0);  // no manifest

  std::string out = auto_resume_output(project);
  EXPECT_EQ(out.substr(0, 2), "3\n") << out;
  EXPECT_TRUE(contains(out, "WARNING: auto_resume skipped 2 checkpoint(s) in " + checkpoints))
      << out;
  EXPECT_TRUE(contains(out, checkpoints + "/checkpoint_2 has no manifest.json")) << out;
  EXPECT_TRUE(contains(out, "checkpoint " + checkpoints +
                                "/checkpoint_1 is damaged: model_0.pt is corrupted: CRC-32"))
      << out;
  EXPECT_TRUE(contains(out, "Resuming from " + checkpoints +
                                "/checkpoint_0, the newest that "
                                "verifies"))
      << out;

  // None verifies: a fresh start, said as loudly.
  flip_byte(checkpoints + "/checkpoint_0/state.json", 5);
  out = auto_resume_output(project);
  EXPECT_EQ(out.substr(0, 2), "0\n") << out;
  EXPECT_TRUE(contains(out, "skipped 3 checkpoint(s)")) << out;
  EXPECT_TRUE(contains(out, "No checkpoint there verifies: training starts from step 0")) << out;
}

// ---- automatic naming ---------------------------------------------------------------------------

TEST(CheckpointNaming, TotalLimitKeepsTheNewestAndLoadStateTakesTheLatest) {
  ScratchDir scratch;
  const std::string project = scratch.path;
  auto results = launch(
      [project](int) {
        Accelerator acc(AcceleratorOptions().project_dir(project).checkpoint_total_limit(2));
        auto net = torch::nn::Linear(4, 2);
        acc.prepare(net);
        std::vector<std::string> written;
        for (int i = 0; i < 4; ++i) {
          torch::NoGradGuard no_grad;
          net->weight.fill_(i);
          written.push_back(acc.save_state());
        }
        {
          torch::NoGradGuard no_grad;
          net->weight.fill_(-1);
        }
        const std::string loaded = acc.load_state();
        return torch::tensor({net->weight.mean().item<float>(),
                              static_cast<float>(checkpoint_iteration(loaded)),
                              static_cast<float>(checkpoint_iteration(written.back()))});
      },
      ranks(2));
  EXPECT_EQ(results[0][0].item<float>(), 3.0f);
  EXPECT_EQ(results[0][1].item<float>(), 3.0f);
  EXPECT_EQ(results[1][2].item<float>(), 3.0f);
  auto kept = list_checkpoints(project + "/checkpoints");
  ASSERT_EQ(kept.size(), 2u);
  EXPECT_EQ(checkpoint_iteration(kept[0]), 2);
  EXPECT_EQ(checkpoint_iteration(kept[1]), 3);
  for (const auto& k : kept) EXPECT_EQ(verify_checkpoint(k).world_size, 2);
}
