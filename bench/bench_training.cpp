// Training throughput of Accelerant for bench/compare_training.py, which runs the same models in
// Python DDP (bench/ddp_train.py) side by side. Contract (the driver relies on it):
//
//   bench_training --model cnn|mlp --batch B --steps S --warmup W [--threads T] --processes P
//                  [--plain | --no-cpu-defaults | --no-thread-defaults | --no-malloc-defaults]
//                  [--no-communication] [--paired-overhead] [--mlp_width N] [--fused]
//
// prints exactly one line `RESULT samples_per_sec=X step_ms_median=Y world=N
// exposed_wait_ms_median=Z` (X counts samples of all processes; Z is the all-reduce time left after
// backward, rank 0). --plain is a bare LibTorch loop without the Accelerator (one process only).
// --paired-overhead trains a plain loop and the Accelerator in one process, in alternating blocks,
// and prints a PLAIN line for the plain side as well (both rates from the median step). The
// CPU-default switches turn the Accelerator's defaults off (both, or one of them): "off" means
// LibTorch's own behaviour, every process using all cores for its intra-op and OpenBLAS pools, and
// glibc's malloc thresholds untouched.
#include <accelerant/accelerant.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>

namespace {

struct Config {
  std::string model = "cnn";
  int64_t batch = 64;
  int steps = 60;
  int warmup = 10;
  int threads = 0;  // 0 = let the launcher and the Accelerator choose
  int processes = 1;
  bool plain = false;
  bool no_cpu_defaults = false;
  bool no_thread_defaults = false;
  bool no_malloc_defaults = false;
  bool no_communication = false;
  bool paired_overhead = false;
  int bucket_cap_mb = 25;
  int64_t mlp_width = 512;  // hidden features of the MLP (its size, for the scaling bench)
  bool fused = false;       // AcceleratorOptions::fused_optimizers
};

// The models of bench/ddp_train.py, layer for layer.
torch::nn::Sequential make_model(const std::string& name, int64_t width = 512) {
  namespace nn = torch::nn;
  if (name == "mlp") {
    return nn::Sequential(nn::Flatten(), nn::Linear(784, width), nn::ReLU(),
                          nn::Linear(width, width), nn::ReLU(), nn::Linear(width, 10));
  }
  // examples/fashion_mnist's Net, layer for layer.
  return nn::Sequential(nn::Conv2d(nn::Conv2dOptions(1, 16, 5)), nn::ReLU(), nn::MaxPool2d(2),
                        nn::Conv2d(nn::Conv2dOptions(16, 32, 5)), nn::ReLU(), nn::MaxPool2d(2),
                        nn::Flatten(), nn::Linear(32 * 4 * 4, 128), nn::ReLU(),
                        nn::Linear(128, 10));
}

struct Timing {
  double samples_per_sec = 0;
  double step_ms_median = 0;
  double exposed_wait_ms_median = 0;  // communication left after backward (the reducer's wait)
};

// Runs warmup then timed steps of `step(batch_index)`; `sync` marks the start of timing on every
// rank (a barrier), as the Python side does.
template <class Step, class Sync>
Timing time_steps(const Config& c, int world, Step&& step, Sync&& sync) {
  for (int i = 0; i < c.warmup; ++i) step(i);
  sync();
  std::vector<double> ms;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < c.steps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    step(c.warmup + i);
    ms.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::nth_element(ms.begin(), ms.begin() + ms.size() / 2, ms.end());
  return {static_cast<double>(c.batch) * world * c.steps / elapsed, ms[ms.size() / 2]};
}

struct Data {
  std::vector<torch::Tensor> inputs, labels;
};

Data make_data(const Config& c, int rank) {
  torch::manual_seed(1234 + rank);
  Data d;
  for (int i = 0; i < 64; ++i) {
    d.inputs.push_back(torch::randn({c.batch, 1, 28, 28}));
    d.labels.push_back(torch::randint(0, 10, {c.batch}, torch::kLong));
  }
  return d;
}

// One step of the plain LibTorch loop, the baseline the Accelerator is compared with.
void plain_step(torch::nn::Sequential& model, torch::optim::SGD& sgd, const Data& d, int i) {
  sgd.zero_grad();
  auto loss =
      torch::nn::functional::cross_entropy(model->forward(d.inputs[i % 64]), d.labels[i % 64]);
  loss.backward();
  sgd.step();
}

Timing run_plain(const Config& c) {
  if (c.threads > 0) accelerant::set_compute_threads(c.threads);
  torch::manual_seed(0);
  auto model = make_model(c.model, c.mlp_width);
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  const Data d = make_data(c, 0);
  return time_steps(
      c, 1, [&](int i) { plain_step(model, sgd, d, i); }, [] {});
}

Timing run_accelerated(const Config& c) {
  const bool thread_defaults = !(c.no_cpu_defaults || c.no_thread_defaults);
  const bool malloc_defaults = !(c.no_cpu_defaults || c.no_malloc_defaults);
  const bool all_defaults = thread_defaults && malloc_defaults;
  accelerant::Accelerator acc(accelerant::AcceleratorOptions()
                                  .cpu_defaults(all_defaults)
                                  .bucket_cap_mb(c.bucket_cap_mb)
                                  .fused_optimizers(c.fused));
  if (!all_defaults) {
    // The half that stays on, as the Accelerator would apply it; the half that is off keeps
    // LibTorch's own behaviour (every process uses all cores; glibc's thresholds untouched).
    const int cores = static_cast<int>(std::thread::hardware_concurrency());
    const int aligned = c.threads > 0 ? c.threads : std::max(1, cores / c.processes);
    accelerant::set_compute_threads(thread_defaults ? aligned : cores);
    if (malloc_defaults) accelerant::keep_freed_memory_in_heap();
  }
  torch::manual_seed(0);
  auto model = make_model(c.model, c.mlp_width);
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  auto [m, o] = acc.prepare(model, sgd);
  const Data d = make_data(c, acc.rank());
  std::vector<double> exposed_ms;
  auto step = [&](int i) {
    o.zero_grad();
    auto loss =
        torch::nn::functional::cross_entropy(m->forward(d.inputs[i % 64]), d.labels[i % 64]);
    if (c.no_communication) {
      auto local_only = acc.no_sync(m);
      acc.backward(loss);
    } else {
      acc.backward(loss);
    }
    o.step();
    if (i >= c.warmup) exposed_ms.push_back(1e3 * acc.reducer_stats(m).exposed_wait_seconds);
  };
  Timing t = time_steps(c, acc.world_size(), step, [&] { acc.wait_for_everyone(); });
  std::nth_element(exposed_ms.begin(), exposed_ms.begin() + exposed_ms.size() / 2,
                   exposed_ms.end());
  t.exposed_wait_ms_median = exposed_ms[exposed_ms.size() / 2];
  // Rank 0's clock covers the slowest rank too: every step ends in an all-reduce.
  acc.end_training();
  return t;
}

// The Accelerator's per-step overhead, measured in one process: the same model trained by a plain
// loop and through the Accelerator, in alternating blocks of steps, so that both sides see the
// same machine state (clock, neighbours, allocator). Returns {accelerator, plain}.
std::pair<Timing, Timing> run_paired_overhead(const Config& c) {
  if (c.threads > 0) accelerant::set_compute_threads(c.threads);
  accelerant::Accelerator acc(accelerant::AcceleratorOptions().cpu_defaults(false));
  // Process-wide, so both sides get it; without it page-fault bursts land on either side at random.
  accelerant::keep_freed_memory_in_heap();
  torch::manual_seed(0);
  auto plain_model = make_model(c.model, c.mlp_width);
  torch::manual_seed(0);
  auto accelerated_model = make_model(c.model, c.mlp_width);
  torch::optim::SGD plain_sgd(plain_model->parameters(),
                              torch::optim::SGDOptions(0.01).momentum(0.9));
  torch::optim::SGD sgd(accelerated_model->parameters(),
                        torch::optim::SGDOptions(0.01).momentum(0.9));
  auto [m, o] = acc.prepare(accelerated_model, sgd);
  const Data d = make_data(c, 0);
  auto plain = [&](int i) { plain_step(plain_model, plain_sgd, d, i); };
  auto accelerated_step = [&](int i) {
    o.zero_grad();
    acc.backward(
        torch::nn::functional::cross_entropy(m->forward(d.inputs[i % 64]), d.labels[i % 64]));
    o.step();
  };
  for (int i = 0; i < c.warmup; ++i) {
    plain(i);
    accelerated_step(i);
  }
  constexpr int kBlock = 5;
  std::vector<double> ms[2];
  for (int i = 0; i < c.steps; i += kBlock) {
    for (int k = 0; k < 2; ++k) {
      const int side = (i / kBlock + k) % 2;  // alternate which side goes first
      for (int j = i; j < std::min(c.steps, i + kBlock); ++j) {
        const auto t0 = std::chrono::steady_clock::now();
        side == 0 ? accelerated_step(j) : plain(j);
        const double took =
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                .count();
        ms[side].push_back(took);
      }
    }
  }
  Timing t[2];
  for (int side = 0; side < 2; ++side) {
    std::nth_element(ms[side].begin(), ms[side].begin() + ms[side].size() / 2, ms[side].end());
    // From the median step: one slow step (a page-fault burst, a neighbour) must not decide it.
    const double median = ms[side][ms[side].size() / 2];
    t[side] = {1e3 * static_cast<double>(c.batch) / median, median, 0.0};
  }
  return {t[0], t[1]};
}

}  // namespace

int main(int argc, char** argv) {
  Config c;
  CLI::App app{"Training throughput of Accelerant (see bench/compare_training.py)."};
  app.add_option("--model", c.model, "cnn or mlp")
      ->check(CLI::IsMember({"cnn", "mlp"}))
      ->capture_default_str();
  app.add_option("--batch", c.batch, "Samples per step per process")->capture_default_str();
  app.add_option("--steps", c.steps, "Timed steps")->capture_default_str();
  app.add_option("--warmup", c.warmup, "Untimed steps first")->capture_default_str();
  app.add_option("--threads", c.threads, "Threads per process (0: the defaults choose)")
      ->capture_default_str();
  app.add_option("--processes", c.processes, "Processes")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_flag("--plain", c.plain, "A bare LibTorch loop, no Accelerator (1 process)");
  app.add_flag("--no-cpu-defaults", c.no_cpu_defaults,
               "Accelerator without its thread and malloc defaults");
  app.add_flag("--no-thread-defaults", c.no_thread_defaults,
               "Accelerator without its thread default");
  app.add_flag("--no-malloc-defaults", c.no_malloc_defaults,
               "Accelerator without its malloc default");
  app.add_option("--bucket_cap_mb", c.bucket_cap_mb, "Gradient bucket size")->capture_default_str();
  app.add_option("--mlp_width", c.mlp_width, "Hidden features of the MLP")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_flag("--fused", c.fused,
               "Step the SGD with the fused update (AcceleratorOptions::fused_optimizers)");
  app.add_flag(
      "--paired-overhead", c.paired_overhead,
      "One process: plain loop and Accelerator in alternating blocks; prints RESULT (Accelerator) "
      "and PLAIN lines");
  app.add_flag("--no-communication", c.no_communication,
               "Skip the gradient all-reduce (no_sync every step): the compute-only upper bound");
  CLI11_PARSE(app, argc, argv);
  if (c.plain && c.processes != 1) {
    std::fprintf(stderr, "bench_training: --plain runs one process; got --processes %d\n",
                 c.processes);
    return 2;
  }
  try {
    Timing t;
    if (c.paired_overhead) {
      auto [accelerated, plain] = run_paired_overhead(c);
      std::printf("PLAIN samples_per_sec=%.2f step_ms_median=%.3f\n", plain.samples_per_sec,
                  plain.step_ms_median);
      t = accelerated;
    } else if (c.plain) {
      t = run_plain(c);
    } else if (c.processes == 1) {
      if (c.threads > 0) accelerant::set_compute_threads(c.threads);
      t = run_accelerated(c);
    } else {
      auto options = accelerant::LaunchOptions().processes_per_node(c.processes).verbose(false);
      if (c.threads > 0) options.threads_per_process(c.threads);
      // Results travel as tensors (launch pickles them): {samples/s, median step ms} of rank 0.
      auto results = accelerant::launch(
          [](const Config& config) {
            Timing mine = run_accelerated(config);
            return torch::tensor(
                {mine.samples_per_sec, mine.step_ms_median, mine.exposed_wait_ms_median},
                torch::kDouble);
          },
          std::cref(c), options);
      t = {results.front()[0].item<double>(), results.front()[1].item<double>(),
           results.front()[2].item<double>()};
    }
    std::printf(
        "RESULT samples_per_sec=%.2f step_ms_median=%.3f world=%d exposed_wait_ms_median=%.3f\n",
        t.samples_per_sec, t.step_ms_median, c.processes, t.exposed_wait_ms_median);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_training: %s\n", e.what());
    return 1;
  }
}
