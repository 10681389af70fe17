// Activation checkpointing: gradients equal those without it (plain, with dropout, under bf16
// autocast, and through the Accelerator on two ranks), the caller's random stream is left where it
// would be, a block that could never get gradients is refused, and the memory held between
// forward and backward shrinks.
#include <accelerant/accelerant.h>
#include <accelerant/activation_checkpoint.h>
#include <gtest/gtest.h>
#include <malloc.h>

#include <chrono>
#include <cstdio>

#include "test_support.h"

using namespace accelerant;

namespace {

torch::nn::Sequential mlp_block(double dropout) {
  return torch::nn::Sequential(torch::nn::Linear(8, 16), torch::nn::GELU(),
                               torch::nn::Dropout(dropout), torch::nn::Linear(16, 8));
}

// Gradients of the input and of every parameter after one backward of sum(block(x)^2).
// With `bf16`, the forward runs under CPU autocast and backward after it, as in training.
std::vector<torch::Tensor> gradients(torch::nn::Sequential block, bool checkpointed,
                                     torch::Tensor x, bool bf16 = false) {
  block->zero_grad();
  x = x.detach().requires_grad_(true);
  torch::Tensor loss;
  {
    AutocastGuard autocast(torch::kCPU, torch::kBFloat16, bf16);
    auto y =
        checkpointed
            ? checkpoint(
                  [&](const std::vector<torch::Tensor>& in) { return block->forward(in[0]); }, {x})
            : block->forward(x);
    loss = y.to(torch::kFloat).pow(2).sum();
  }
  loss.backward();
  std::vector<torch::Tensor> grads{x.grad()};
  for (auto& p : block->parameters()) grads.push_back(p.grad().clone());
  return grads;
}

void expect_equal(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_TRUE(a[i].defined() && b[i].defined()) << "gradient " << i << " missing";
    EXPECT_TRUE(torch::equal(a[i], b[i])) << "gradient " << i << " differs";
  }
}

}  // namespace

TEST(ActivationCheckpoint, GradientsEqualThoseWithoutIt) {
  torch::manual_seed(1);
  auto block = mlp_block(0.0);
  auto x = torch::randn({4, 8});
  expect_equal(gradients(block, true, x), gradients(block, false, x));
}

TEST(ActivationCheckpoint, DropoutDrawsTheSameMasksAndTheCallersStreamGoesOn) {
  torch::manual_seed(2);
  auto block = mlp_block(0.5);
  auto x = torch::randn({64, 8});
  torch::manual_seed(3);
  auto plain = gradients(block, false, x);
  auto next_plain = torch::rand({4});
  torch::manual_seed(3);
  auto checkpointed = gradients(block, true, x);
  auto next_checkpointed = torch::rand({4});
  expect_equal(checkpointed, plain);
  EXPECT_TRUE(torch::equal(next_checkpointed, next_plain))
      << "the random stream after backward is not where it would be without checkpointing";
}

TEST(ActivationCheckpoint, Bf16AutocastEqualsTheAutocastRunWithoutIt) {
  torch::manual_seed(4);
  auto block = mlp_block(0.0);
  auto x = torch::randn({4, 8});
  auto plain = gradients(block, false, x, true);
  auto checkpointed = gradients(block, true, x, true);
  expect_equal(checkpointed, plain);
  // The block did run in bf16: its gradients differ from the fp32 ones.
  EXPECT_FALSE(torch::equal(gradients(block, false, x)[1], plain[1]));
}

TEST(ActivationCheckpoint, RefusesWhenNoInputRequiresGrad) {
  auto block = mlp_block(0.0);
  try {
    checkpoint([&](const std::vector<torch::Tensor>& in) { return block->forward(in[0]); },
               {torch::randn({2, 8})});
    FAIL() << "expected accelerant::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("requires grad"), std::string::npos) << e.what();
  }
}

TEST(ActivationCheckpoint, CheckpointedModuleTrainsItsParametersFromDataInput) {
  torch::manual_seed(5);
  auto block = mlp_block(0.0);
  Checkpointed wrapped(block);
  auto x = torch::randn({4, 8});  // no gradient needed: the first block of a model
  block->zero_grad();
  wrapped->forward(x).pow(2).sum().backward();
  std::vector<torch::Tensor> with;
  for (auto& p : block->parameters()) with.push_back(p.grad().clone());
  block->zero_grad();
  block->forward(x).pow(2).sum().backward();
  std::vector<torch::Tensor> without;
  for (auto& p : block->parameters()) without.push_back(p.grad().clone());
  expect_equal(with, without);
  EXPECT_EQ(wrapped->parameters().size(), block->parameters().size());
}

namespace {

// Two blocks and no parameter outside them, so that every gradient the reducer sees arrives
// during a recomputation (Sequential cannot hold a Sequential, hence a module of its own).
struct TwoBlocksImpl : torch::nn::Module {
  explicit TwoBlocksImpl(bool checkpointed) {
    torch::nn::Sequential first(torch::nn::Linear(16, 32), torch::nn::Tanh());
    torch::nn::Sequential second(torch::nn::Linear(32, 32), torch::nn::Tanh(),
                                 torch::nn::Linear(32, 4));
    if (checkpointed) {
      auto a = register_module("first", Checkpointed(first));
      auto b = register_module("second", Checkpointed(second));
      run = [a, b](torch::Tensor x) { return b->forward(a->forward(x)); };
    } else {
      register_module("first", first);
      register_module("second", second);
      run = [first, second](torch::Tensor x) mutable { return second->forward(first->forward(x)); };
    }
  }
  torch::Tensor forward(torch::Tensor x) { return run(x); }
  std::function<torch::Tensor(torch::Tensor)> run;
};
TORCH_MODULE(TwoBlocks);

// Trains through the Accelerator for 5 steps; returns the parameters, flattened.
torch::Tensor train_on_ranks(bool checkpointed) {
  Accelerator acc;
  torch::manual_seed(11);
  TwoBlocks model(checkpointed);
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  torch::manual_seed(7);
  auto x = torch::randn({128, 16});
  auto y = torch::randint(0, 4, {128}, torch::kLong);
  auto [m, o, l] =
      acc.prepare(model, sgd, make_data_loader(x, y, DataLoaderOptions().batch_size(8)));
  int steps = 0;
  for (auto& b : l) {
    if (steps++ == 5) break;
    acc.backward(torch::nn::functional::cross_entropy(m->forward(b.data), b.target));
    o.step();
    o.zero_grad();
  }
  return accelerant::testing::flat_parameters(*m);
}

}  // namespace

TEST(ActivationCheckpoint, DataParallelTrainingEqualsTheRunWithoutIt) {
  auto options = LaunchOptions()
                     .processes_per_node(2)
                     .collective_timeout(std::chrono::seconds(60))
                     .verbose(false);
  auto plain = launch([](int) { return train_on_ranks(false); }, options);
  auto checkpointed = launch([](int) { return train_on_ranks(true); }, options);
  ASSERT_EQ(checkpointed.size(), 2u);
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(torch::allclose(checkpointed[r], plain[r], 0, 1e-6)) << "rank " << r;
  }
  auto one = launch([](int) { return train_on_ranks(false); }, options.processes_per_node(1));
  EXPECT_FALSE(torch::equal(plain[0], one.at(0)))
      << "two ranks trained like one: the comparison would not see a missing all-reduce";
}

namespace {

// Bytes the C heap holds (small allocations plus mmapped large ones): tensors are malloc'd.
int64_t heap_bytes() {
  auto info = mallinfo2();
  return static_cast<int64_t>(info.uordblks + info.hblkhd);
}

struct Measured {
  int64_t held_bytes;  // kept alive between forward and backward
  double seconds;      // forward + backward
};

Measured measure(std::vector<torch::nn::Sequential>& blocks, bool checkpointed,
                 const torch::Tensor& x) {
  for (auto& block : blocks) block->zero_grad();
  const auto start = std::chrono::steady_clock::now();
  const int64_t before = heap_bytes();
  auto h = x.detach().requires_grad_(true);
  for (auto& block : blocks) {
    if (checkpointed) {
      h = checkpoint([&](const std::vector<torch::Tensor>& in) { return block->forward(in[0]); },
                     {h});
    } else {
      h = block->forward(h);
    }
  }
  auto loss = h.sum();
  const int64_t held = heap_bytes() - before;
  loss.backward();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return {held, seconds};
}

}  // namespace

TEST(ActivationCheckpoint, KeepsMuchLessMemoryForBackward) {
  constexpr int kBlocks = 4, kLayers = 3;
  constexpr int64_t kBatch = 2048, kWidth = 512;
  torch::manual_seed(6);
  std::vector<torch::nn::Sequential> blocks;
  for (int i = 0; i < kBlocks; ++i) {
    torch::nn::Sequential block;
    for (int j = 0; j < kLayers; ++j) {
      block->push_back(torch::nn::Linear(kWidth, kWidth));
      block->push_back(torch::nn::GELU());
    }
    blocks.push_back(block);
  }
  auto x = torch::randn({kBatch, kWidth});
  measure(blocks, false, x);  // warm up: the gradients' buffers exist in both measured runs
  auto plain = measure(blocks, false, x);
  auto checkpointed = measure(blocks, true, x);
  std::printf(
      "%d blocks of %d x (Linear(%ld)+GELU), batch %ld: held for backward %.1f MiB plain, "
      "%.1f MiB checkpointed; forward+backward %.3f s plain, %.3f s checkpointed\n",
      kBlocks, kLayers, static_cast<long>(kWidth), static_cast<long>(kBatch),
      plain.held_bytes / 1048576.0, checkpointed.held_bytes / 1048576.0, plain.seconds,
      checkpointed.seconds);
  // Plain keeps two activations of 4 MiB per layer (each Linear's input, each GELU's input);
  // checkpointed keeps one per block (its input; the last output too).
  EXPECT_LT(checkpointed.held_bytes * 3, plain.held_bytes);
}
