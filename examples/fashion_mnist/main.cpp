// Fashion-MNIST with the Accelerator: a plain LibTorch loop plus prepare, backward and
// gather_for_metrics, on one process or several.
//
//   fashion_mnist                                  2 processes (forked), 2 epochs
//   fashion_mnist -n 1 --mixed_precision bf16      one process, bf16 autocast
//   fashion_mnist --project_dir runs/a --checkpoint_every 200
//                                                  checkpoints; a restarted run resumes by itself
//
// The data are read once, before the workers are forked, so that they share the tensors
// copy-on-write. Under a launcher (accelerant launch, torchrun, srun, mpirun: the environment
// says so) the program trains directly in the process it was started as.
#include <accelerant/accelerant.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>
#include <torch/utils.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "idx_reader.h"

namespace {

struct NetImpl : torch::nn::Module {
  NetImpl()
      : conv1(register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 16, 5)))),
        conv2(register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(16, 32, 5)))),
        fc1(register_module("fc1", torch::nn::Linear(32 * 4 * 4, 128))),
        fc2(register_module("fc2", torch::nn::Linear(128, 10))) {}

  torch::Tensor forward(torch::Tensor x) {
    x = torch::max_pool2d(torch::relu(conv1(x)), 2);
    x = torch::max_pool2d(torch::relu(conv2(x)), 2);
    return fc2(torch::relu(fc1(x.flatten(1))));
  }

  torch::nn::Conv2d conv1, conv2;
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(Net);

struct Settings {
  int world_size = 2;
  int epochs = 2;
  int64_t batch_size = 64;
  double lr = 2e-3;
  uint64_t seed = 42;
  int num_workers = 1;
  std::string mixed_precision = "no";
  int zero_stage = 0;  // ZeRO: 1 shards Adam's state, 2 also reduce-scatters the gradients
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  int64_t train_samples = 0;          // 0: all 60000
  std::string project_dir;            // checkpoints and auto-resume when set
  int64_t checkpoint_every = 0;       // optimizer steps; 0: at the end of each epoch
  int checkpoint_total_limit = 3;     // checkpoints kept
  std::string save_weights;           // safetensors of the final model
  std::vector<std::string> log_with;  // trackers: tensorboard, csv, jsonl
};

// Percentage of test images classified correctly, counted over exactly the test set:
// gather_for_metrics drops the samples that even_batches repeated on the last step.
double evaluate(accelerant::Accelerator& acc, Net& model, accelerant::DataLoader& test) {
  torch::NoGradGuard no_grad;
  model->eval();
  int64_t correct = 0, seen = 0;
  for (auto& batch : test) {
    torch::Tensor predicted;
    {
      auto autocast = acc.autocast();
      predicted = model->forward(batch.data).argmax(1);
    }
    auto hits = acc.gather_for_metrics(predicted == batch.target);
    correct += hits.sum().item<int64_t>();
    seen += hits.size(0);
  }
  model->train();
  return 100.0 * static_cast<double>(correct) / static_cast<double>(seen);
}

double train(const fashion_mnist::Split& train_split, const fashion_mnist::Split& test_split,
             const Settings& s) {
  // With a project_dir, a run started again (by hand, or by a launcher's max_restarts) resumes
  // from the newest complete checkpoint mid-epoch and ends as the uninterrupted run would have.
  accelerant::Accelerator acc(accelerant::AcceleratorOptions()
                                  .mixed_precision(accelerant::parse_mixed_precision(
                                      s.mixed_precision, "--mixed_precision"))
                                  .zero_stage(s.zero_stage)
                                  .seed(s.seed)
                                  .project_dir(s.project_dir)
                                  .checkpoint_total_limit(s.checkpoint_total_limit)
                                  .auto_resume(!s.project_dir.empty())
                                  .log_with(s.log_with));
  Net model;  // seeded by the Accelerator; prepare broadcasts rank 0's weights anyway
  torch::optim::Adam optimizer(model->parameters(), torch::optim::AdamOptions(s.lr));
  const int64_t n = s.train_samples > 0 ? std::min(s.train_samples, train_split.images.size(0))
                                        : train_split.images.size(0);
  auto train_loader = accelerant::make_data_loader(train_split.images.narrow(0, 0, n),
                                                   train_split.labels.narrow(0, 0, n),
                                                   accelerant::DataLoaderOptions()
                                                       .batch_size(s.batch_size)
                                                       .shuffle(true)
                                                       .num_workers(s.num_workers));
  auto test_loader = accelerant::make_data_loader(test_split.images, test_split.labels,
                                                  accelerant::DataLoaderOptions().batch_size(500));
  auto [net, opt, train_batches, test_batches] =
      acc.prepare(model, optimizer, train_loader, test_loader);
  // The loop below reads the epoch before its first batch: resume now rather than at that batch.
  acc.auto_resume_now();
  // Trackers write under <project_dir>/fashion_mnist/ from the main process only.
  if (!s.log_with.empty()) {
    acc.init_trackers("fashion_mnist", {{"lr", s.lr},
                                        {"batch_size", s.batch_size},
                                        {"epochs", s.epochs},
                                        {"world_size", acc.world_size()},
                                        {"mixed_precision", s.mixed_precision},
                                        {"zero_stage", s.zero_stage}});
  }
  acc.print("Training on ", acc.world_size(), " process", acc.world_size() == 1 ? "" : "es", " x ",
            acc.threads(), " thread", acc.threads() == 1 ? "" : "s", ", mixed precision ",
            accelerant::to_string(acc.mixed_precision()), ", ", train_batches.size(),
            " steps per epoch");
  // A run whose checkpoint has finished every epoch trains no more; its model is still evaluated
  // below, so that the summary reports it rather than an accuracy never measured.
  double accuracy = 0;
  if (train_batches.epoch() >= s.epochs) {
    acc.print("Already trained for ", train_batches.epoch(), " epoch(s) (the checkpoint in ",
              s.project_dir, "); evaluating it. Give a larger --epochs to train on.");
    accuracy = evaluate(acc, net, test_batches);
  }
  // The loader knows the epoch: after a resume the loop continues where the checkpoint was.
  while (train_batches.epoch() < s.epochs) {
    const int64_t epoch = train_batches.epoch() + 1;
    // After a resume the epoch continues mid-way, and so does its bar.
    int64_t step = std::min(train_batches.size(), train_batches.position().samples_done /
                                                      train_batches.samples_per_step());
    // On a terminal one redrawn line, in a log a line every 10%; only the main process draws.
    accelerant::ProgressBar progress(
        accelerant::ProgressBarOptions()
            .total(train_batches.size())
            .initial(step)
            .label("epoch " + std::to_string(epoch) + "/" + std::to_string(s.epochs))
            .enabled(acc.is_main_process()));
    for (auto& batch : train_batches) {
      torch::Tensor loss;
      {
        auto autocast = acc.autocast();
        loss = torch::nn::functional::cross_entropy(net->forward(batch.data), batch.target);
      }
      acc.backward(loss);
      opt.step();
      opt.zero_grad();
      const double loss_value = loss.item<double>();
      char postfix[32];
      std::snprintf(postfix, sizeof postfix, "loss %.4f", loss_value);
      progress.update(++step, postfix);
      const int64_t steps_done = acc.state()->optimizer_steps;
      if (!s.log_with.empty()) acc.log({{"train/loss", loss_value}}, steps_done);
      // sync_gradients(): once per optimizer step, also under gradient accumulation.
      if (!s.project_dir.empty() && s.checkpoint_every > 0 && acc.sync_gradients() &&
          steps_done % s.checkpoint_every == 0) {
        acc.save_state();
      }
    }
    progress.close();  // ends the bar's line before the epoch's result is printed
    if (!s.project_dir.empty() && s.checkpoint_every == 0) acc.save_state();
    accuracy = evaluate(acc, net, test_batches);
    acc.print("epoch ", epoch, "/", s.epochs, ": test accuracy ", accuracy, "%");
    if (!s.log_with.empty()) {
      acc.log({{"eval/accuracy", accuracy}, {"epoch", static_cast<double>(epoch)}},
              acc.state()->optimizer_steps);
    }
  }
  if (!s.save_weights.empty()) acc.save_model(net, s.save_weights);
  acc.end_training();
  return accuracy;
}

}  // namespace

int main(int argc, char** argv) {
  Settings s;
  CLI::App app{
      "Train a small CNN on Fashion-MNIST with accelerant::Accelerator, on one process or "
      "several.\n\n"
      "Examples:\n"
      "  fashion_mnist                               2 processes, 2 epochs\n"
      "  fashion_mnist -n 4 --epochs 3               4 processes, 3 epochs\n"
      "  fashion_mnist -n 1 --mixed_precision bf16   one process, bf16 autocast\n"
      "  fashion_mnist --zero_stage 2                Adam's state sharded across the 2 processes\n"
      "  accelerant launch -n 2 fashion_mnist        under the launcher (also torchrun, srun)\n"
      "  accelerant launch -n 2 --max_restarts 2 fashion_mnist --project_dir runs/a "
      "--checkpoint_every 200\n"
      "                                              a killed worker restarts the group, which "
      "resumes\n"
      "                                              from the newest checkpoint"};
  app.add_option(accelerant::flag_names("world_size", "-n"), s.world_size,
                 "Processes to fork on this machine, the world size (ignored under a launcher)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--epochs", s.epochs, "Passes over the training set")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--batch_size", s.batch_size, "Samples per step on each process")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--lr", s.lr, "Adam learning rate")->capture_default_str();
  app.add_option("--seed", s.seed, "Seed of the weights and the shuffling")->capture_default_str();
  app.add_option("--num_workers", s.num_workers, "Loader threads per process")
      ->capture_default_str();
  app.add_option("--mixed_precision", s.mixed_precision, "no or bf16 (fp16 needs CUDA)")
      ->capture_default_str()
      ->check([](const std::string& text) {  // the library's one parser says what it takes
        try {
          accelerant::parse_mixed_precision(text, "--mixed_precision");
          return std::string();
        } catch (const accelerant::Error& e) {
          return std::string(e.what());
        }
      });
  app.add_option("--zero_stage", s.zero_stage,
                 "ZeRO: 0 off, 1 shards the optimizer state across the processes, 2 also "
                 "reduce-scatters the gradients (docs/zero.md)")
      ->capture_default_str()
      ->check(CLI::Range(0, 2));
  app.add_option("--data_dir", s.data_dir, "Directory of the *-idx*-ubyte.gz files")
      ->capture_default_str();
  app.add_option("--train_samples", s.train_samples,
                 "Train on the first N images only (0: all 60000)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option(
      "--project_dir", s.project_dir,
      "Save checkpoints under DIR/checkpoints, and resume from the newest one when started again");
  app.add_option("--checkpoint_every", s.checkpoint_every,
                 "Checkpoint every N steps (0: at the end of each epoch)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--checkpoint_total_limit", s.checkpoint_total_limit,
                 "Checkpoints kept (the oldest are removed)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--save_weights", s.save_weights, "Write the final model as safetensors into DIR");
  app.add_option("--log_with", s.log_with,
                 "Trackers, comma-separated: tensorboard, csv, jsonl (files under "
                 "PROJECT_DIR/fashion_mnist, or ./fashion_mnist without --project_dir)")
      ->delimiter(',')
      ->check(CLI::IsMember({"tensorboard", "csv", "jsonl"}));
  CLI11_PARSE(app, argc, argv);

  try {
    // Under a launcher (accelerant launch, torchrun, srun, mpirun) launch runs `train` here as
    // this process's rank; otherwise it forks the workers, and the data is read single-threaded.
    const auto options = accelerant::LaunchOptions().processes_per_node(s.world_size);
    const auto plan = accelerant::prepare_launch(options);
    const auto train_split = fashion_mnist::load_split(s.data_dir, "train");
    const auto test_split = fashion_mnist::load_split(s.data_dir, "t10k");
    const double accuracy = accelerant::launch(train, std::cref(train_split), std::cref(test_split),
                                               std::cref(s), options)
                                .front();
    if (!plan.is_main_process) return 0;  // one summary line for the whole job
    std::printf("Fashion-MNIST test accuracy: %.2f%% after %d epoch%s on %d process%s\n", accuracy,
                s.epochs, s.epochs == 1 ? "" : "s", plan.world_size,
                plan.world_size == 1 ? "" : "es");
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fashion_mnist: %s\n", e.what());
    return 1;
  }
}
