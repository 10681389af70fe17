// The notebook pattern from Accelerate's notebook_launcher: build the model once, in the running
// program, then hand a training function to the launcher. The workers are forked, so they share
// the model and the data built before the fork (copy-on-write) instead of each building or
// loading its own copy, which is what makes this fit where memory is short.
//
//   notebook_style                 2 workers
//   notebook_style -n 4 --steps 300
#include <accelerant/accelerant.h>

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>

namespace {

// Points in the plane, labelled by which of two interleaved spirals they lie on.
std::pair<torch::Tensor, torch::Tensor> two_spirals(int64_t n) {
  auto t = torch::linspace(0.5, 3 * M_PI, n / 2);
  auto a = torch::stack({t * torch::cos(t), t * torch::sin(t)}, 1);
  auto points = torch::cat({a, -a}) / (3 * M_PI) + 0.02 * torch::randn({2 * (n / 2), 2});
  auto labels =
      torch::cat({torch::zeros({n / 2}, torch::kLong), torch::ones({n / 2}, torch::kLong)});
  return {points, labels};
}

// What each worker runs: the model and data arrive as arguments, already built.
double training_loop(int index, torch::nn::Sequential model, const torch::Tensor& points,
                     const torch::Tensor& labels, int64_t steps) {
  accelerant::Accelerator acc;
  torch::optim::Adam adam(model->parameters(), 1e-2);
  auto loader = accelerant::make_data_loader(
      points, labels, accelerant::DataLoaderOptions().batch_size(64).shuffle(true));
  auto [m, opt, batches] = acc.prepare(model, adam, loader);
  double loss_value = 0;
  for (int64_t step = 0; step < steps;) {
    for (auto& batch : batches) {
      if (step++ == steps) break;
      auto loss = torch::nn::functional::cross_entropy(m->forward(batch.data), batch.target);
      acc.backward(loss);
      opt.step();
      opt.zero_grad();
      loss_value = loss.item<double>();
      if (step % 100 == 0) acc.print("step ", step, ": loss ", loss_value);
    }
  }
  // Every worker returns a value; launch hands them back in rank order.
  return acc.reduce(torch::tensor(loss_value), accelerant::ReduceOp::kMean).item<double>();
}

}  // namespace

int main(int argc, char** argv) {
  int world_size = 2;
  int64_t steps = 400;
  CLI::App app{
      "The notebook pattern: the model is built once in main, then accelerant::launch(fn, model, "
      "...).\n\n"
      "Examples:\n  notebook_style\n  notebook_style -n 4 --steps 300"};
  app.add_option(accelerant::flag_names("world_size", "-n"), world_size,
                 "Processes to fork on this machine, the world size (ignored under a launcher)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--steps", steps, "Optimizer steps")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);

  try {
    // Under a launcher (accelerant launch, torchrun, srun, mpirun) launch runs training_loop here
    // as this process's rank; otherwise it forks the workers.
    const auto options = accelerant::LaunchOptions().processes_per_node(world_size);
    const auto plan = accelerant::prepare_launch(options);
    torch::manual_seed(0);
    auto [points, labels] = two_spirals(2048);
    torch::nn::Sequential model(torch::nn::Linear(2, 64), torch::nn::Tanh(),
                                torch::nn::Linear(64, 64), torch::nn::Tanh(),
                                torch::nn::Linear(64, 2));
    auto losses = accelerant::launch(training_loop, model, points, labels, steps, options);
    if (!plan.is_main_process) return 0;  // one summary line for the whole job
    std::printf("final mean loss %.4f on %d workers (chance: %.4f)\n", losses.front(),
                plan.world_size, std::log(2.0));
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "notebook_style: %s\n", e.what());
    return 1;
  }
}
