// What the step-time breakdown and per-step logging cost (issue 20's goal: at most 1 % of a step
// on the CNN). Two measures, printed as one RESULT line:
//
//   bench_observability_overhead [--processes P] [--steps S] [--every N]
//
// 1. In training: the example's CNN on P processes, in alternating blocks of 10 steps with the
//    breakdown's timers on plus a log of the loss to CSV, JSON Lines and TensorBoard at every
//    step, and with both off; the side that goes first alternates, so both see the same machine
//    state. The ranks switch in lockstep, so the breakdown's exchange (every N timed steps) runs
//    as it would. Compares the median step of each side.
// 2. The instrumentation and one log call alone: the timers and the step's end, as one step runs
// them, a million
//    times without a model; nanoseconds per step (the in-training difference is mostly noise at
//    this scale; these are not). A log call is timed on rank 0, which writes the files.
#include <accelerant/accelerant.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>

#include "base/step_timing.h"  // turns the timers on and off between blocks

namespace {

struct Config {
  int processes = 2;
  int steps = 400;
  int every = 20;
  std::string dir = "/tmp/accelerant-observability-bench";
};

torch::nn::Sequential make_cnn() {
  namespace nn = torch::nn;
  return nn::Sequential(nn::Conv2d(nn::Conv2dOptions(1, 16, 5)), nn::ReLU(), nn::MaxPool2d(2),
                        nn::Conv2d(nn::Conv2dOptions(16, 32, 5)), nn::ReLU(), nn::MaxPool2d(2),
                        nn::Flatten(), nn::Linear(32 * 4 * 4, 128), nn::ReLU(),
                        nn::Linear(128, 10));
}

double median(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

// {median step ms with observability on, with it off}
torch::Tensor train_in_blocks(const Config& c) {
  accelerant::Accelerator acc(accelerant::AcceleratorOptions()
                                  .project_dir(c.dir)
                                  .log_with({"csv", "jsonl", "tensorboard"})
                                  .step_breakdown_every(c.every));
  acc.init_trackers("bench", {{"steps", c.steps}});
  torch::manual_seed(0);
  auto model = make_cnn();
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  auto [m, o] = acc.prepare(model, sgd);
  torch::manual_seed(1 + acc.rank());
  std::vector<torch::Tensor> x, y;
  for (int i = 0; i < 16; ++i) {
    x.push_back(torch::randn({64, 1, 28, 28}));
    y.push_back(torch::randint(0, 10, {64}, torch::kLong));
  }
  int64_t step = 0;
  auto train_step = [&](bool observed) {
    o.zero_grad();
    auto loss = torch::nn::functional::cross_entropy(m->forward(x[step % 16]), y[step % 16]);
    acc.backward(loss);
    o.step();
    ++step;
    if (observed) acc.log({{"train/loss", loss.item<double>()}}, step);
  };
  accelerant::detail::set_step_timing(true);
  for (int i = 0; i < 20; ++i) train_step(true);  // warm-up
  acc.wait_for_everyone();
  constexpr int kBlock = 10;
  std::vector<double> ms[2];  // [0]: observed, [1]: not
  for (int block = 0; block * kBlock < c.steps; block += 2) {
    for (int k = 0; k < 2; ++k) {
      const int side = (block / 2 + k) % 2;
      accelerant::detail::set_step_timing(side == 0);
      for (int j = 0; j < kBlock; ++j) {
        const auto t0 = std::chrono::steady_clock::now();
        train_step(side == 0);
        ms[side].push_back(
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                .count());
      }
    }
  }
  accelerant::detail::set_step_timing(true);
  // One log call to the three trackers, alone (rank 0 writes; the others return at once).
  constexpr int kLogs = 2000;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < kLogs; ++i) acc.log({{"bench/value", 0.5 + i}}, step + i);
  const double log_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() /
      kLogs;
  acc.end_training();
  return torch::tensor({median(ms[0]), median(ms[1]), log_ms}, torch::kDouble);
}

// Nanoseconds per step of the instrumentation a step runs: the data wait and optimizer timers,
// the all-reduce wait timer, and the step's end (with the exchange's listener off).
double instrumentation_ns_per_step() {
  using namespace accelerant::detail;
  set_step_timing(true);
  static int owner;
  constexpr int kSteps = 1000000;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < kSteps; ++i) {
    { PhaseTimer data(StepPhase::data, "data wait"); }
    { PhaseTimer wait(StepPhase::all_reduce, "all-reduce wait"); }
    { PhaseTimer update(StepPhase::optimizer, "optimizer"); }
    end_timed_step(&owner, i + 1);
  }
  return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() /
         kSteps;
}

}  // namespace

int main(int argc, char** argv) {
  Config c;
  CLI::App app{"What the step-time breakdown and per-step logging cost (docs/benchmarks.md)"};
  app.add_option("--processes", c.processes, "Processes")->capture_default_str();
  app.add_option("--steps", c.steps, "Timed steps, half of them observed")->capture_default_str();
  app.add_option("--every", c.every, "step_breakdown_every")->capture_default_str();
  app.add_option("--dir", c.dir, "Where the trackers write (emptied first)")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  try {
    std::filesystem::remove_all(c.dir);
    auto results = accelerant::launch([&](int) { return train_in_blocks(c); },
                                      accelerant::LaunchOptions()
                                          .processes_per_node(c.processes)
                                          .threads_per_process(1)
                                          .verbose(false));
    const double log_ms = results.front()[2].item<double>();
    const double on = results.front()[0].item<double>();
    const double off = results.front()[1].item<double>();
    const double ns = instrumentation_ns_per_step();
    std::printf(
        "RESULT observed_step_ms=%.3f plain_step_ms=%.3f overhead_pct=%.2f "
        "instrumentation_ns_per_step=%.0f instrumentation_pct=%.4f log_us_per_call=%.1f "
        "log_pct=%.3f\n",
        on, off, 100 * (on / off - 1), ns, 100 * ns * 1e-6 / off, log_ms * 1e3, 100 * log_ms / off);
    std::filesystem::remove_all(c.dir);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_observability_overhead: %s\n", e.what());
    return 1;
  }
}
