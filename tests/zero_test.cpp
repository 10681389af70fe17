// ZeRO (AcceleratorOptions::zero_stage): stages 1, 2 and 3 must train exactly as plain data
// parallelism does (stage 0), on 2 and 4 real processes, also with gradient accumulation,
// clipping and bf16 autocast; each process must hold only its share of the optimizer state (and
// under stage 3 of the sharded blocks' parameters); a sharded checkpoint must resume bit for bit
// on the same number of processes and load on another; stage 3's save_model must write the whole
// weights; and misuse must be refused with the fix. The sharded blocks themselves are tested in
// sharded_test.cpp.
#include <accelerant/accelerant.h>
#include <accelerant/checkpoint_contents.h>
#include <gtest/gtest.h>
#include <malloc.h>
#include <sys/stat.h>

#include <cstdio>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>

#include "test_support.h"

using namespace accelerant;
using namespace accelerant::testing;

namespace {

constexpr int kGlobalBatch = 8;

// How one training run goes.
struct TrainingRun {
  int stage = 0;
  bool accumulate = false;     // two micro-steps of half the batch per optimizer step
  bool clip = false;           // clip the gradient norm to 0.05 (below the norms seen: it acts)
  bool bf16 = false;           // bf16 autocast
  bool graph = false;          // steps through accelerator.compile, replays emulated (the device
                               // path of the fused update, the all-gather as a host effect)
  bool loss_scaler = false;    // fp16's GradScaler (init scale 1024) on fp32 training: fp16 itself
                               // needs CUDA, so the scaler is set in the Accelerator's state
  int overflow_at = -1;        // at this step rank 0's gradient of one weight element is inf
  bool fused = true;           // fused_optimizers (stage 0 only: ZeRO always fuses the update)
  bool sharded_start = false;  // stage 3: the model is built inside Accelerator::sharded_start
  int steps = 50;
  std::string save_dir;  // save after step save_at (1-based), then go on
  int save_at = 0;
  std::string load_dir;  // start from this checkpoint
};

// Two gradient buckets of 1 MiB at most (and a first one of less), parameters of odd sizes, so
// that the shares cut through parameters. With `sharded_blocks` (for stage 3) the first two
// layers are Sharded blocks and the head stays replicated; the values and the names are the same
// either way, so that checkpoints of one are checkpoints of the other.
torch::nn::Sequential zero_model(bool sharded_blocks = false) {
  torch::manual_seed(3);
  if (!sharded_blocks) {
    torch::nn::Linear first(64, 1023);
    torch::nn::Linear middle(1023, 257);
    torch::nn::Linear head(257, 10);
    return torch::nn::Sequential(first, torch::nn::Tanh(), middle, torch::nn::Tanh(), head);
  }
  // Each block wrapped as it is built, in the same order: under a sharded start no block is
  // whole once the next is built.
  Sharded first(torch::nn::Linear(64, 1023));
  Sharded middle(torch::nn::Linear(1023, 257));
  torch::nn::Linear head(257, 10);
  return torch::nn::Sequential(first, torch::nn::Tanh(), middle, torch::nn::Tanh(), head);
}

// Every step uses the same global batch whatever the number of processes, each process taking
// an equal slice: the average of the processes' gradients is the global batch's gradient, so
// runs on different numbers of processes follow the same trajectory (up to rounding).
std::pair<torch::Tensor, torch::Tensor> global_batch(int step) {
  torch::manual_seed(1000 + step);
  return {torch::randn({kGlobalBatch, 64}), torch::randn({kGlobalBatch, 10})};
}

// Trains and returns the parameters, flattened, followed by this rank's optimizer state elements.
torch::Tensor train(int rank, int world, const TrainingRun& run) {
  Accelerator acc(AcceleratorOptions()
                      .cpu(true)
                      .zero_stage(run.stage)
                      .fused_optimizers(run.fused)
                      .bucket_cap_mb(1)
                      .mixed_precision(run.bf16 ? MixedPrecision::kBf16 : MixedPrecision::kNo)
                      .gradient_accumulation_steps(run.accumulate ? 2 : 1));
  if (run.loss_scaler) {
    acc.state()->scaler =
        std::make_shared<GradScaler>(GradScalerOptions().init_scale(1024), torch::kCPU);
  }
  auto model = [&] {
    const ShardedStart start = run.sharded_start ? acc.sharded_start() : ShardedStart();
    return zero_model(run.stage == 3);
  }();
  torch::optim::AdamW adamw(model->parameters(),
                            torch::optim::AdamWOptions(1e-3).weight_decay(0.01));
  auto [m, opt] = acc.prepare(model, adamw);
  int first = 0;
  if (!run.load_dir.empty()) {
    acc.load_state(run.load_dir);
    first = static_cast<int>(acc.state()->optimizer_steps);
  }
  const int per_rank = kGlobalBatch / world;
  std::optional<GraphStep> graph_step;
  if (run.graph) {
    auto& net = m;
    auto& optimizer = opt;
    graph_step = acc.compile(
        [&, clip = run.clip](const GraphStep::Inputs& in) {
          auto loss = (net->forward(in[0]) - in[1]).pow(2).mean();
          acc.backward(loss);
          if (clip) acc.clip_grad_norm_tensor(net, 0.05);
          optimizer.step();
          optimizer.zero_grad();
          return GraphStep::Outputs{loss.detach()};
        },
        GraphStepOptions().emulate_replays(true));
  }
  for (int step = first; step < run.steps; ++step) {
    auto [x, y] = global_batch(step);
    x = x.narrow(0, rank * per_rank, per_rank), y = y.narrow(0, rank * per_rank, per_rank);
    if (graph_step) {
      (*graph_step)({x, y});
      continue;
    }
    const int micro = run.accumulate ? 2 : 1;
    for (int k = 0; k < micro; ++k) {
      auto guard = acc.accumulate(m);
      const int64_t rows = per_rank / micro;
      torch::Tensor loss;
      {
        auto autocast = acc.autocast();
        auto out = m->forward(x.narrow(0, k * rows, rows));
        loss = (out.to(torch::kFloat) - y.narrow(0, k * rows, rows)).pow(2).mean();
      }
      if (step == run.overflow_at && rank == 0 && run.stage != 3) {
        // One element's gradient becomes inf; under stage 2 only that element's owner sees it.
        const auto weight = m->parameters()[0].flatten()[7];
        loss = loss + weight * std::numeric_limits<float>::infinity();
      }
      acc.backward(loss);
      if (step == run.overflow_at && rank == 0 && run.stage == 3) {
        // The same element's gradient, in rank 0's share of the first block (its first piece):
        // only rank 0 holds it.
        torch::NoGradGuard no_grad;
        sharded_blocks(*m)[0]->shares()[0].mutable_grad()[7].fill_(
            std::numeric_limits<float>::infinity());
      }
      if (acc.sync_gradients() && run.clip) acc.clip_grad_norm_(m, 0.05);
      opt.step();
      opt.zero_grad();
    }
    if (!run.save_dir.empty() && step + 1 == run.save_at) acc.save_state(run.save_dir);
  }
  int64_t state_elements = 0;
  if (opt.fused_updater() && opt.fused_updater()->sharded()) {
    for (const auto& piece : opt.fused_updater()->shard_pieces()) state_elements += piece.length;
  } else {
    state_elements = opt.fused_updater() ? opt.fused_updater()->numel() : -1;
  }
  GatheredParameters whole(*m);  // stage 3: the sharded blocks' parameters, whole for a moment
  return torch::cat(
      {flat_parameters(*m), torch::tensor({static_cast<float>(state_elements),
                                           static_cast<float>(acc.state()->optimizer_steps)})});
}

std::vector<torch::Tensor> train_on(int world, const TrainingRun& run) {
  auto options = LaunchOptions()
                     .processes_per_node(world)
                     .collective_timeout(std::chrono::seconds(90))
                     .verbose(false);
  return launch([run, world](int rank) { return train(rank, world, run); }, options);
}

int64_t parameter_count() {
  int64_t n = 0;
  for (const auto& p : zero_model()->parameters()) n += p.numel();
  return n;
}

torch::Tensor parameters_of(const torch::Tensor& result) {
  return result.narrow(0, 0, result.numel() - 2);
}

int64_t state_elements_of(const torch::Tensor& result) {
  return static_cast<int64_t>(result[result.numel() - 2].item<float>());
}

int64_t optimizer_steps_of(const torch::Tensor& result) {
  return static_cast<int64_t>(result[result.numel() - 1].item<float>());
}

// fp32 tolerance: the stages reduce the same numbers, but a reduce-scatter may sum them in
// another order than an all-reduce.
void expect_same_training(const torch::Tensor& a, const torch::Tensor& b, const std::string& what) {
  const double worst = (a - b).abs().max().item<double>();
  EXPECT_LT(worst, 2e-5) << what << ": largest difference " << worst;
}

// `run`, which saved a checkpoint into save_dir, started again from that checkpoint.
TrainingRun resumed_from_its_save(const TrainingRun& run) {
  TrainingRun resumed = run;
  resumed.load_dir = run.save_dir;
  resumed.save_dir.clear();
  return resumed;
}

// A resumed run ends with the uninterrupted one's parameters, bit for bit, on every rank.
void expect_bit_for_bit(const std::vector<torch::Tensor>& resumed,
                        const std::vector<torch::Tensor>& uninterrupted, const std::string& what) {
  ASSERT_EQ(resumed.size(), uninterrupted.size()) << what;
  for (size_t r = 0; r < resumed.size(); ++r) {
    EXPECT_TRUE(torch::equal(parameters_of(resumed[r]), parameters_of(uninterrupted[r])))
        << "rank " << r << ": the resumed " << what << " run differs from the uninterrupted one";
  }
}

class ZeroStages : public ::testing::TestWithParam<int> {};

TEST_P(ZeroStages, Stages1And2TrainAsStage0AndHoldTheirShareOfTheState) {
  const int world = GetParam();
  const int64_t n = parameter_count();
  const auto base = train_on(world, TrainingRun{});
  const torch::Tensor start = flat_parameters(*zero_model());
  ASSERT_GT((parameters_of(base[0]) - start).abs().max().item<double>(), 1e-3) << "nothing trained";
  EXPECT_EQ(state_elements_of(base[0]), n);
  for (int stage : {1, 2}) {
    TrainingRun run;
    run.stage = stage;
    const auto sharded = train_on(world, run);
    int64_t total_state = 0;
    for (int r = 0; r < world; ++r) {
      const std::string what = "stage " + std::to_string(stage) + ", rank " + std::to_string(r);
      expect_same_training(parameters_of(sharded[r]), parameters_of(base[0]), what);
      EXPECT_TRUE(torch::equal(parameters_of(sharded[r]), parameters_of(sharded[0])))
          << what << ": the ranks' parameters differ";
      const int64_t own = state_elements_of(sharded[r]);
      // Its share: 1/N of the elements, plus the padding that aligns the shares (16 elements per
      // bucket and rank at most).
      EXPECT_LE(own, n / world + 16 * 4) << what;
      EXPECT_GT(own, 0) << what;
      total_state += own;
    }
    EXPECT_EQ(total_state, n) << "stage " << stage << ": the shares do not cover the parameters";
  }
}

// Stage 3 through the Accelerator: the sharded blocks keep a share of their parameters on each
// process and the optimizer (fused) updates those shares and the replicated head.
TEST_P(ZeroStages, Stage3TrainsAsStage0AndHoldsOnlyItsSharesOfTheBlocks) {
  const int world = GetParam();
  const auto base = train_on(world, TrainingRun{});
  TrainingRun run;
  run.stage = 3;
  const auto sharded = train_on(world, run);
  // Built by a sharded start (never whole in one process), the model starts from the same
  // values, so the training is the same, bit for bit.
  run.sharded_start = true;
  const auto started_sharded = train_on(world, run);
  int64_t block_elements = 0;
  auto model = zero_model(true);
  for (const auto& block : sharded_blocks(*model)) {
    for (const auto& p : block->parameters()) block_elements += p.numel();
  }
  const int64_t head_elements = parameter_count() - block_elements;
  for (int r = 0; r < world; ++r) {
    const std::string what = "stage 3, rank " + std::to_string(r);
    expect_same_training(parameters_of(sharded[r]), parameters_of(base[0]), what);
    EXPECT_TRUE(torch::equal(parameters_of(sharded[r]), parameters_of(sharded[0])))
        << what << ": the ranks' parameters differ";
    EXPECT_TRUE(torch::equal(parameters_of(started_sharded[r]), parameters_of(sharded[r])))
        << what << ": a sharded start trains otherwise than a model sharded by prepare";
    // What the fused update holds: this process's shares (1/N of the blocks' elements, padded
    // to 16 per parameter) and the whole head.
    const int64_t own = state_elements_of(sharded[r]);
    EXPECT_GE(own, block_elements / world + head_elements) << what;
    EXPECT_LE(own, block_elements / world + 16 * 4 + head_elements) << what;
  }
}

INSTANTIATE_TEST_SUITE_P(TwoAndFour, ZeroStages, ::testing::Values(2, 4));

TEST(Zero, AccumulationClippingAndBf16TrainAsStage0UnderEveryStage) {
  for (int variant = 0; variant < 3; ++variant) {
    TrainingRun run;
    run.steps = 20;
    run.accumulate = variant == 0;
    run.clip = variant == 1;
    run.bf16 = variant == 2;
    const char* name = variant == 0 ? "accumulation" : variant == 1 ? "clipping" : "bf16";
    const auto base = train_on(2, run);
    for (int stage : {1, 2, 3}) {
      run.stage = stage;
      const auto sharded = train_on(2, run);
      for (int r = 0; r < 2; ++r) {
        expect_same_training(parameters_of(sharded[r]), parameters_of(base[0]),
                             std::string(name) + ", stage " + std::to_string(stage));
      }
    }
    run.stage = 0;
  }
}

// fp16's loss scaler: under stages 2 and 3 each process unscales and checks only its share of
// the gradients, so an overflow in one share must skip the step on every process, as it does when
// every process holds whole gradients. Also through clipping, which unscales first.
TEST(Zero, Stages2And3WithALossScalerSkipAnOverflowOnEveryProcess) {
  for (bool clip : {false, true}) {
    TrainingRun run;
    run.steps = 12;
    run.loss_scaler = true;
    run.clip = clip;
    run.overflow_at = 5;
    const auto base = train_on(2, run);
    ASSERT_EQ(optimizer_steps_of(base[0]), run.steps - 1) << "stage 0 did not skip the overflow";
    for (int stage : {1, 2, 3}) {
      run.stage = stage;
      const auto sharded = train_on(2, run);
      for (int r = 0; r < 2; ++r) {
        const std::string what = std::string("loss scaler") + (clip ? " with clipping" : "") +
                                 ", stage " + std::to_string(stage) + ", rank " + std::to_string(r);
        EXPECT_EQ(optimizer_steps_of(sharded[r]), run.steps - 1) << what;
        expect_same_training(parameters_of(sharded[r]), parameters_of(base[0]), what);
      }
    }
  }
}

// Graph mode: the sharded update takes the fused update's device path (tensor operations on
// gathered pieces) and the all-gather runs after each (emulated) replay.
TEST(Zero, GraphStepsTrainAsEagerStage0) {
  for (bool clip : {false, true}) {
    TrainingRun run;
    run.steps = 20;
    run.clip = clip;
    const auto base = train_on(2, run);
    run.graph = true;
    for (int stage : {0, 1, 2}) {
      run.stage = stage;
      const auto sharded = train_on(2, run);
      for (int r = 0; r < 2; ++r) {
        expect_same_training(parameters_of(sharded[r]), parameters_of(base[0]),
                             std::string("graph mode") + (clip ? " with clipping" : "") +
                                 ", stage " + std::to_string(stage));
      }
    }
  }
}

TEST(Zero, ASavedShardedRunResumesBitForBitAndLoadsOnAnotherNumberOfProcesses) {
  const std::string dir = make_temp_dir();
  TrainingRun whole;
  whole.stage = 2;
  whole.steps = 30;
  whole.save_dir = dir + "/ckpt";
  whole.save_at = 12;
  const auto uninterrupted = train_on(2, whole);
  // The shards are there, and no whole optimizer file.
  EXPECT_TRUE(std::ifstream(dir + "/ckpt/rank_0/optimizer_0.pt").good());
  EXPECT_TRUE(std::ifstream(dir + "/ckpt/rank_1/optimizer_0.pt").good());
  EXPECT_FALSE(std::ifstream(dir + "/ckpt/optimizer_0.pt").good());

  TrainingRun resumed = resumed_from_its_save(whole);
  expect_bit_for_bit(train_on(2, resumed), uninterrupted, "stage-2");
  // On 4 processes (stage 1), and on 1 (no sharding): the same trajectory up to rounding.
  resumed.stage = 1;
  const auto four = train_on(4, resumed);
  expect_same_training(parameters_of(four[0]), parameters_of(uninterrupted[0]), "resumed on 4");
  resumed.stage = 0;
  const auto one = train_on(1, resumed);
  expect_same_training(parameters_of(one[0]), parameters_of(uninterrupted[0]), "resumed on 1");
  remove_tree(dir);
}

// Issue 36's exactness goal: 50 steps at stage 3 on 4 processes, with clipping and gradient
// accumulation, saved after step 25 and resumed on 4 processes and on 2, follow stage 0's run on
// 4 processes (fp32; the tolerance of another reduction order), and the resume on 4 is bit for
// bit the uninterrupted stage-3 run. The largest differences are printed for docs/zero.md.
TEST(Zero, Stage3FollowsStage0Over50StepsWithClippingAccumulationAndAResume) {
  const std::string dir = make_temp_dir();
  TrainingRun plain;
  plain.clip = true;
  plain.accumulate = true;
  plain.steps = 50;
  const auto base = train_on(4, plain);
  TrainingRun sharded = plain;
  sharded.stage = 3;
  sharded.save_dir = dir + "/zero3";
  sharded.save_at = 25;
  const auto uninterrupted = train_on(4, sharded);
  const auto on_four = train_on(4, resumed_from_its_save(sharded));
  const auto on_two = train_on(2, resumed_from_its_save(sharded));
  expect_bit_for_bit(on_four, uninterrupted, "stage-3 on 4");
  const auto worst = [&](const torch::Tensor& a) {
    return (parameters_of(a) - parameters_of(base[0])).abs().max().item<double>();
  };
  std::printf(
      "stage 3 against stage 0 after 50 steps: uninterrupted %.3g, resumed on 4 %.3g, "
      "resumed on 2 %.3g\n",
      worst(uninterrupted[0]), worst(on_four[0]), worst(on_two[0]));
  // Issue 36's goal, tighter than the tolerance of the other comparisons.
  EXPECT_LT(worst(uninterrupted[0]), 1e-5) << "stage 3 on 4";
  EXPECT_LT(worst(on_two[0]), 1e-5) << "stage 3 on 4, resumed on 2";
  remove_tree(dir);
}

// A Linear plus a bias of its own that forward adds only while `use_extra` is set: a branch that
// some steps skip.
struct GateImpl : torch::nn::Module {
  GateImpl() : linear(register_module("linear", torch::nn::Linear(16, 4))) {
    extra = register_parameter("extra", torch::zeros({4}));
  }
  torch::Tensor forward(torch::Tensor x) {
    auto out = linear->forward(x);
    return use_extra ? out + extra : out;
  }
  torch::nn::Linear linear;
  torch::Tensor extra;
  bool use_extra = true;
};
TORCH_MODULE(Gate);

// `steps` AdamW steps of two blocks, the second of which adds its `extra` on odd steps only (on
// even ones, starting with the first, no process uses it): the parameters, flat, gathered; or,
// when one is thrown, the error's text (and no tensor).
torch::Tensor train_with_a_branch(int rank, int stage, bool allow_unused, std::string* error,
                                  int steps = 10) {
  Accelerator acc(
      AcceleratorOptions().cpu(true).zero_stage(stage).allow_unused_parameters(allow_unused));
  torch::manual_seed(21);
  Gate gate;
  auto model = stage == 3
                   ? torch::nn::Sequential(Sharded(torch::nn::Linear(8, 16)), torch::nn::Tanh(),
                                           Sharded(gate))
                   : torch::nn::Sequential(torch::nn::Linear(8, 16), torch::nn::Tanh(), gate);
  torch::optim::AdamW adamw(model->parameters(), torch::optim::AdamWOptions(1e-2));
  auto [m, opt] = acc.prepare(model, adamw);
  try {
    for (int step = 0; step < steps; ++step) {
      gate->use_extra = step % 2 == 1;
      torch::manual_seed(500 + step * 2 + rank);
      acc.backward(m->forward(torch::randn({4, 8})).pow(2).mean());
      opt.step();
      opt.zero_grad();
    }
  } catch (const std::exception& e) {
    *error = e.what();
    return torch::Tensor();
  }
  GatheredParameters whole(*m);
  return flat_parameters(*m);
}

// A parameter of a sharded block that some steps skip (Sharded ignored allow_unused_parameters
// before): allowed, stage 3 trains as stage 0 does with the same option; not allowed, every
// process is told which parameter and the fix at the end of the first such backward pass.
TEST(Zero, Stage3WithAParameterSomeStepsSkipTrainsAsStage0OrNamesIt) {
  auto options = LaunchOptions()
                     .processes_per_node(2)
                     .collective_timeout(std::chrono::seconds(60))
                     .verbose(false);
  auto run = [&](int stage, bool allow) {
    return launch(
        [stage, allow](int rank) {
          std::string error;
          auto params = train_with_a_branch(rank, stage, allow, &error);
          EXPECT_TRUE(error.empty() || !allow) << "rank " << rank << ": " << error;
          return torch::cat({params, torch::tensor({error.empty() ? 0.0f : 1.0f})});
        },
        options);
  };
  const auto plain = run(0, true);
  const auto sharded = run(3, true);
  for (size_t r = 0; r < 2; ++r) {
    const int64_t n = plain[r].numel() - 1;
    expect_same_training(sharded[r].narrow(0, 0, n), plain[0].narrow(0, 0, n),
                         "stage 3 with a branch, rank " + std::to_string(r));
  }
  const auto messages = launch(
      [](int rank) {
        std::string error;
        train_with_a_branch(rank, 3, false, &error, /*steps=*/1);
        return error;
      },
      options);
  for (const auto& m : messages) {
    EXPECT_TRUE(contains(m, "1 of 3 trainable parameters of a sharded block") &&
                contains(m, "extra") && contains(m, "allow_unused_parameters"))
        << m;
  }
}

// The fused optimizer state of a whole optimizer file (a stage-0 save, or `checkpoint merge
// --optimizer` of a sharded one): its two state buffers, end to end.
std::pair<torch::Tensor, torch::Tensor> whole_fused_state(const std::string& file) {
  torch::serialize::InputArchive archive, fused;
  archive.load_from(file);
  archive.read("accelerant_fused_updater", fused);
  torch::Tensor numels, first, second;
  fused.read("accelerant_fused_numels", numels);
  EXPECT_EQ(numels.sum().item<int64_t>(), parameter_count()) << file;
  fused.read("accelerant_fused_state1", first);
  fused.read("accelerant_fused_state2", second);
  return {first, second};
}

// Stage 3: every process writes its optimizer's state of its shares, the main process the whole
// weights (gathered for the save); the same number of processes under stage 3 resumes bit for
// bit, also through clipping. `checkpoint merge --optimizer` makes the shares' states the whole
// state, which equals a stage-0 run's at the same step.
TEST(Zero, Stage3ResumesBitForBitAndMergesIntoTheWholeState) {
  const std::string dir = make_temp_dir();
  TrainingRun run;
  run.stage = 3;
  run.clip = true;
  run.steps = 20;
  run.save_dir = dir + "/zero3";
  run.save_at = 8;
  const auto uninterrupted = train_on(2, run);
  EXPECT_TRUE(std::ifstream(dir + "/zero3/rank_1/optimizer_0.pt").good());
  EXPECT_FALSE(std::ifstream(dir + "/zero3/optimizer_0.pt").good());
  // What `accelerant checkpoint verify` checks: the processes' states belong together.
  EXPECT_NO_THROW(verify_checkpoint_contents(dir + "/zero3"));
  const auto merged =
      merge_checkpoint(dir + "/zero3", dir + "/merged", MergeCheckpointOptions().optimizer(true));
  EXPECT_EQ(merged.models.size(), 1u);
  ASSERT_EQ(merged.optimizers.size(), 1u);
  TrainingRun plain = run;
  plain.stage = 0;
  plain.save_dir = dir + "/plain";
  train_on(2, plain);
  const auto [sharded_avg, sharded_sq] = whole_fused_state(merged.optimizers[0].path);
  const auto [plain_avg, plain_sq] = whole_fused_state(dir + "/plain/optimizer_0.pt");
  EXPECT_TRUE(torch::allclose(sharded_avg, plain_avg, 1e-4, 1e-7))
      << "exp_avg differs by " << (sharded_avg - plain_avg).abs().max().item<double>();
  EXPECT_TRUE(torch::allclose(sharded_sq, plain_sq, 1e-4, 1e-10))
      << "exp_avg_sq differs by " << (sharded_sq - plain_sq).abs().max().item<double>();

  const auto same = train_on(2, resumed_from_its_save(run));
  expect_bit_for_bit(same, uninterrupted, "stage-3");
  for (int r = 0; r < 2; ++r) EXPECT_EQ(optimizer_steps_of(same[r]), run.steps) << "rank " << r;
  remove_tree(dir);
}

// A stage-3 checkpoint loads on another number of processes and under every other stage (its
// shares' states made whole, and cut again for a stage-3 run), and checkpoints of stage 2 and of
// stage 0 without fused optimizers (torch::optim's own per-parameter state) load under stage 3.
// Each continues the uninterrupted run, up to the rounding of another reduction order.
TEST(Zero, Stage3CheckpointsLoadOnAnotherNumberOfProcessesAndUnderEveryStage) {
  const std::string dir = make_temp_dir();
  TrainingRun run;
  run.stage = 3;
  run.clip = true;
  run.steps = 16;
  run.save_dir = dir + "/zero3";
  run.save_at = 6;
  const auto uninterrupted = train_on(2, run);
  struct Resume {
    int world, stage;
    bool fused;
  };
  for (const Resume& r : {Resume{4, 3, true}, Resume{1, 3, true}, Resume{2, 0, false},
                          Resume{2, 2, true}, Resume{4, 1, true}}) {
    TrainingRun resumed = resumed_from_its_save(run);
    resumed.stage = r.stage;
    resumed.fused = r.fused;
    const auto result = train_on(r.world, resumed);
    expect_same_training(parameters_of(result[0]), parameters_of(uninterrupted[0]),
                         "stage 3 on 2 resumed as stage " + std::to_string(r.stage) + " on " +
                             std::to_string(r.world) + (r.fused ? "" : ", unfused"));
  }
  for (const auto& [stage, fused] : std::vector<std::pair<int, bool>>{{2, true}, {0, false}}) {
    TrainingRun other = run;
    other.stage = stage;
    other.fused = fused;
    other.save_dir = dir + "/other" + std::to_string(stage);
    const auto other_uninterrupted = train_on(2, other);
    TrainingRun into_stage3 = resumed_from_its_save(other);
    into_stage3.stage = 3;
    into_stage3.fused = true;
    const auto four = train_on(4, into_stage3);
    expect_same_training(parameters_of(four[0]), parameters_of(other_uninterrupted[0]),
                         "stage " + std::to_string(stage) + " resumed under stage 3 on 4");
  }
  remove_tree(dir);
}

// Issue 38: a ZeRO checkpoint loads under another stage, as docs/zero.md says: saved with stage 2,
// resumed with stage 0 and an optimizer that steps by itself (fused_optimizers off), on 2
// processes and on one; and saved that way, resumed under stage 2. Each continues the
// uninterrupted run (up to the rounding of another reduction order and of the unfused update).
TEST(Zero, ACheckpointLoadsUnderAnotherStageAndWithoutFusedOptimizers) {
  const std::string dir = make_temp_dir();
  TrainingRun sharded;
  sharded.stage = 2;
  sharded.steps = 20;
  sharded.save_dir = dir + "/zero2";
  sharded.save_at = 8;
  const auto uninterrupted = train_on(2, sharded);

  TrainingRun plain = sharded;
  plain.save_dir.clear();
  plain.load_dir = dir + "/zero2";
  plain.stage = 0;
  plain.fused = false;
  const auto on_two = train_on(2, plain);
  expect_same_training(parameters_of(on_two[0]), parameters_of(uninterrupted[0]),
                       "stage 2 resumed as stage 0, unfused, on 2");
  const auto on_one = train_on(1, plain);
  expect_same_training(parameters_of(on_one[0]), parameters_of(uninterrupted[0]),
                       "stage 2 resumed as stage 0, unfused, on 1");

  TrainingRun saved_plain = sharded;
  saved_plain.stage = 0;
  saved_plain.fused = false;
  saved_plain.save_dir = dir + "/plain";
  const auto plain_whole = train_on(2, saved_plain);
  expect_same_training(parameters_of(plain_whole[0]), parameters_of(uninterrupted[0]),
                       "stage 0 unfused against stage 2");
  TrainingRun into_zero = sharded;
  into_zero.save_dir.clear();
  into_zero.load_dir = dir + "/plain";
  const auto zero = train_on(2, into_zero);
  expect_same_training(parameters_of(zero[0]), parameters_of(plain_whole[0]),
                       "stage 0 unfused resumed under stage 2");
  remove_tree(dir);
}

// Bytes malloc has handed out and not had back (LibTorch's CPU tensors come from it).
int64_t heap_in_use() {
  const struct mallinfo2 info = mallinfo2();
  return static_cast<int64_t>(info.uordblks + info.hblkhd);
}

// Sixteen buckets of about 1 MiB (one weight each): enough that stage 2's few reusable bucket
// buffers are small against the gradients.
torch::nn::Sequential many_buckets_model() {
  torch::manual_seed(5);
  torch::nn::Sequential model;
  for (int i = 0; i < 16; ++i) model->push_back(torch::nn::Linear(512, 512));
  return model;
}

// What a process holds for the gradients after backward: returns, for the second of two steps,
// the gradients' bytes, the heap in use after backward and how many parameters then have a .grad.
torch::Tensor gradient_memory(int rank, int world, int stage) {
  Accelerator acc(
      AcceleratorOptions().cpu(true).zero_stage(stage).fused_optimizers(true).bucket_cap_mb(1));
  auto model = many_buckets_model();
  torch::optim::AdamW adamw(model->parameters(), torch::optim::AdamWOptions(1e-3));
  auto [m, opt] = acc.prepare(model, adamw);
  int64_t grad_bytes = 0;
  for (const auto& p : m->parameters()) grad_bytes += p.numel() * p.element_size();
  std::vector<double> out;
  for (int step = 0; step < 2; ++step) {
    torch::manual_seed(100 * step + rank);
    auto loss = m->forward(torch::randn({4, 512})).pow(2).mean();
    acc.backward(loss);
    loss = torch::Tensor();
    out = {static_cast<double>(grad_bytes), static_cast<double>(heap_in_use()), 0.0};
    for (const auto& p : m->parameters()) out[2] += p.grad().defined() ? 1 : 0;
    opt.step();
    opt.zero_grad();
  }
  return torch::tensor(out, torch::kDouble);
}

// Under stage 2 the gradients live in the reduced shares only: after backward no parameter keeps
// a .grad, and a process holds its half (1/N) of the gradients plus a few bucket buffers kept for
// the next backward, where stage 1 holds every bucket whole.
TEST(Zero, Stage2KeepsOnlyItsShareOfTheGradients) {
  std::map<int, std::vector<torch::Tensor>> by_stage;
  for (int stage : {1, 2}) {
    by_stage[stage] = launch([stage](int rank) { return gradient_memory(rank, 2, stage); },
                             LaunchOptions()
                                 .processes_per_node(2)
                                 .collective_timeout(std::chrono::seconds(60))
                                 .verbose(false));
  }
  const int64_t parameters = static_cast<int64_t>(many_buckets_model()->parameters().size());
  for (int r = 0; r < 2; ++r) {
    const auto& one = by_stage[1][r];
    const auto& two = by_stage[2][r];
    const double grad_bytes = one[0].item<double>();
    EXPECT_EQ(one[2].item<double>(), parameters) << "rank " << r << ": stage 1 keeps every .grad";
    EXPECT_EQ(two[2].item<double>(), 0) << "rank " << r << ": stage 2 left a .grad set";
    const double saved = one[1].item<double>() - two[1].item<double>();
    // Stage 1 holds whole buckets, stage 2 one share of two and about three 1 MiB buffers: a
    // third of 16 MiB saved, give or take.
    EXPECT_GT(saved, 0.2 * grad_bytes)
        << "rank " << r << ": stage 2 saves " << saved << " bytes of " << grad_bytes;
    EXPECT_LT(saved, 0.55 * grad_bytes)
        << "rank " << r << ": stage 2 saves " << saved << " bytes of " << grad_bytes;
  }
}

TEST(Zero, MisuseIsRefusedWithTheFix) {
  auto messages = launch(
      [](int) -> std::string {
        std::string out;
        out += error_message([] { Accelerator acc(AcceleratorOptions().cpu(true).zero_stage(4)); });
        out += "\n";
        out += error_message([] {
          Accelerator acc(AcceleratorOptions().cpu(true).zero_stage(1));
          auto model = zero_model();
          auto other = torch::nn::Linear(4, 4);
          std::vector<torch::Tensor> params = model->parameters();
          params.push_back(other->weight);
          torch::optim::AdamW adamw(params, torch::optim::AdamWOptions(1e-3));
          auto prepared = acc.prepare(model, adamw);
        });
        out += "\n";
        out += error_message([] {
          Accelerator acc(AcceleratorOptions().cpu(true).zero_stage(1));
          auto model = zero_model();
          torch::optim::AdamW adamw(model->parameters(), torch::optim::AdamWOptions(1e-3));
          auto opt = acc.prepare(adamw);  // before its model
        });
        out += "\n";
        out += error_message([] {
          Accelerator acc(AcceleratorOptions().cpu(true).zero_stage(1));
          auto model = zero_model();
          auto other = torch::nn::Linear(4, 4);
          torch::optim::AdamW adamw(other->parameters(), torch::optim::AdamWOptions(1e-3));
          auto prepared = acc.prepare(model, adamw);  // an optimizer of another model
        });
        out += "\n";
        out += error_message([] {  // a loss scaler under stage 2 in graph mode
          Accelerator acc(AcceleratorOptions().cpu(true).zero_stage(2).fused_optimizers(true));
          acc.state()->scaler = std::make_shared<GradScaler>(GradScalerOptions(), torch::kCPU);
          auto model = zero_model();
          torch::optim::AdamW adamw(model->parameters(), torch::optim::AdamWOptions(1e-3));
          auto [m, opt] = acc.prepare(model, adamw);
          auto step = acc.compile(
              [&, &m = m, &opt = opt](const GraphStep::Inputs& in) {
                acc.backward(m->forward(in[0]).pow(2).mean());
                opt.step();
                opt.zero_grad();
                return GraphStep::Outputs{};
              },
              GraphStepOptions().emulate_replays(true));
          step({torch::ones({4, 64})});
        });
        out += "\n";
        out += error_message([] {  // stage 3: an optimizer over Sharded blocks before its model
          Accelerator acc(AcceleratorOptions().cpu(true).zero_stage(3));
          auto model = zero_model(true);
          torch::optim::AdamW adamw(model->parameters(), torch::optim::AdamWOptions(1e-3));
          auto opt = acc.prepare(adamw);
          auto m = acc.prepare(model);
        });
        return out;
      },
      LaunchOptions()
          .processes_per_node(2)
          .collective_timeout(std::chrono::seconds(60))
          .verbose(false));
  const std::string& m = messages[0];
  EXPECT_TRUE(contains(m, "zero_stage is 4")) << m;
  EXPECT_TRUE(contains(m, "is not a trainable parameter of the prepared model")) << m;
  EXPECT_TRUE(contains(m, "no model is prepared yet")) << m;
  EXPECT_TRUE(contains(m, "none of the optimizer's 2 parameters")) << m;
  EXPECT_TRUE(contains(m, "unscale_shares_ inside a graph step")) << m;
  EXPECT_TRUE(contains(m, "was prepared before the model")) << m;
  EXPECT_TRUE(contains(m, "Fix:")) << m;
}

// save_model under stage 3 gathers each sharded block while rank 0 writes it: the file holds the
// whole trained weights, under the names the model gives them; load_model puts them back into
// the shares (two steps later). What stage 3 cannot do yet is refused on every process with the
// fix; end_training leaves the model whole, for one process to use alone.
torch::Tensor stage3_weights_and_refusals(const std::string& dir) {
  Accelerator acc(AcceleratorOptions().cpu(true).zero_stage(3));
  auto model = zero_model(true);
  torch::optim::AdamW adamw(model->parameters(), torch::optim::AdamWOptions(1e-2));
  auto [m, opt] = acc.prepare(model, adamw);
  auto train_steps = [&, &m = m, &opt = opt](int steps) {
    for (int step = 0; step < steps; ++step) {
      acc.backward(m->forward(torch::randn({4, 64})).pow(2).mean());
      opt.step();
      opt.zero_grad();
    }
  };
  auto same_as_saved = [&, &m = m] {
    GatheredParameters whole(*m);
    const auto saved = read_model_safetensors(dir);
    bool same = saved.size() == m->named_parameters().size();
    for (const auto& p : m->named_parameters()) {
      same = same && saved.count(p.key()) && torch::equal(saved.at(p.key()), p.value());
    }
    return same ? 1.0 : 0.0;
  };
  train_steps(3);
  acc.save_model(m, dir);
  std::vector<double> out{same_as_saved()};
  train_steps(2);
  out.push_back(1.0 - same_as_saved());  // the weights moved on
  acc.load_model(m, dir);
  out.push_back(same_as_saved());
  auto refused = [](const std::function<void()>& f, const std::string& cause) {
    const std::string message = error_message(f);
    return contains(message, cause) && contains(message, "Fix:") ? 1.0 : 0.0;
  };
  out.push_back(refused([&] { acc.save(m, dir + "/model.pt"); }, "save_module of a model with"));
  out.push_back(refused(
      [&] {
        acc.compile([](const GraphStep::Inputs&) { return GraphStep::Outputs{}; },
                    GraphStepOptions().emulate_replays(true));
      },
      "compile under ZeRO stage 3"));
  // end_training makes the blocks whole again: the model is usable by one process alone after.
  const int rank = acc.rank();
  acc.end_training();
  bool whole = true;
  for (const auto& block : sharded_blocks(*m)) whole = whole && !block->sharded();
  out.push_back(whole ? same_as_saved() : 0.0);
  if (rank == 0) {
    out.push_back(m->forward(torch::ones({1, 64})).isfinite().all().item<bool>() ? 1.0 : 0.0);
  } else {
    out.push_back(1.0);
  }
  return torch::tensor(out, torch::kDouble);
}

TEST(Zero, Stage3SavesAndLoadsTheWholeWeightsEndsWholeAndRefusesWhatItCannotDoYet) {
  const std::string dir = make_temp_dir();
  const auto results = launch([dir](int) { return stage3_weights_and_refusals(dir); },
                              LaunchOptions().processes_per_node(2).verbose(false));
  const char* cases[] = {"save_model writes the whole weights",
                         "training moves them on",
                         "load_model puts them back",
                         "save refused",
                         "compile refused",
                         "end_training leaves the weights whole",
                         "one process alone runs the model after end_training"};
  for (size_t r = 0; r < results.size(); ++r) {
    ASSERT_EQ(results[r].numel(), 7);
    for (int64_t k = 0; k < results[r].numel(); ++k) {
      EXPECT_EQ(results[r][k].item<double>(), 1.0) << "rank " << r << ": " << cases[k];
    }
  }
  remove_tree(dir);
}

// A field of /proc/self/status in KiB (VmHWM, VmRSS).
double status_kib(const std::string& field) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::stod(line.substr(field.size() + 1));
  }
  return -1;
}

// `count` sharded blocks of 4 MiB each, built sharded under `acc` (stage 3).
torch::nn::Sequential sharded_blocks_of_4_mib(Accelerator& acc, int count) {
  torch::manual_seed(9);
  const ShardedStart start = acc.sharded_start();
  torch::nn::Sequential blocks;
  for (int b = 0; b < count; ++b) {
    blocks->push_back(Sharded(torch::nn::Linear(torch::nn::LinearOptions(2048, 512).bias(false))));
  }
  return blocks;
}

// What `work` adds to this process's peak RSS, in MiB.
double peak_added_mib(const std::function<void()>& work) {
  // Free memory the allocator keeps would serve the gathers without adding to the RSS: given
  // back first, so that the peak counts every byte `work` holds at once.
  malloc_trim(0);
  { std::ofstream("/proc/self/clear_refs") << "5"; }  // VmHWM from here
  const double before = status_kib("VmRSS");
  work();
  return (status_kib("VmHWM") - before) / 1024;
}

// What save_model adds to a stage-3 process's peak RSS, in MiB, for 16 blocks of 4 MiB (64 MiB
// whole), and whether the saved weights are the model's.
torch::Tensor stage3_save_model_peak(const std::string& dir) {
  Accelerator acc(AcceleratorOptions().cpu(true).zero_stage(3));
  auto m = acc.prepare(sharded_blocks_of_4_mib(acc, 16));
  const double added = peak_added_mib([&] { acc.save_model(m, dir); });
  GatheredParameters whole(*m);
  const auto saved = read_model_safetensors(dir);
  bool same = saved.size() == 16;
  for (const auto& p : m->named_parameters())
    same = same && torch::equal(saved.at(p.key()), p.value());
  return torch::tensor({added, same ? 1.0 : 0.0}, torch::kDouble);
}

// save_model under stage 3 streams the weights one block at a time: the peak grows by a few
// blocks (4 MiB each; the bound leaves room for what the allocator keeps of freed blocks, more
// when the machine is busy), not by the whole model (64 MiB), and the file holds the whole
// weights.
TEST(Zero, Stage3SaveModelGathersOneBlockAtATime) {
  const std::string dir = make_temp_dir();
  const auto results = launch([&](int) { return stage3_save_model_peak(dir + "/weights"); },
                              LaunchOptions().processes_per_node(2).verbose(false));
  for (size_t r = 0; r < results.size(); ++r) {
    const double added = results[r][0].item<double>();
    std::printf("rank %zu: save_model added %.1f MiB to the peak RSS\n", r, added);
    EXPECT_LT(added, 32.0) << "rank " << r << ": save_model held half the model or more";
    EXPECT_EQ(results[r][1].item<double>(), 1.0) << "rank " << r << ": the saved weights differ";
  }
  remove_tree(dir);
}

// What save_state and then load_state add to a stage-3 process's peak RSS, in MiB, for 16 blocks
// of 4 MiB (64 MiB whole), and whether the load brought back the saved weights (the shares are
// zeroed in between, so that it has something to restore).
torch::Tensor stage3_checkpoint_peaks(const std::string& dir) {
  Accelerator acc(AcceleratorOptions().cpu(true).zero_stage(3));
  auto m = acc.prepare(sharded_blocks_of_4_mib(acc, 16));
  std::vector<torch::Tensor> saved;
  {
    GatheredParameters whole(*m);
    for (const auto& p : m->parameters()) saved.push_back(p.detach().clone());
  }
  const double save_added = peak_added_mib([&] { acc.save_state(dir); });
  {
    torch::NoGradGuard no_grad;
    for (const auto& block : sharded_blocks(*m)) {
      for (const auto& share : block->shares()) share.detach().zero_();
    }
  }
  const double load_added = peak_added_mib([&] { acc.load_state(dir); });
  bool same = true;
  {
    GatheredParameters whole(*m);
    size_t i = 0;
    for (const auto& p : m->parameters()) same = same && torch::equal(p, saved[i++]);
  }
  return torch::tensor({save_added, load_added, same ? 1.0 : 0.0}, torch::kDouble);
}

// save_state and load_state under stage 3 stream the model file one block at a time, so neither
// holds the whole model (64 MiB): a save adds a few blocks (4 MiB each) to the peak; a load adds
// as much and the copy of this process's shares (16 MiB on 4 processes) that it puts back if any
// process fails. The bounds leave room for what the allocator keeps of freed blocks. The file is
// safetensors that an independent reader (tests/safetensors_interop.py, json + numpy) reads.
TEST(Zero, Stage3SaveStateAndLoadStateHoldOneBlockAtATime) {
  const std::string dir = make_temp_dir();
  const auto results = launch([&](int) { return stage3_checkpoint_peaks(dir + "/ckpt"); },
                              LaunchOptions().processes_per_node(4).verbose(false));
  for (size_t r = 0; r < results.size(); ++r) {
    const double save_added = results[r][0].item<double>();
    const double load_added = results[r][1].item<double>();
    std::printf("rank %zu: save_state added %.1f MiB to the peak RSS, load_state %.1f MiB\n", r,
                save_added, load_added);
    EXPECT_LT(save_added, 24.0) << "rank " << r << ": save_state held more than a few blocks";
    EXPECT_LT(load_added, 48.0) << "rank " << r << ": load_state held nearly the whole model";
    EXPECT_EQ(results[r][2].item<double>(), 1.0) << "rank " << r << ": the loaded weights differ";
  }
  EXPECT_FALSE(std::ifstream(dir + "/ckpt/model_0.pt").good())
      << "stage 3 saved the model as an archive";
  // The independent reader takes a save_model directory: the checkpoint's file, named so.
  const std::string weights = dir + "/weights";
  ASSERT_EQ(::mkdir(weights.c_str(), 0755), 0);
  std::ofstream(weights + "/model.safetensors", std::ios::binary)
      << slurp(dir + "/ckpt/model_0.safetensors");
  auto run = start_program({"/usr/bin/python3", test_file_path("safetensors_interop.py"), weights,
                            weights + "/py.safetensors"});
  std::string out;
  ASSERT_EQ(finish_program(run, out, std::chrono::seconds(60)), 0) << out;
  const auto summary = nlohmann::json::parse(out);
  EXPECT_EQ(summary["tensors"].get<size_t>(), 16u) << out;
  EXPECT_EQ(summary["format"], "pt") << out;
  // The checks of the files: the whole file's CRC-32 (read a piece at a time), its contents.
  EXPECT_NO_THROW(verify_checkpoint_contents(dir + "/ckpt"));
  {
    std::fstream file(dir + "/ckpt/model_0.safetensors",
                      std::ios::in | std::ios::out | std::ios::binary);
    file.seekg(-5, std::ios::end);
    const char byte = static_cast<char>(file.get());
    file.seekp(-5, std::ios::end);
    file.put(static_cast<char>(byte ^ 0x5a));  // another byte, whatever it was
  }
  const std::string damaged = error_message([&] { verify_checkpoint(dir + "/ckpt"); });
  EXPECT_TRUE(contains(damaged, "model_0.safetensors is corrupted")) << damaged;
  // load_state refuses it on every process, naming the file, and changes nothing.
  const auto refused = launch(
      [&](int) {
        Accelerator acc(AcceleratorOptions().cpu(true).zero_stage(3));
        auto m = acc.prepare(sharded_blocks_of_4_mib(acc, 16));
        auto whole_now = [&] {
          GatheredParameters whole(*m);
          std::vector<torch::Tensor> values;
          for (const auto& p : m->parameters()) values.push_back(p.detach().clone());
          return torch::cat(values);  // 1-D weights of equal width: one tensor
        };
        const torch::Tensor before = whole_now();
        const std::string e = error_message([&] { acc.load_state(dir + "/ckpt"); });
        return torch::tensor({contains(e, "model_0.safetensors is corrupted") ? 1.0 : 0.0,
                              torch::equal(before, whole_now()) ? 1.0 : 0.0},
                             torch::kDouble);
      },
      LaunchOptions().processes_per_node(4).verbose(false));
  for (size_t r = 0; r < refused.size(); ++r) {
    EXPECT_EQ(refused[r][0].item<double>(), 1.0) << "rank " << r << " was not told the file";
    EXPECT_EQ(refused[r][1].item<double>(), 1.0) << "rank " << r << "'s weights changed";
  }
  remove_tree(dir);
}

TEST(Zero, WithOneProcessEveryStageIsPlainTraining) {
  TrainingRun run;
  run.steps = 10;
  const auto base = train_on(1, run);
  for (int stage : {2, 3}) {  // stage 3 with its Sharded blocks, which pass through
    run.stage = stage;
    const auto zero = train_on(1, run);
    EXPECT_TRUE(torch::equal(base[0], zero[0])) << "stage " << stage;
  }
}

}  // namespace
