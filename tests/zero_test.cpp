// ZeRO (AcceleratorOptions::zero_stage): stages 1 and 2 must train exactly as plain data
// parallelism does (stage 0), on 2 and 4 real processes, also with gradient accumulation,
// clipping and bf16 autocast; each process must hold only its share of the optimizer state; a
// sharded checkpoint must resume bit for bit on the same number of processes and load on
// another; and misuse must be refused with the fix.
#include <accelerant/accelerant.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <fstream>
#include <optional>
#include <set>

#include "test_support.h"

using namespace accelerant;
using namespace accelerant::testing;

namespace {

constexpr int kGlobalBatch = 8;

// How one training run goes.
struct TrainingRun {
  int stage = 0;
  bool accumulate = false;  // two micro-steps of half the batch per optimizer step
  bool clip = false;        // clip the gradient norm to 0.05 (below the norms seen: it acts)
  bool bf16 = false;        // bf16 autocast
  bool graph = false;       // steps through accelerator.compile, replays emulated (the device
                            // path of the fused update, the all-gather as a host effect)
  int steps = 50;
  std::string save_dir;  // save after step save_at (1-based), then go on
  int save_at = 0;
  std::string load_dir;  // start from this checkpoint
};

// Two gradient buckets of 1 MiB at most (and a first one of less), parameters of odd sizes, so
// that the shares cut through parameters.
torch::nn::Sequential zero_model() {
  torch::manual_seed(3);
  return torch::nn::Sequential(torch::nn::Linear(64, 1023), torch::nn::Tanh(),
                               torch::nn::Linear(1023, 257), torch::nn::Tanh(),
                               torch::nn::Linear(257, 10));
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
                      .fused_optimizers(true)
                      .bucket_cap_mb(1)
                      .mixed_precision(run.bf16 ? "bf16" : "no")
                      .gradient_accumulation_steps(run.accumulate ? 2 : 1));
  auto model = zero_model();
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
      acc.backward(loss);
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
  return torch::cat({flat_parameters(*m), torch::tensor({static_cast<float>(state_elements)})});
}

std::vector<torch::Tensor> train_on(int world, const TrainingRun& run) {
  auto options =
      LaunchOptions().processes_per_node(world).timeout(std::chrono::seconds(90)).verbose(false);
  return launch([run, world](int rank) { return train(rank, world, run); }, options);
}

int64_t parameter_count() {
  int64_t n = 0;
  for (const auto& p : zero_model()->parameters()) n += p.numel();
  return n;
}

torch::Tensor parameters_of(const torch::Tensor& result) {
  return result.narrow(0, 0, result.numel() - 1);
}

int64_t state_elements_of(const torch::Tensor& result) {
  return static_cast<int64_t>(result[result.numel() - 1].item<float>());
}

// fp32 tolerance: the stages reduce the same numbers, but a reduce-scatter may sum them in
// another order than an all-reduce.
void expect_same_training(const torch::Tensor& a, const torch::Tensor& b, const std::string& what) {
  const double worst = (a - b).abs().max().item<double>();
  EXPECT_LT(worst, 2e-5) << what << ": largest difference " << worst;
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

INSTANTIATE_TEST_SUITE_P(TwoAndFour, ZeroStages, ::testing::Values(2, 4));

TEST(Zero, AccumulationClippingAndBf16TrainAsStage0) {
  for (int variant = 0; variant < 3; ++variant) {
    TrainingRun run;
    run.steps = 20;
    run.accumulate = variant == 0;
    run.clip = variant == 1;
    run.bf16 = variant == 2;
    const char* name = variant == 0 ? "accumulation" : variant == 1 ? "clipping" : "bf16";
    const auto base = train_on(2, run);
    for (int stage : {1, 2}) {
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

  TrainingRun resumed = whole;
  resumed.save_dir.clear();
  resumed.load_dir = dir + "/ckpt";
  const auto same = train_on(2, resumed);
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(torch::equal(parameters_of(same[r]), parameters_of(uninterrupted[r])))
        << "rank " << r << ": the resumed run differs from the uninterrupted one";
  }
  // On 4 processes (stage 1), and on 1 (no sharding): the same trajectory up to rounding.
  resumed.stage = 1;
  const auto four = train_on(4, resumed);
  expect_same_training(parameters_of(four[0]), parameters_of(uninterrupted[0]), "resumed on 4");
  resumed.stage = 0;
  const auto one = train_on(1, resumed);
  expect_same_training(parameters_of(one[0]), parameters_of(uninterrupted[0]), "resumed on 1");
  remove_tree(dir);
}

// Bytes of the pages under the tensors' elements that are resident in memory (mincore), each
// page counted once.
int64_t resident_bytes(const std::vector<torch::Tensor>& tensors) {
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  std::set<uintptr_t> pages;
  for (const auto& t : tensors) {
    const auto begin = reinterpret_cast<uintptr_t>(t.data_ptr());
    const uintptr_t end = begin + t.numel() * t.element_size();
    for (uintptr_t p = begin / page * page; p < end; p += page) pages.insert(p);
  }
  int64_t resident = 0;
  for (uintptr_t p : pages) {
    unsigned char in_core = 0;
    if (mincore(reinterpret_cast<void*>(p), page, &in_core) != 0) ADD_FAILURE() << "mincore failed";
    if (in_core & 1) resident += static_cast<int64_t>(page);
  }
  return resident;
}

// Under stage 2, once backward has reduce-scattered the buckets, a process keeps only its share
// of the gradients in memory, and none after zero_grad(); stage 1 keeps them all. Two steps, so
// that the pages given back come back for the second backward. Returns, per rank and step, the
// gradients' bytes, then the resident bytes after backward and after zero_grad.
torch::Tensor resident_gradients(int rank, int world, int stage) {
  Accelerator acc(
      AcceleratorOptions().cpu(true).zero_stage(stage).fused_optimizers(true).bucket_cap_mb(1));
  auto model = zero_model();
  torch::optim::AdamW adamw(model->parameters(), torch::optim::AdamWOptions(1e-3));
  auto [m, opt] = acc.prepare(model, adamw);
  std::vector<float> out;
  for (int step = 0; step < 2; ++step) {
    auto [x, y] = global_batch(step);
    const int per_rank = kGlobalBatch / world;
    auto loss = (m->forward(x.narrow(0, rank * per_rank, per_rank)) -
                 y.narrow(0, rank * per_rank, per_rank))
                    .pow(2)
                    .mean();
    acc.backward(loss);
    std::vector<torch::Tensor> grads;
    int64_t bytes = 0;
    for (const auto& p : m->parameters()) {
      grads.push_back(p.grad());
      bytes += p.grad().numel() * p.grad().element_size();
    }
    out.push_back(static_cast<float>(bytes));
    out.push_back(static_cast<float>(resident_bytes(grads)));
    opt.step();
    opt.zero_grad();
    out.push_back(static_cast<float>(resident_bytes(grads)));
    for (const auto& g : grads) {
      if (g.abs().max().item<float>() != 0.0f) ADD_FAILURE() << "zero_grad left a gradient";
    }
  }
  return torch::tensor(out);
}

TEST(Zero, Stage2KeepsOnlyItsShareOfTheGradientsInMemory) {
  for (int stage : {1, 2}) {
    const auto results = launch(
        [stage](int rank) { return resident_gradients(rank, 2, stage); },
        LaunchOptions().processes_per_node(2).timeout(std::chrono::seconds(60)).verbose(false));
    for (int r = 0; r < 2; ++r) {
      for (int step = 0; step < 2; ++step) {
        const double bytes = results[r][3 * step].item<double>();
        const double after_backward = results[r][3 * step + 1].item<double>() / bytes;
        const double after_zero = results[r][3 * step + 2].item<double>() / bytes;
        const std::string what = "stage " + std::to_string(stage) + ", rank " + std::to_string(r) +
                                 ", step " + std::to_string(step);
        if (stage == 1) {
          EXPECT_GT(after_backward, 0.95) << what;
          EXPECT_GT(after_zero, 0.95) << what;
        } else {
          // Half of the gradients, plus the partial pages at the shares' edges.
          EXPECT_LT(after_backward, 0.6) << what;
          EXPECT_GT(after_backward, 0.4) << what;
          EXPECT_LT(after_zero, 0.1) << what;
        }
      }
    }
  }
}

TEST(Zero, MisuseIsRefusedWithTheFix) {
  auto messages = launch(
      [](int) -> std::string {
        std::string out;
        out += error_message([] { Accelerator acc(AcceleratorOptions().cpu(true).zero_stage(3)); });
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
        return out;
      },
      LaunchOptions().processes_per_node(2).timeout(std::chrono::seconds(60)).verbose(false));
  const std::string& m = messages[0];
  EXPECT_TRUE(contains(m, "zero_stage is 3")) << m;
  EXPECT_TRUE(contains(m, "is not a trainable parameter of the prepared model")) << m;
  EXPECT_TRUE(contains(m, "no model is prepared yet")) << m;
  EXPECT_TRUE(contains(m, "Fix:")) << m;
}

TEST(Zero, WithOneProcessEveryStageIsPlainTraining) {
  TrainingRun run;
  run.steps = 10;
  const auto base = train_on(1, run);
  run.stage = 2;
  const auto zero = train_on(1, run);
  EXPECT_TRUE(torch::equal(base[0], zero[0]));
}

}  // namespace
