// Activation checkpointing's memory and time (issue 23): a transformer-like stack of pre-norm
// feed-forward blocks, h = h + Linear(4d, d)(GELU(Linear(d, 4d)(LayerNorm(h)))), forward +
// backward plain and with every block wrapped in Checkpointed, alternating in rounds (the side
// that goes first alternates). Measured per pass: the memory held for backward (the C heap's
// growth by glibc mallinfo2, which counts LibTorch's CPU tensors, from before the forward to
// just before backward: what autograd keeps alive) and the time of forward + backward.
//   bench_activation_checkpoint [--blocks 6] [--width 512] [--tokens 512] [--rounds 7]
//                               [--steps 2] [--threads 1]
#include <accelerant/accelerant.h>
#include <malloc.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int64_t heap_bytes() {
  const auto info = mallinfo2();
  return static_cast<int64_t>(info.uordblks + info.hblkhd);
}

torch::nn::Sequential make_block(int64_t width) {
  namespace nn = torch::nn;
  return nn::Sequential(nn::LayerNorm(nn::LayerNormOptions({width})), nn::Linear(width, 4 * width),
                        nn::GELU(), nn::Linear(4 * width, width));
}

struct Stack {
  std::vector<torch::nn::Sequential> plain;
  std::vector<accelerant::Checkpointed> checkpointed;  // the same blocks, wrapped
};

struct Pass {
  int64_t held_bytes;
  double seconds;
};

Pass run_pass(Stack& stack, bool checkpointed, const torch::Tensor& x) {
  for (auto& block : stack.plain) block->zero_grad();
  const auto t0 = Clock::now();
  const int64_t before = heap_bytes();
  auto h = x;
  for (size_t i = 0; i < stack.plain.size(); ++i) {
    h = h + (checkpointed ? stack.checkpointed[i]->forward(h) : stack.plain[i]->forward(h));
  }
  auto loss = h.pow(2).mean();
  const int64_t held = heap_bytes() - before;
  loss.backward();
  return {held, std::chrono::duration<double>(Clock::now() - t0).count()};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("Activation checkpointing: memory held for backward and step time");
  int blocks = 6, rounds = 7, steps = 2, threads = 1;
  int64_t width = 512, tokens = 512;
  app.add_option("--blocks", blocks, "feed-forward blocks")->check(CLI::PositiveNumber);
  app.add_option("--width", width, "model width d (hidden 4d)")->check(CLI::PositiveNumber);
  app.add_option("--tokens", tokens, "rows per batch")->check(CLI::PositiveNumber);
  app.add_option("--rounds", rounds, "alternating rounds")->check(CLI::PositiveNumber);
  app.add_option("--steps", steps, "passes per side per round")->check(CLI::PositiveNumber);
  app.add_option("--threads", threads, "intra-op threads")->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  torch::set_num_threads(threads);

  torch::manual_seed(0);
  Stack stack;
  for (int i = 0; i < blocks; ++i) {
    stack.plain.push_back(make_block(width));
    stack.checkpointed.emplace_back(stack.plain.back());
  }
  // The input needs no gradient: the blocks' parameters do, as in training.
  const auto x = torch::randn({tokens, width});
  run_pass(stack, false, x), run_pass(stack, true, x);  // warm up: gradient buffers exist

  std::vector<double> held[2], seconds[2];
  for (int r = 0; r < rounds; ++r) {
    for (int k = 0; k < 2; ++k) {
      const bool ckpt = (k + r) % 2 == 1;
      for (int s = 0; s < steps; ++s) {
        const Pass p = run_pass(stack, ckpt, x);
        held[ckpt].push_back(static_cast<double>(p.held_bytes));
        seconds[ckpt].push_back(p.seconds);
      }
    }
  }
  const double held_plain = median(held[0]) / 1048576.0, held_ckpt = median(held[1]) / 1048576.0;
  const double t_plain = median(seconds[0]) * 1e3, t_ckpt = median(seconds[1]) * 1e3;
  int64_t params = 0;
  for (auto& block : stack.plain) {
    for (const auto& p : block->parameters()) params += p.numel();
  }
  std::printf(
      "Model: %d pre-norm blocks h + Linear(%ld, %ld)(GELU(Linear(%ld, %ld)(LayerNorm(h)))), %.1f "
      "M parameters; %ld tokens; %d thread(s); medians of %d rounds x %d passes per side.\n\n",
      blocks, static_cast<long>(4 * width), static_cast<long>(width), static_cast<long>(width),
      static_cast<long>(4 * width), params / 1e6, static_cast<long>(tokens), threads, rounds,
      steps);
  std::printf(
      "| blocks | held for backward (MiB) | forward+backward (ms) | held / plain | time / plain "
      "|\n");
  std::printf("|---|---:|---:|---:|---:|\n");
  std::printf("| plain | %.1f | %.0f | 1.00 | 1.00 |\n", held_plain, t_plain);
  std::printf("| Checkpointed | %.1f | %.0f | %.3f | %.2f |\n", held_ckpt, t_ckpt,
              held_ckpt / held_plain, t_ckpt / t_plain);
  return 0;
}
