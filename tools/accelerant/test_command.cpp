// accelerant test: a self-test of this installation with the current config. Started by hand, it
// launches itself as workers (the same launcher as `accelerant launch`); started by a launcher
// (`accelerant launch`, torchrun, srun, mpirun) it is one of the workers. The workers check the
// collectives and a few data-parallel training steps against the same steps in one process.
#include <accelerant/accelerant.h>
#include <limits.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/linear.h>
#include <unistd.h>

#include <iostream>
#include <sstream>

#include "commands.h"

namespace accelerant::cli {
namespace {

int failures = 0;

void report(Accelerator& acc, const std::string& check, bool passed, const std::string& details) {
  if (!passed) ++failures;
  std::cout << rank_prefix(acc.rank(), acc.world_size()) << (passed ? "PASS " : "FAIL ") << check
            << (passed ? "" : ": " + details) << std::endl;
}

torch::nn::Sequential tiny_mlp() {
  torch::manual_seed(0);
  return torch::nn::Sequential(torch::nn::Linear(8, 16), torch::nn::Tanh(),
                               torch::nn::Linear(16, 4));
}

torch::Tensor flat_parameters(torch::nn::Sequential& model) {
  std::vector<torch::Tensor> parts;
  for (auto& p : model->parameters()) parts.push_back(p.detach().reshape({-1}));
  return torch::cat(parts);
}

// The sum of 1..N over the processes.
void check_all_reduce(Accelerator& acc) {
  const int n = acc.world_size();
  const int r = acc.rank();
  auto sum = acc.reduce(torch::tensor({r + 1.0}), ReduceOp::kSum).item<double>();
  report(
      acc, "all_reduce", sum == n * (n + 1) / 2.0,
      "sum of 1..N is " + std::to_string(sum) + ", expected " + std::to_string(n * (n + 1) / 2.0));
}

// Several chunks of the shared-memory path (or Gloo's), every element checked.
void check_large_all_reduce(Accelerator& acc) {
  const int n = acc.world_size();
  const int r = acc.rank();
  auto& comm = ProcessState::get().communicator();
  if (acc.is_main_process())
    std::cout << rank_prefix(0, acc.world_size()) << "all-reduce path: " << comm.all_reduce_path()
              << std::endl;
  auto big = torch::full({1 << 20}, static_cast<float>(r + 1));
  comm.all_reduce_(big);
  const auto wrong = (big != static_cast<float>(n * (n + 1) / 2)).sum().item<int64_t>();
  report(acc, "all_reduce of 4 MiB", wrong == 0,
         std::to_string(wrong) + " of 1048576 elements wrong");
}

// Reports whether `actual`'s parameters equal `expected`'s to a relative 1e-5 (the largest
// difference over the largest expected magnitude), as the numeric checks all require.
void report_parameters_close(Accelerator& acc, const std::string& name,
                             torch::nn::Sequential& actual, torch::nn::Sequential& expected) {
  const auto want = flat_parameters(expected);
  const double difference =
      ((flat_parameters(actual) - want).abs().max() / want.abs().max()).item<double>();
  report(acc, name, difference <= 1e-5,
         "relative difference " + std::to_string(difference) + " (limit 1e-5)");
}

// The fused AdamW against torch::optim's, on this process alone.
void check_fused_adamw(Accelerator& acc) {
  auto plain_model = tiny_mlp(), fused_model = tiny_mlp();
  torch::optim::AdamW plain(plain_model->parameters(),
                            torch::optim::AdamWOptions(1e-2).weight_decay(0.1));
  FusedAdamW fused(fused_model->parameters(), torch::optim::AdamWOptions(1e-2).weight_decay(0.1));
  torch::manual_seed(2);
  for (int s = 0; s < 5; ++s) {
    auto input = torch::randn({8, 8});
    for (auto* pair : {&plain_model, &fused_model})
      (*pair)->forward(input).pow(2).mean().backward();
    plain.step();
    fused.step();
    plain.zero_grad();
    fused.zero_grad();
  }
  report_parameters_close(acc, "fused AdamW equals torch::optim::AdamW", fused_model, plain_model);
}

// Process r contributes r + 1 copies of r: the gather must put them end to end in rank order.
void check_gather(Accelerator& acc) {
  const int n = acc.world_size();
  const int r = acc.rank();
  auto gathered = acc.gather(torch::full({r + 1}, static_cast<double>(r)));
  bool gather_ok = gathered.size(0) == n * (n + 1) / 2;
  for (int k = 0, at = 0; gather_ok && k < n; at += ++k) {
    gather_ok =
        torch::equal(gathered.narrow(0, at, k + 1), torch::full({k + 1}, static_cast<double>(k)));
  }
  report(acc, "gather of unequal lengths", gather_ok, c10::str("got ", gathered));
}

// Data-parallel steps against the same steps on the whole batch in this process alone.
void check_data_parallel_training(Accelerator& acc) {
  const int n = acc.world_size();
  const int64_t per_rank = 4, steps = 5;
  torch::manual_seed(1);
  auto x = torch::randn({steps * per_rank * n, 8});
  auto y = torch::randint(0, 4, {steps * per_rank * n}, torch::kLong);
  auto reference = tiny_mlp();
  torch::optim::SGD reference_sgd(reference->parameters(), 0.1);
  for (int64_t s = 0; s < steps; ++s) {
    reference_sgd.zero_grad();
    torch::nn::functional::cross_entropy(
        reference->forward(x.narrow(0, s * per_rank * n, per_rank * n)),
        y.narrow(0, s * per_rank * n, per_rank * n))
        .backward();
    reference_sgd.step();
  }
  auto model = tiny_mlp();
  torch::optim::SGD sgd(model->parameters(), 0.1);
  auto [m, o, loader] =
      acc.prepare(model, sgd, make_data_loader(x, y, DataLoaderOptions().batch_size(per_rank)));
  for (auto& batch : loader) {
    acc.backward(torch::nn::functional::cross_entropy(m->forward(batch.data), batch.target));
    o.step();
    o.zero_grad();
  }
  report_parameters_close(acc, "training steps equal one process on the combined batch", m,
                          reference);
}

// Runs inside each worker.
int run_checks() {
  Accelerator acc;
  const int n = acc.world_size();
  check_all_reduce(acc);
  if (n > 1) check_large_all_reduce(acc);
  check_fused_adamw(acc);
  check_gather(acc);
  check_data_parallel_training(acc);

  const int total_failures =
      static_cast<int>(acc.reduce(torch::tensor({failures}), ReduceOp::kSum).item<int64_t>());
  if (acc.is_main_process()) {
    std::cout << (total_failures == 0 ? "accelerant test: all checks passed on "
                                      : "accelerant test: FAILED on ")
              << n << " process" << (n == 1 ? "" : "es") << std::endl;
  }
  acc.end_training();
  return total_failures == 0 ? 0 : 1;
}

std::string own_executable() {
  char path[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", path, sizeof(path) - 1);
  if (n <= 0) {
    throw Error(
        "accelerant test: cannot find its own executable: /proc/self/exe is unreadable. Likely "
        "cause: "
        "/proc is not mounted (a minimal container). Fix: mount /proc, or run the checks under a "
        "launcher yourself: `accelerant launch -n 2 accelerant test`.");
  }
  return std::string(path, static_cast<size_t>(n));
}

}  // namespace

void add_test_command(CLI::App& app, Action& action) {
  auto* test = app.add_subcommand(
      "test",
      "Self-test: launch workers with the current config and check the collectives (and say which\n"
      "all-reduce path they take), the fused AdamW, and a few training steps against one process.\n"
      "Under a launcher each process is one worker of a single group. Exit status 0 when every\n"
      "check passes.\n\n"
      "Examples:\n"
      "  accelerant test                 with the config file's settings\n"
      "  accelerant test -n 4            4 processes\n"
      "  srun -n 2 accelerant test       the 2 tasks of a Slurm job as one group (also torchrun,\n"
      "                                  mpirun, accelerant launch)");
  auto file = std::make_shared<std::string>();
  auto processes = std::make_shared<std::optional<int>>();
  test->add_option("--config_file", *file, "The config file to test with");
  test->add_option(flag_names("world_size", "-n"), *processes,
                   "Processes (default: the config's, at least 2)");
  test->callback([&action, file, processes] {
    action = [file, processes] {
      if (read_launch_contract().launched()) return run_checks();  // a worker of the outer job
      LaunchFlags flags;
      flags.config_file = *file;
      flags.num_nodes = "1";  // a self-test of this machine
      flags.node_rank = 0;
      flags.master_port = 0;
      flags.world_size = processes->value_or(std::max(2, resolve_launch_config(flags).world_size));
      return run_launch(flags, {own_executable(), "test"});
    };
  });
}

}  // namespace accelerant::cli
