// Optimizer step time: accelerant::FusedAdamW (its CPU loop) against torch::optim::AdamW on a
// model of many parameter tensors, at 1 and 2 threads.
// Every optimizer steps the same model with the same gradients, alternating in rounds so that
// all see the same machine. Also printed: the bytes AdamW must move per step (read p, g, m, v;
// write p, m, v = 28 bytes per parameter) over the fused step's time, against a memcpy of the
// same bytes by one thread (one stream each way: a reference point, not a bound).
//   bench_optimizer_step [--blocks 40] [--width 256] [--rounds 5] [--markdown]
#include <accelerant/accelerant.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double seconds_of(const std::function<void()>& op, int repeats) {
  const auto t0 = Clock::now();
  for (int i = 0; i < repeats; ++i) op();
  return std::chrono::duration<double>(Clock::now() - t0).count() / repeats;
}

// Linear + LayerNorm blocks: four parameter tensors per block.
torch::nn::Sequential make_model(int blocks, int width) {
  torch::manual_seed(0);
  torch::nn::Sequential model;
  for (int b = 0; b < blocks; ++b) {
    model->push_back(torch::nn::Linear(width, width));
    model->push_back(torch::nn::LayerNorm(torch::nn::LayerNormOptions({width})));
  }
  return model;
}

void fill_gradients(torch::nn::Sequential& model) {
  torch::NoGradGuard no_grad;
  for (auto& p : model->parameters()) {
    if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
    p.mutable_grad().copy_(torch::randn_like(p) * 1e-2);
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("Fused AdamW vs torch::optim::AdamW step time");
  int blocks = 40, width = 256, rounds = 5;
  bool markdown = false;
  app.add_option("--blocks", blocks, "Linear+LayerNorm blocks (4 parameter tensors each)")
      ->check(CLI::PositiveNumber);
  app.add_option("--width", width, "features per layer")->check(CLI::PositiveNumber);
  app.add_option("--rounds", rounds, "alternating rounds; the median is reported")
      ->check(CLI::PositiveNumber);
  app.add_flag("--markdown", markdown, "print a Markdown table");
  CLI11_PARSE(app, argc, argv);

  auto torch_model = make_model(blocks, width), fused_model = make_model(blocks, width);
  const auto options = torch::optim::AdamWOptions(1e-3).weight_decay(0.01);
  torch::optim::AdamW torch_adamw(torch_model->parameters(), options);
  accelerant::FusedAdamW fused(fused_model->parameters(), options);
  for (auto* m : {&torch_model, &fused_model}) fill_gradients(*m);
  const int64_t tensors = static_cast<int64_t>(fused_model->parameters().size());
  const int64_t numel = fused.updater().numel();
  const double bytes = 28.0 * static_cast<double>(numel);
  std::vector<char> from(static_cast<size_t>(bytes)), to(static_cast<size_t>(bytes), 1);

  if (markdown) {
    std::printf(
        "Model: %d Linear(%d)+LayerNorm blocks, %lld parameter tensors, %lld parameters.\n\n",
        blocks, width, static_cast<long long>(tensors), static_cast<long long>(numel));
    std::printf(
        "| threads | torch AdamW ms | fused AdamW ms | speed-up (torch / fused) | goal 3x | fused "
        "GB/s | memcpy GB/s |\n");
    std::printf("|---|---|---|---|---|---|---|\n");
  }
  for (int threads : {1, 2}) {
    torch::set_num_threads(threads);
    std::vector<double> t_torch, t_fused, t_copy;
    for (int i = 0; i < 3; ++i) torch_adamw.step(), fused.step();  // warm up
    for (int r = 0; r < rounds; ++r) {
      t_torch.push_back(seconds_of([&] { torch_adamw.step(); }, 5));
      t_fused.push_back(seconds_of([&] { fused.step(); }, 5));
      t_copy.push_back(seconds_of([&] { std::memcpy(to.data(), from.data(), from.size()); }, 5));
    }
    const double torch_s = median(t_torch), fused_s = median(t_fused), copy_s = median(t_copy);
    const double speedup = torch_s / fused_s;
    if (markdown) {
      std::printf("| %d | %.2f | %.2f | %.2fx | %s | %.1f | %.1f |\n", threads, torch_s * 1e3,
                  fused_s * 1e3, speedup, speedup >= 3 ? "met" : "**missed**",
                  bytes / fused_s / 1e9, 2 * bytes / copy_s / 1e9);
    } else {
      std::printf(
          "threads %d: torch AdamW %.2f ms, fused %.2f ms (%.2fx, goal 3x %s); "
          "fused moves %.1f GB/s, memcpy %.1f GB/s\n",
          threads, torch_s * 1e3, fused_s * 1e3, speedup, speedup >= 3 ? "met" : "MISSED",
          bytes / fused_s / 1e9, 2 * bytes / copy_s / 1e9);
    }
  }
  return 0;
}
