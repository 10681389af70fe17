// ZeRO stage 3's sharded blocks (accelerant/sharded.h), on real processes: a model whose blocks
// are sharded must train exactly as plain data parallelism does (on 2 and 4 processes, also with
// gradient accumulation), each process holding only its shares; a block's parameters must hold
// memory only while its forward and its backward run (observed in the storage, not assumed); and
// misuse (a module changed after shard among it) must be refused with the fix.
#include <accelerant/accelerant.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <csignal>
#include <cstdio>

#include "test_support.h"
#include "train/fused_kernels.h"
#include "train/fused_state_format.h"
#include "train/share_state.h"

using namespace accelerant;
using namespace accelerant::testing;

namespace {

constexpr int kShardedGlobalBatch = 8;

// A replicated first layer and head (the root, as FSDP keeps it) around two sharded blocks whose
// parameters have odd sizes, so that the pieces cut through rows and the last ones are padded.
torch::nn::Sequential blocks_model() {
  torch::manual_seed(5);
  return torch::nn::Sequential(
      torch::nn::Linear(16, 37), torch::nn::Tanh(),
      Sharded(torch::nn::Sequential(torch::nn::Linear(37, 101), torch::nn::Tanh(),
                                    torch::nn::Linear(101, 37))),
      Sharded(torch::nn::Sequential(torch::nn::Linear(37, 53), torch::nn::Tanh())),
      torch::nn::Linear(53, 5));
}

std::pair<torch::Tensor, torch::Tensor> sharded_batch(int step) {
  torch::manual_seed(2000 + step);
  return {torch::randn({kShardedGlobalBatch, 16}), torch::randn({kShardedGlobalBatch, 5})};
}

struct BlocksRun {
  bool sharded = false;
  bool accumulate = false;  // two micro-steps of half the batch per optimizer step
  int steps = 30;
};

// Trains and returns the whole parameters, then this process's share elements and the first
// block's all-gathers and reduce-scatters.
torch::Tensor train_blocks(int rank, int world, const BlocksRun& run) {
  Communicator& comm = ProcessState::get().communicator();
  auto model = blocks_model();
  std::vector<std::shared_ptr<ShardedImpl>> blocks;
  if (run.sharded) blocks = shard_model(*model, comm);
  GradientReducer reducer(replicated_parameters(*model), comm);
  torch::optim::AdamW adamw(parameters_to_update(*model),
                            torch::optim::AdamWOptions(1e-2).weight_decay(0.01));
  const int per_rank = kShardedGlobalBatch / world;
  const int micro = run.accumulate ? 2 : 1;
  for (int step = 0; step < run.steps; ++step) {
    auto [x, y] = sharded_batch(step);
    x = x.narrow(0, rank * per_rank, per_rank), y = y.narrow(0, rank * per_rank, per_rank);
    const int64_t rows = per_rank / micro;
    for (int k = 0; k < micro; ++k) {
      const bool sync = k == micro - 1;
      reducer.set_sync(sync);
      for (const auto& block : blocks) block->set_sync(sync);
      auto out = model->forward(x.narrow(0, k * rows, rows));
      ((out - y.narrow(0, k * rows, rows)).pow(2).mean() / micro).backward();
    }
    adamw.step();
    adamw.zero_grad();
  }
  int64_t share_elements = 0;
  for (const auto& block : blocks) share_elements += block->stats().share_elements;
  const ShardedStats first = blocks.empty() ? ShardedStats{} : blocks.front()->stats();
  GatheredParameters whole(*model);
  return torch::cat(
      {flat_parameters(*model),
       torch::tensor({static_cast<float>(share_elements), static_cast<float>(first.gathers),
                      static_cast<float>(first.reduce_scatters)})});
}

std::vector<torch::Tensor> train_blocks_on(int world, const BlocksRun& run) {
  auto options = LaunchOptions()
                     .processes_per_node(world)
                     .collective_timeout(std::chrono::seconds(60))
                     .verbose(false);
  return launch([run, world](int rank) { return train_blocks(rank, world, run); }, options);
}

torch::Tensor whole_parameters(const torch::Tensor& result) {
  return result.narrow(0, 0, result.numel() - 3);
}

int64_t tail_value(const torch::Tensor& result, int from_end) {
  return static_cast<int64_t>(result[result.numel() - from_end].item<float>());
}

// The elements of the parameters inside the two sharded blocks.
int64_t block_parameter_elements() {
  auto model = blocks_model();
  int64_t n = 0;
  for (const auto& block : sharded_blocks(*model)) {
    for (const auto& p : block->parameters()) n += p.numel();
  }
  return n;
}

class ShardedBlocks : public ::testing::TestWithParam<int> {};

TEST_P(ShardedBlocks, TrainAsDataParallelismAndKeepOnlyTheirShares) {
  const int world = GetParam();
  const auto base = train_blocks_on(world, BlocksRun{});
  const torch::Tensor start = flat_parameters(*blocks_model());
  ASSERT_GT((whole_parameters(base[0]) - start).abs().max().item<double>(), 1e-3)
      << "nothing trained";
  BlocksRun run;
  run.sharded = true;
  const auto sharded = train_blocks_on(world, run);
  const int64_t block_elements = block_parameter_elements();
  for (int r = 0; r < world; ++r) {
    const double worst =
        (whole_parameters(sharded[r]) - whole_parameters(base[0])).abs().max().item<double>();
    EXPECT_LT(worst, 2e-5) << "rank " << r << ": largest difference from stage 0";
    // Its shares: 1/N of the blocks' elements plus the padding (at most 16 elements per
    // parameter: 6 of them).
    const int64_t shares = tail_value(sharded[r], 3);
    EXPECT_GE(shares * world, block_elements) << "rank " << r;
    EXPECT_LE(shares, block_elements / world + 16 * 6) << "rank " << r;
    // Each step gathers the block for forward and again for backward, and reduce-scatters once.
    EXPECT_EQ(tail_value(sharded[r], 2), 2 * run.steps) << "rank " << r << ": all-gathers";
    EXPECT_EQ(tail_value(sharded[r], 1), run.steps) << "rank " << r << ": reduce-scatters";
  }
}

INSTANTIATE_TEST_SUITE_P(TwoAndFour, ShardedBlocks, ::testing::Values(2, 4));

// With sync off the blocks keep their whole gradients in .grad; the synchronising micro-step
// reduce-scatters their sum, as the reducer all-reduces it.
TEST(Sharded, GradientAccumulationTrainsAsDataParallelism) {
  BlocksRun run;
  run.accumulate = true;
  run.steps = 15;
  const auto base = train_blocks_on(2, run);
  run.sharded = true;
  const auto sharded = train_blocks_on(2, run);
  for (int r = 0; r < 2; ++r) {
    const double worst =
        (whole_parameters(sharded[r]) - whole_parameters(base[0])).abs().max().item<double>();
    EXPECT_LT(worst, 2e-5) << "rank " << r;
    EXPECT_EQ(tail_value(sharded[r], 1), run.steps) << "one reduce-scatter per optimizer step";
  }
}

// A block that records, at each moment, the bytes its weight's storage holds: in its forward,
// and in its backward (a hook on an activation inside it runs while backward is in the block).
struct StorageProbeImpl : torch::nn::Module {
  StorageProbeImpl() : fc(register_module("fc", torch::nn::Linear(64, 64))) {}
  torch::Tensor forward(torch::Tensor x) {
    seen.push_back(static_cast<double>(fc->weight.storage().nbytes()));
    auto inner = fc->forward(x);
    if (inner.requires_grad()) {
      inner.register_hook([this](const torch::Tensor&) {
        seen.push_back(static_cast<double>(fc->weight.storage().nbytes()));
      });
    }
    return torch::tanh(inner);
  }
  torch::nn::Linear fc;
  std::vector<double> seen;
};
TORCH_MODULE(StorageProbe);

// [after shard, in forward, after forward, in backward, after backward, after the step,
// inside GatheredParameters, after it], in bytes.
torch::Tensor observe_block_memory() {
  Communicator& comm = ProcessState::get().communicator();
  torch::manual_seed(7);
  StorageProbe probe;
  auto model = torch::nn::Sequential(Sharded(probe), torch::nn::Linear(64, 1));
  shard_model(*model, comm);
  GradientReducer reducer(replicated_parameters(*model), comm);
  torch::optim::SGD sgd(parameters_to_update(*model), torch::optim::SGDOptions(0.1));
  auto bytes = [&] { return static_cast<double>(probe->fc->weight.storage().nbytes()); };
  std::vector<double> seen{bytes()};
  auto loss = model->forward(torch::randn({4, 64})).pow(2).mean();
  seen.push_back(probe->seen.at(0));
  seen.push_back(bytes());
  loss.backward();
  seen.push_back(probe->seen.at(1));
  seen.push_back(bytes());
  sgd.step();
  sgd.zero_grad();
  seen.push_back(bytes());
  {
    GatheredParameters whole(*model);
    seen.push_back(bytes());
  }
  seen.push_back(bytes());
  return torch::tensor(seen, torch::kDouble);
}

TEST(Sharded, ABlocksParametersHoldMemoryOnlyWhileItsForwardAndBackwardRun) {
  const auto results = launch([](int) { return observe_block_memory(); },
                              LaunchOptions().processes_per_node(2).verbose(false));
  const double whole = 64 * 64 * 4;
  const std::vector<double> expected{0, whole, 0, whole, 0, 0, whole, 0};
  const char* moments[] = {
      "after shard",    "in forward",     "after forward",         "in backward",
      "after backward", "after the step", "in GatheredParameters", "after GatheredParameters"};
  for (size_t r = 0; r < results.size(); ++r) {
    ASSERT_EQ(results[r].numel(), static_cast<int64_t>(expected.size()));
    for (size_t k = 0; k < expected.size(); ++k) {
      EXPECT_EQ(results[r][k].item<double>(), expected[k])
          << "rank " << r << ", " << moments[k] << ": bytes held by the block's weight";
    }
  }
}

// Each misuse, on 2 processes: 1 when the error names the cause and the fix.
torch::Tensor refusals() {
  Communicator& comm = ProcessState::get().communicator();
  auto refused = [](const std::function<void()>& f, const std::string& cause) {
    const std::string message = error_message(f);
    return contains(message, cause) && contains(message, "Fix:") ? 1.0 : 0.0;
  };
  std::vector<double> out;
  auto bf16 = Sharded(torch::nn::Linear(8, 8));
  bf16->to(torch::kBFloat16);
  out.push_back(refused([&] { bf16->shard(comm); }, "not a dense fp32 tensor"));
  auto twice = Sharded(torch::nn::Linear(8, 8));
  twice->shard(comm);
  out.push_back(refused([&] { twice->shard(comm); }, "sharded already"));
  auto nested =
      torch::nn::Sequential(Sharded(torch::nn::Sequential(Sharded(torch::nn::Linear(8, 8)))));
  out.push_back(refused([&] { shard_model(*nested, comm); }, "holds another Sharded block"));
  auto unpaired = Sharded(torch::nn::Linear(8, 8));
  unpaired->shard(comm);
  out.push_back(refused([&] { unpaired->release(); }, "without a matching gather"));
  // A block whose forward leaves a trainable parameter unused: named after backward.
  struct HalfUsedImpl : torch::nn::Module {
    HalfUsedImpl()
        : used(register_module("used", torch::nn::Linear(8, 8))),
          unused(register_module("unused", torch::nn::Linear(8, 8))) {}
    torch::Tensor forward(torch::Tensor x) { return used->forward(x); }
    torch::nn::Linear used, unused;
  };
  auto half = Sharded(std::make_shared<HalfUsedImpl>());
  half->shard(comm);
  out.push_back(refused(
      [&] {
        half->forward(torch::randn({2, 8})).sum().backward();
      },
      "unused.weight"));
  // A module changed after shard: a parameter given other memory, a parameter added.
  auto moved = Sharded(torch::nn::Linear(8, 8));
  moved->shard(comm);
  moved->block()->named_parameters()["weight"].set_data(torch::zeros({8, 8}));
  out.push_back(refused([&] { moved->forward(torch::randn({2, 8})); }, "was given other memory"));
  auto grown = Sharded(torch::nn::Linear(8, 8));
  grown->shard(comm);
  grown->block()->register_parameter("extra", torch::zeros({2}));
  out.push_back(refused(
      [&] {
        grown->forward(torch::randn({2, 8}));
      },
      "it has 3 parameters, 2 when sharded"));
  return torch::tensor(out, torch::kDouble);
}

TEST(Sharded, MisuseIsRefusedWithTheFix) {
  const auto results =
      launch([](int) { return refusals(); }, LaunchOptions().processes_per_node(2).verbose(false));
  const char* cases[] = {"a bf16 block",        "sharding twice",      "a nested block",
                         "an unpaired release", "an unused parameter", "a parameter moved",
                         "a parameter added"};
  for (size_t r = 0; r < results.size(); ++r) {
    ASSERT_EQ(results[r].numel(), 7);
    for (int64_t k = 0; k < results[r].numel(); ++k) {
      EXPECT_EQ(results[r][k].item<double>(), 1.0) << "rank " << r << ": " << cases[k];
    }
  }
}

namespace {

// A replicated layer, three sharded blocks and a head, each block wrapped as it is built.
torch::nn::Sequential started_model() {
  torch::manual_seed(11);
  torch::nn::Sequential model;
  model->push_back(torch::nn::Linear(16, 37));
  for (int b = 0; b < 3; ++b) model->push_back(Sharded(torch::nn::Linear(37, 37)));
  model->push_back(torch::nn::Linear(37, 5));
  return model;
}

// 1 per check that holds: after each block is built inside a ShardedStart, that block and every
// one built before it are sharded and hold no memory for their parameters (so the model is
// never whole); gathered, the model equals the one built whole from the same seed; and a process
// seeded otherwise is refused, on every process, with the fix.
torch::Tensor sharded_start_checks(int rank) {
  auto& comm = ProcessState::get().communicator();
  std::vector<double> out;
  const auto whole = started_model();
  torch::nn::Sequential model;
  {
    ShardedStart start(comm);
    torch::manual_seed(11);
    model->push_back(torch::nn::Linear(16, 37));
    for (int b = 0; b < 3; ++b) {
      model->push_back(Sharded(torch::nn::Linear(37, 37)));
      bool none_whole = true;
      for (const auto& block : sharded_blocks(*model)) {
        none_whole = none_whole && block->sharded() && !block->gathered() &&
                     block->block()->parameters()[0].storage().nbytes() == 0;
      }
      out.push_back(none_whole ? 1.0 : 0.0);
    }
    model->push_back(torch::nn::Linear(37, 5));
  }
  {
    GatheredParameters gathered(*model);
    out.push_back(torch::equal(flat_parameters(*model), flat_parameters(*whole)) ? 1.0 : 0.0);
  }
  const std::string message = error_message([&] {
    ShardedStart start(comm);
    torch::manual_seed(100 + rank);  // a seed of each process's own
    Sharded(torch::nn::Linear(37, 37));
  });
  out.push_back(contains(message, "sharded start: block 1") &&
                        contains(message, "than on rank 0") && contains(message, "Fix:")
                    ? 1.0
                    : 0.0);
  // Outside the scope, blocks are built whole again.
  out.push_back(Sharded(torch::nn::Linear(4, 4))->sharded() ? 0.0 : 1.0);
  return torch::tensor(out, torch::kDouble);
}

}  // namespace

TEST(Sharded, AShardedStartBuildsTheUnshardedValuesAndIsNeverWhole) {
  for (int world : {2, 4}) {
    const auto results = launch([](int rank) { return sharded_start_checks(rank); },
                                LaunchOptions().processes_per_node(world).verbose(false));
    const char* checks[] = {"block 1 built", "block 2 built",       "block 3 built",
                            "same values",   "other seeds refused", "whole after the scope"};
    for (size_t r = 0; r < results.size(); ++r) {
      ASSERT_EQ(results[r].numel(), 6);
      for (int64_t k = 0; k < 6; ++k) {
        EXPECT_EQ(results[r][k].item<double>(), 1.0)
            << world << " processes, rank " << r << ": " << checks[k];
      }
    }
  }
}

namespace {

// What a child process forked here writes on stderr and how it ends, running `touch`.
std::pair<std::string, int> in_a_child(const std::function<void()>& touch) {
  int pipe_fds[2];
  if (::pipe(pipe_fds) != 0) return {"pipe failed", 0};
  const pid_t child = ::fork();
  if (child == 0) {
    ::dup2(pipe_fds[1], STDERR_FILENO);
    ::close(pipe_fds[0]);
    const struct rlimit no_core {};
    ::setrlimit(RLIMIT_CORE, &no_core);  // the fault is expected: no core file
    touch();
    ::_exit(0);  // it did not fault: the test fails on the status
  }
  ::close(pipe_fds[1]);
  std::string text;
  char buffer[4096];
  for (ssize_t n; (n = ::read(pipe_fds[0], buffer, sizeof buffer)) > 0;) text.append(buffer, n);
  ::close(pipe_fds[0]);
  int status = 0;
  ::waitpid(child, &status, 0);
  return {text, status};
}

// After a step, a sharded block's parameter holds no memory; reading it (as printing or saving
// it between steps would) ends the process with SIGSEGV and a message that names the parameter
// and the fix, where a null pointer would have ended it without a word. Inside
// GatheredParameters it reads its values. 1 per check that holds.
torch::Tensor freed_parameter_reads() {
  auto& comm = ProcessState::get().communicator();
  auto model = blocks_model();
  shard_model(*model, comm);
  model->forward(torch::randn({2, 16})).sum().backward();
  const torch::Tensor weight = sharded_blocks(*model)[0]->block()->parameters()[0];
  const auto [text, status] =
      in_a_child([&] { std::fprintf(stderr, "%f", weight.sum().item<float>()); });
  std::vector<double> out;
  out.push_back(WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV ? 1.0 : 0.0);
  out.push_back(contains(text, "parameter '0.weight' of a ZeRO stage 3 sharded block") &&
                        contains(text, "rank " + std::to_string(comm.rank()) + " of 2") &&
                        contains(text, "Fix: do it inside accelerant::GatheredParameters")
                    ? 1.0
                    : 0.0);
  {
    GatheredParameters whole(*model);
    out.push_back(std::isfinite(weight.sum().item<float>()) ? 1.0 : 0.0);
  }
  if (out[1] == 0.0) std::fprintf(stderr, "the child wrote: %s\n", text.c_str());
  return torch::tensor(out, torch::kDouble);
}

}  // namespace

TEST(Sharded, ReadingAFreedParameterBetweenStepsNamesItAndTheFix) {
  const auto results = launch([](int) { return freed_parameter_reads(); },
                              LaunchOptions().processes_per_node(2).verbose(false));
  const char* checks[] = {"the child died of SIGSEGV", "its message", "gathered, it reads"};
  for (size_t r = 0; r < results.size(); ++r) {
    ASSERT_EQ(results[r].numel(), 3);
    for (int64_t k = 0; k < 3; ++k)
      EXPECT_EQ(results[r][k].item<double>(), 1.0) << "rank " << r << ": " << checks[k];
  }
}

namespace {

// `steps` AdamW steps of `model` (its blocks sharded or not) on 2 processes, each on its half of
// sharded_batch, a GradientReducer averaging the replicated parameters; `after_backward(step, x)`
// runs between each backward and its optimizer step.
void train_on_halves(torch::nn::Sequential& model, int rank, int steps,
                     const std::function<void(int, const torch::Tensor&)>& after_backward = {}) {
  GradientReducer reducer(replicated_parameters(*model), ProcessState::get().communicator());
  torch::optim::AdamW adamw(parameters_to_update(*model), torch::optim::AdamWOptions(1e-2));
  const int per_rank = kShardedGlobalBatch / 2;
  for (int step = 0; step < steps; ++step) {
    auto [x, y] = sharded_batch(step);
    x = x.narrow(0, rank * per_rank, per_rank), y = y.narrow(0, rank * per_rank, per_rank);
    (model->forward(x) - y).pow(2).mean().backward();
    if (after_backward) after_backward(step, x);
    adamw.step();
    adamw.zero_grad();
  }
}

// Three AdamW steps of blocks_model with each block's prefetch on or off; after the second
// step's backward and before its optimizer step, an evaluation runs the first sharded block
// alone, which prefetches the second with the values of before the step. Returns the whole
// parameters, then the second block's prefetches and the bytes both blocks hold at the end.
torch::Tensor train_with_prefetch(int rank, bool prefetch) {
  Communicator& comm = ProcessState::get().communicator();
  auto model = blocks_model();
  const auto blocks = shard_model(*model, comm);
  for (const auto& block : blocks) block->set_prefetch(prefetch);
  train_on_halves(model, rank, 3, [&](int step, const torch::Tensor& x) {
    if (step != 1) return;
    torch::NoGradGuard evaluation;
    auto first = model[0]->as<torch::nn::Linear>()->forward(x);
    model[2]->as<ShardedImpl>()->forward(torch::tanh(first));
  });
  double held = 0;
  for (const auto& block : blocks) {
    for (const auto& p : block->block()->parameters()) held += p.storage().nbytes();
  }
  const auto prefetches = static_cast<float>(blocks[1]->stats().prefetches);
  GatheredParameters whole(*model);
  return torch::cat(
      {flat_parameters(*model), torch::tensor({prefetches, static_cast<float>(held)})});
}

}  // namespace

// With prefetch on, the second block's gather starts while the first runs forward (and the
// first's while the second runs backward), and the training is the same, bit for bit, as
// without: a prefetch left behind by an evaluation before the optimizer step is dropped, never
// served after it, and nothing stays gathered after a step.
TEST(Sharded, PrefetchStartsTheNextGatherAheadAndNeverServesAStaleOne) {
  auto options = LaunchOptions().processes_per_node(2).verbose(false);
  const auto with = launch([](int rank) { return train_with_prefetch(rank, true); }, options);
  const auto without = launch([](int rank) { return train_with_prefetch(rank, false); }, options);
  for (size_t r = 0; r < with.size(); ++r) {
    const int64_t n = with[r].numel() - 2;
    EXPECT_TRUE(torch::equal(with[r].narrow(0, 0, n), without[r].narrow(0, 0, n)))
        << "rank " << r << ": prefetching changed the training by up to "
        << (with[r].narrow(0, 0, n) - without[r].narrow(0, 0, n)).abs().max().item<double>();
    EXPECT_GE(with[r][n].item<float>(), 2) << "rank " << r << ": prefetches of the second block";
    EXPECT_EQ(without[r][n].item<float>(), 0) << "rank " << r;
    EXPECT_EQ(with[r][n + 1].item<float>(), 0) << "rank " << r << ": bytes held after the steps";
  }
}

namespace {

// Activation checkpointing and sharded blocks, both ways round: a checkpointed block inside a
// Sharded one (its recomputation reads the parameters the block gathered for backward), or
// Sharded blocks inside a checkpointed one (the recomputation runs their forward again, inside
// backward, which gathers them again).
torch::nn::Sequential checkpointed_model(bool checkpoint_inside) {
  torch::manual_seed(7);
  torch::nn::Linear first(16, 37);
  if (checkpoint_inside) {
    return torch::nn::Sequential(
        first, torch::nn::Tanh(),
        Sharded(Checkpointed(torch::nn::Sequential(torch::nn::Linear(37, 64), torch::nn::Tanh(),
                                                   torch::nn::Linear(64, 37)))),
        torch::nn::Linear(37, 5));
  }
  return torch::nn::Sequential(
      first, torch::nn::Tanh(),
      Checkpointed(torch::nn::Sequential(Sharded(torch::nn::Linear(37, 64)), torch::nn::Tanh(),
                                         Sharded(torch::nn::Linear(64, 37)))),
      torch::nn::Linear(37, 5));
}

torch::Tensor train_checkpointed(int rank, bool checkpoint_inside, bool sharded) {
  Communicator& comm = ProcessState::get().communicator();
  auto model = checkpointed_model(checkpoint_inside);
  if (sharded) shard_model(*model, comm);
  train_on_halves(model, rank, 5);
  GatheredParameters whole(*model);
  return flat_parameters(*model);
}

}  // namespace

// Sharded blocks under activation checkpointing, either way round, train as the same model
// unsharded does on 2 processes.
TEST(Sharded, ActivationCheckpointingInsideOrAroundABlockTrainsAsUnsharded) {
  auto options = LaunchOptions().processes_per_node(2).verbose(false);
  for (bool inside : {true, false}) {
    const auto plain =
        launch([inside](int rank) { return train_checkpointed(rank, inside, false); }, options);
    const auto sharded =
        launch([inside](int rank) { return train_checkpointed(rank, inside, true); }, options);
    for (size_t r = 0; r < 2; ++r) {
      const double worst = (sharded[r] - plain[0]).abs().max().item<double>();
      EXPECT_LT(worst, 2e-5) << (inside ? "checkpoint inside the block"
                                        : "blocks inside the checkpoint")
                             << ", rank " << r;
    }
  }
}

// The automatic wrap by rule: a Sequential's entries of at least 1000 parameter elements become
// Sharded blocks, in place and under the same names, and the model computes what it did; an
// entry wrapped already is refused.
TEST(Sharded, WrapBlocksWrapsTheEntriesARuleSelectsAndKeepsTheNames) {
  torch::manual_seed(3);
  torch::nn::Sequential plain(torch::nn::Linear(16, 37), torch::nn::Tanh(),
                              torch::nn::Linear(37, 101), torch::nn::Tanh(),
                              torch::nn::Linear(101, 37), torch::nn::Linear(37, 5));
  auto wrapped = wrap_blocks(plain, blocks_with_at_least(1000));
  EXPECT_EQ(sharded_blocks(*wrapped).size(), 2u);  // Linear(37, 101) and Linear(101, 37)
  std::vector<std::string> before, after;
  for (const auto& p : plain->named_parameters()) before.push_back(p.key());
  for (const auto& p : wrapped->named_parameters()) after.push_back(p.key());
  EXPECT_EQ(after, before);
  const auto x = torch::randn({3, 16});
  EXPECT_TRUE(torch::equal(wrapped->forward(x), plain->forward(x)));
  const std::string refused =
      error_message([&] { wrap_blocks(wrapped, blocks_with_at_least(1000)); });
  EXPECT_TRUE(contains(refused, "entry '2' is a Sharded block already") &&
              contains(refused, "Fix:"))
      << refused;
}

// One process: the wrapper runs its block unchanged, and nothing is sharded.
TEST(Sharded, OnOneProcessItIsThePlainBlock) {
  torch::manual_seed(1);
  torch::nn::Linear inner(8, 3);
  auto block = Sharded(inner);
  const auto x = torch::randn({2, 8});
  EXPECT_TRUE(torch::equal(block->forward(x), inner->forward(x)));
  EXPECT_FALSE(block->sharded());
  EXPECT_TRUE(block->gathered());
}

// The wrapper adds no name: a model's parameters are named as without it, so weights saved from
// one load into the other.
TEST(Sharded, AWrappedModelKeepsItsParameterNames) {
  // ModuleList: a Sequential cannot hold another Sequential directly.
  torch::nn::ModuleList plain, wrapped;
  plain->push_back(torch::nn::Linear(4, 8));
  plain->push_back(torch::nn::Sequential(torch::nn::Linear(8, 8), torch::nn::Tanh()));
  wrapped->push_back(Sharded(torch::nn::Linear(4, 8)));
  wrapped->push_back(Sharded(torch::nn::Sequential(torch::nn::Linear(8, 8), torch::nn::Tanh())));
  EXPECT_EQ(wrapped->named_parameters().keys(), plain->named_parameters().keys());
  EXPECT_EQ(plain->named_parameters().keys(),
            (std::vector<std::string>{"0.weight", "0.bias", "1.0.weight", "1.0.bias"}));
  // They are the block's own tensors.
  auto inner = torch::nn::Linear(4, 8);
  auto block = Sharded(inner);
  EXPECT_TRUE(block->named_parameters()["weight"].is_same(inner->weight));
}

}  // namespace

namespace {

// A fused AdamW state (note "Fused state form") over parameters of `sizes`, its values counting
// up from `first`, each parameter having stepped `steps` times.
std::string fused_state_bytes(const std::vector<int64_t>& sizes, float first, double steps) {
  int64_t total = 0;
  for (int64_t n : sizes) total += n;
  torch::serialize::OutputArchive a;
  a.write(accelerant::detail::kFusedKindKey,
          torch::tensor(static_cast<int64_t>(accelerant::detail::FusedKind::kAdamW)));
  a.write(accelerant::detail::kFusedNumelsKey, torch::tensor(sizes));
  a.write(accelerant::detail::kFusedStepsKey,
          torch::full({static_cast<int64_t>(sizes.size())}, steps, torch::kDouble));
  a.write(accelerant::detail::kFusedState1Key, torch::arange(first, first + total, torch::kFloat));
  a.write(accelerant::detail::kFusedState2Key,
          torch::arange(first, first + total, torch::kFloat) * 2);
  std::ostringstream out;
  a.save_to(out);
  return out.str();
}

torch::serialize::InputArchive archive_of(const std::string& bytes) {
  torch::serialize::InputArchive a;
  a.load_from(bytes.data(), bytes.size());
  return a;
}

std::string bytes_of(const std::function<void(torch::serialize::OutputArchive&)>& fill) {
  torch::serialize::OutputArchive a;
  fill(a);
  std::ostringstream out;
  a.save_to(out);
  return out.str();
}

torch::Tensor state1_of(const std::string& bytes) {
  torch::Tensor t;
  archive_of(bytes).read(accelerant::detail::kFusedState1Key, t);
  return t;
}

// The slots of a parameter of 37 elements sharded among `world` processes (shares of 16-element
// multiples, as the blocks cut them) and a replicated one of 5.
std::vector<accelerant::detail::ShareSlot> slots_for(int world) {
  const int64_t per = (37 + world - 1) / world;
  return {{37, std::max<int64_t>(16, (per + 15) / 16 * 16)}, {5, 0}};
}

}  // namespace

// The whole state cut for 3 processes and merged again is the whole state; cut for 2 from the
// merge, each process holds the elements of its piece (zeros in the padding), and the replicated
// parameter whole. Files that do not fit each other are refused.
TEST(ShareState, CutAndMergeAreInverseOnAnyNumberOfProcesses) {
  const std::string whole = fused_state_bytes({37, 5}, 1, 4);
  std::vector<std::string> three;
  for (int r = 0; r < 3; ++r) {
    auto a = archive_of(whole);
    three.push_back(
        bytes_of([&](auto& out) { accelerant::detail::cut_share_state(a, slots_for(3), r, out); }));
  }
  std::vector<torch::serialize::InputArchive> archives;
  for (const auto& b : three) archives.push_back(archive_of(b));
  std::vector<torch::serialize::InputArchive*> pointers;
  for (auto& a : archives) pointers.push_back(&a);
  const std::string merged = bytes_of(
      [&](auto& out) { accelerant::detail::merge_share_states(pointers, slots_for(3), out); });
  EXPECT_TRUE(torch::equal(state1_of(merged), state1_of(whole)));

  auto again = archive_of(merged);
  const std::string rank1 = bytes_of(
      [&](auto& out) { accelerant::detail::cut_share_state(again, slots_for(2), 1, out); });
  // Slots of 32 elements on 2 processes: rank 1 holds elements 32..36 of the first parameter
  // (values 33..37), 27 zeros, then the replicated parameter (values 38..42).
  torch::Tensor expected = torch::zeros({32 + 5});
  expected.narrow(0, 0, 5).copy_(torch::arange(33, 38, torch::kFloat));
  expected.narrow(0, 32, 5).copy_(torch::arange(38, 43, torch::kFloat));
  EXPECT_TRUE(torch::equal(state1_of(rank1), expected)) << state1_of(rank1);

  // A rank missing, a rank of another save, and a whole state of other sizes.
  std::vector<torch::serialize::InputArchive*> two(pointers.begin(), pointers.begin() + 2);
  EXPECT_TRUE(contains(error_message([&] {
                         torch::serialize::OutputArchive out;
                         accelerant::detail::merge_share_states(two, slots_for(3), out);
                       }),
                       "a rank's state is missing"));
  auto later = archive_of(bytes_of([&](auto& out) {
    auto a = archive_of(fused_state_bytes({37, 5}, 1, 5));
    accelerant::detail::cut_share_state(a, slots_for(3), 2, out);
  }));
  pointers[2] = &later;
  EXPECT_TRUE(contains(error_message([&] {
                         torch::serialize::OutputArchive out;
                         accelerant::detail::merge_share_states(pointers, slots_for(3), out);
                       }),
                       "come from different saves"));
  auto other = archive_of(fused_state_bytes({36, 5}, 1, 4));
  EXPECT_TRUE(contains(error_message([&] {
                         torch::serialize::OutputArchive out;
                         accelerant::detail::cut_share_state(other, slots_for(2), 0, out);
                       }),
                       "sizes [36, 5]"));
}
