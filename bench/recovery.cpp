// One worker of the recovery benchmark (issue 37), run under `accelerant launch` with either
// --recovery; bench/compare_recovery.py drives it beside its PyTorch twin under torchrun
// (bench/recovery_twin.py), which does the same work:
//   bench_recovery --steps S --kill_at K --checkpoint_every C --project DIR
// Trains an MLP (784-512-512-10, batch 64 per process, synthetic data) with AdamW for S steps,
// saving a checkpoint every C steps (auto_resume loads the newest after a restart). In the first
// generation rank 1 SIGKILLs itself between the forward and the backward of the step after K
// steps, printing "KILL <CLOCK_MONOTONIC seconds>" first; rank 0 prints "STEP <n> <seconds>"
// after each completed step (a step done again is printed again).
#include <accelerant/accelerant.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>

namespace {

double monotonic_seconds() {
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC, &now);
  return static_cast<double>(now.tv_sec) + static_cast<double>(now.tv_nsec) * 1e-9;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t steps = 30, kill_at = 12, checkpoint_every = 5;
  std::string project = "runs/bench_recovery";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--steps") {
      steps = std::atoll(argv[i + 1]);
    } else if (flag == "--kill_at") {
      kill_at = std::atoll(argv[i + 1]);
    } else if (flag == "--checkpoint_every") {
      checkpoint_every = std::atoll(argv[i + 1]);
    } else if (flag == "--project") {
      project = argv[i + 1];
    } else {
      std::fprintf(stderr, "bench_recovery: unknown flag %s (see the comment at its top)\n",
                   flag.c_str());
      return 2;
    }
  }
  using namespace accelerant;
  Accelerator acc(AcceleratorOptions().project_dir(project).auto_resume(true).seed(1));
  torch::manual_seed(0);
  torch::nn::Sequential model(torch::nn::Flatten(), torch::nn::Linear(784, 512), torch::nn::ReLU(),
                              torch::nn::Linear(512, 512), torch::nn::ReLU(),
                              torch::nn::Linear(512, 10));
  torch::optim::AdamW adamw(model->parameters(), torch::optim::AdamWOptions(1e-3));
  const int64_t samples = 64 * acc.world_size() * 16;
  auto x = torch::randn({samples, 1, 28, 28});
  auto y = torch::randint(0, 10, {samples}, torch::kLong);
  auto [m, opt, loader] =
      acc.prepare(model, adamw, make_data_loader(x, y, DataLoaderOptions().batch_size(64)));
  const bool first_generation = ProcessState::get().restart_count() == 0;
  while (acc.state()->optimizer_steps < steps) {
    for (auto& batch : loader) {
      auto loss = torch::nn::functional::cross_entropy(m->forward(batch.data), batch.target);
      if (first_generation && acc.rank() == 1 && acc.state()->optimizer_steps == kill_at) {
        std::printf("KILL %.6f\n", monotonic_seconds());
        std::fflush(stdout);
        std::raise(SIGKILL);
      }
      acc.backward(loss);
      const bool stepped = opt.step();
      opt.zero_grad();
      if (!stepped) continue;  // an abandoned step, done again with the next batch
      const int64_t done = acc.state()->optimizer_steps;
      if (acc.is_main_process()) {
        std::printf("STEP %lld %.6f\n", static_cast<long long>(done), monotonic_seconds());
        std::fflush(stdout);
      }
      if (done % checkpoint_every == 0) acc.save_state();
      if (done >= steps) break;
    }
  }
  acc.end_training();
  return 0;
}
