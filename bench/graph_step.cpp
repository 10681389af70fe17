// Graph mode vs eager: the same whole training step (forward, backward, fused AdamW) run eagerly
// and through accelerator.compile, side by side, on a small MLP and a small transformer
// classifier. On a GPU the compiled step replays a CUDA graph (goal: >= 2x the eager step); on
// the CPU both run eagerly and the row only shows graph mode's bookkeeping cost.
//
// The two sides alternate, in rounds: eager first in even rounds, graph mode first in odd ones,
// so that neither always runs on a warmer (or more disturbed) machine; each row is the median
// of its rounds.
//
//   bench_graph_step [--steps 200] [--rounds 5] [--model mlp|transformer|both]
#include <accelerant/accelerant.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

struct TransformerClassifierImpl : torch::nn::Module {
  torch::nn::Embedding embed{nullptr};
  torch::nn::TransformerEncoder encoder{nullptr};
  torch::nn::Linear head{nullptr};
  TransformerClassifierImpl() {
    embed = register_module("embed", torch::nn::Embedding(1000, 128));
    encoder = register_module(
        "encoder", torch::nn::TransformerEncoder(torch::nn::TransformerEncoderOptions(
                       torch::nn::TransformerEncoderLayer(
                           torch::nn::TransformerEncoderLayerOptions(128, 4).dim_feedforward(256)),
                       2)));
    head = register_module("head", torch::nn::Linear(128, 4));
  }
  torch::Tensor forward(const torch::Tensor& tokens) {
    auto h = encoder->forward(embed->forward(tokens).transpose(0, 1));  // [seq, batch, dim]
    return head->forward(h.mean(0));
  }
};
TORCH_MODULE(TransformerClassifier);

void sync(const torch::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize();
}

// Milliseconds per step over `steps` steps after a warm-up, the device drained at both ends.
template <class Step>
double ms_per_step(Step&& step, int steps, const torch::Device& device) {
  for (int i = 0; i < 10; ++i) step();
  sync(device);
  const auto t0 = Clock::now();
  for (int i = 0; i < steps; ++i) step();
  sync(device);
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count() / steps;
}

template <class Model>
double measure(const char* name, bool compiled, Model model, torch::Tensor x, torch::Tensor y,
               int steps) {
  accelerant::Accelerator acc(accelerant::AcceleratorOptions().fused_optimizers(true));
  torch::optim::AdamW adamw(model->parameters(), torch::optim::AdamWOptions(1e-4));
  auto [m, opt] = acc.prepare(model, adamw);
  x = x.to(acc.device()), y = y.to(acc.device());
  auto body = [&, m = m, opt = opt](const accelerant::GraphStep::Inputs& in) mutable {
    auto loss = torch::nn::functional::cross_entropy(m->forward(in[0]), in[1]);
    acc.backward(loss);
    opt.step();
    opt.zero_grad();
    return accelerant::GraphStep::Outputs{loss.detach()};
  };
  accelerant::GraphStep step = acc.compile(body, accelerant::GraphStepOptions().name(name));
  const accelerant::GraphStep::Inputs in{x, y};
  if (compiled) return ms_per_step([&] { step(in); }, steps, acc.device());
  return ms_per_step([&] { body(in); }, steps, acc.device());
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

// Medians of (eager, graph mode) over `rounds` rounds, alternating which side runs first.
std::pair<double, double> alternate(int rounds, const std::function<double(bool compiled)>& run) {
  std::vector<double> eager, graph;
  for (int r = 0; r < rounds; ++r) {
    for (const bool compiled : {r % 2 == 1, r % 2 == 0}) {
      (compiled ? graph : eager).push_back(run(compiled));
    }
  }
  return {median(eager), median(graph)};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app(
      "Graph mode vs eager: one training step, both ways, side by side (goal on a GPU: >= 2x)");
  int steps = 200;
  int rounds = 5;
  std::string which = "both";
  app.add_option("--steps", steps, "Timed steps per row (after 10 warm-up steps)")
      ->check(CLI::PositiveNumber);
  app.add_option("--rounds", rounds, "Rounds per row, the sides alternating which runs first")
      ->check(CLI::PositiveNumber);
  app.add_option("--model", which, "mlp, transformer or both")
      ->check(CLI::IsMember({"mlp", "transformer", "both"}));
  CLI11_PARSE(app, argc, argv);

  const bool gpu = torch::cuda::is_available();
  std::printf(
      "device: %s; %d timed steps per side and round, %d rounds alternating which side runs "
      "first (eager first in the first round); medians\n\n",
      gpu ? "CUDA" : "CPU (both sides run the same eager code: no graphs to replay)", steps,
      rounds);
  std::printf(
      "| model | eager ms/step | graph mode ms/step | speed-up | goal (GPU) >= 2x "
      "|\n|---|---:|---:|---:|---|\n");
  auto row = [&](const char* name, std::pair<double, double> times) {
    const auto [eager, graph] = times;
    const double ratio = eager / graph;
    std::printf("| %s | %.3f | %.3f | %.2fx | %s |\n", name, eager, graph, ratio,
                gpu ? (ratio >= 2.0 ? "met" : "MISSED") : "n/a on the CPU");
  };
  if (which != "transformer") {
    torch::manual_seed(0);
    auto x = torch::randn({64, 32}), y = torch::randint(0, 10, {64}, torch::kLong);
    auto mlp = [] {
      torch::manual_seed(1);
      return torch::nn::Sequential(torch::nn::Linear(32, 256), torch::nn::GELU(),
                                   torch::nn::Linear(256, 256), torch::nn::GELU(),
                                   torch::nn::Linear(256, 10));
    };
    row("MLP 32-256-256-10, batch 64", alternate(rounds, [&](bool compiled) {
          return measure("mlp", compiled, mlp(), x, y, steps);
        }));
  }
  if (which != "mlp") {
    torch::manual_seed(0);
    auto x = torch::randint(0, 1000, {32, 64}, torch::kLong),
         y = torch::randint(0, 4, {32}, torch::kLong);
    auto model = [] {
      torch::manual_seed(1);
      return TransformerClassifier();
    };
    row("transformer 2x128 (4 heads), 32x64 tokens", alternate(rounds, [&](bool compiled) {
          return measure("transformer", compiled, model(), x, y, steps);
        }));
  }
  return 0;
}
