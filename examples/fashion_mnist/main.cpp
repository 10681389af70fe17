// Fashion-MNIST on several processes with accelerant::launch and explicit collectives.
//
// The data set and the model are built once, before launch: the forked workers share them
// copy-on-write and start from identical weights, so no broadcast is needed. Each step, every
// worker averages its gradients with one all_reduce. (The Accelerator will do this for you,
// overlapped with backward; this example shows the layer underneath.)
//
//   fashion_mnist --num_processes 2 --epochs 1
#include <accelerant/accelerant.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>

#include "idx_reader.h"

namespace {

struct NetImpl : torch::nn::Module {
  NetImpl()
      : conv1(register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 8, 5)))),
        conv2(register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(8, 16, 5)))),
        fc1(register_module("fc1", torch::nn::Linear(16 * 4 * 4, 64))),
        fc2(register_module("fc2", torch::nn::Linear(64, 10))) {}

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
  int num_processes = 2;
  int epochs = 1;
  int64_t batch_size = 64;
  double lr = 2e-3;
  uint64_t seed = 42;
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
};

// Averages every gradient across ranks with a single all_reduce of one flat buffer.
void average_gradients(Net& model, accelerant::Communicator& comm) {
  std::vector<torch::Tensor> grads;
  for (auto& p : model->parameters()) grads.push_back(p.grad().view(-1));
  auto flat = torch::cat(grads);
  comm.all_reduce_(flat, accelerant::ReduceOp::kMean);
  int64_t offset = 0;
  for (auto& p : model->parameters()) {
    p.grad().view(-1).copy_(flat.narrow(0, offset, p.numel()));
    offset += p.numel();
  }
}

double evaluate(Net& model, const fashion_mnist::Split& test, accelerant::ProcessState& state) {
  torch::NoGradGuard no_grad;
  model->eval();
  // Strided shards: every test image is scored by exactly one rank.
  auto images = test.images.slice(0, state.process_index(), test.images.size(0), state.num_processes());
  auto labels = test.labels.slice(0, state.process_index(), test.labels.size(0), state.num_processes());
  int64_t correct = 0;
  for (int64_t i = 0; i < images.size(0); i += 1000) {
    auto logits = model->forward(images.narrow(0, i, std::min<int64_t>(1000, images.size(0) - i)));
    correct += logits.argmax(1).eq(labels.narrow(0, i, logits.size(0))).sum().item<int64_t>();
  }
  auto totals = state.communicator().all_reduce(
      torch::tensor({correct, images.size(0)}, torch::kLong), accelerant::ReduceOp::kSum);
  model->train();
  return 100.0 * totals[0].item<int64_t>() / totals[1].item<int64_t>();
}

double train(int index, Net& model, const fashion_mnist::Split& data,
             const fashion_mnist::Split& test, const Settings& s) {
  auto& state = accelerant::ProcessState::get();
  auto& comm = state.communicator();
  torch::optim::Adam optimizer(model->parameters(), torch::optim::AdamOptions(s.lr));
  // The same permutation on every rank (seed + epoch), full batches only, so that every rank
  // runs the same number of steps: each step is one all_reduce on all of them.
  const auto sharding =
      accelerant::ShardingOptions().batch_size(s.batch_size).shuffle(true).seed(s.seed).drop_last(true);
  double accuracy = 0;
  for (int epoch = 0; epoch < s.epochs; ++epoch) {
    const auto start = std::chrono::steady_clock::now();
    const auto shard = accelerant::shard_epoch(data.images.size(0), epoch, state.process_index(),
                                               state.num_processes(), sharding);
    const auto steps = static_cast<int64_t>(shard.batches.size());
    double loss_sum = 0;
    for (const auto& batch : shard.batches) {
      auto idx = torch::tensor(batch, torch::kLong);
      auto loss = torch::nn::functional::cross_entropy(model->forward(data.images.index_select(0, idx)),
                                                       data.labels.index_select(0, idx));
      optimizer.zero_grad();
      loss.backward();
      average_gradients(model, comm);
      optimizer.step();
      loss_sum += loss.item<double>();
    }
    auto mean_loss = comm.all_reduce(torch::tensor({loss_sum / steps}), accelerant::ReduceOp::kMean);
    accuracy = evaluate(model, test, state);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (state.is_main_process()) {
      std::printf("epoch %d/%d  train loss %.4f  test accuracy %.2f%%  (%.1f s, %d process%s)\n",
                  epoch + 1, s.epochs, mean_loss.item<double>(), accuracy, seconds,
                  state.num_processes(), state.num_processes() == 1 ? "" : "es");
    }
  }
  return accuracy;
}

}  // namespace

int main(int argc, char** argv) {
  Settings s;
  CLI::App app{"Train a small CNN on Fashion-MNIST on several CPU processes with accelerant::launch.\n\n"
               "Examples:\n"
               "  fashion_mnist                          2 processes, 1 epoch\n"
               "  fashion_mnist -n 4 --epochs 3          4 processes, 3 epochs"};
  app.add_option("-n,--num_processes", s.num_processes, "Worker processes")->capture_default_str();
  app.add_option("--epochs", s.epochs, "Passes over the training set")->capture_default_str();
  app.add_option("--batch_size", s.batch_size, "Samples per step on each process")->capture_default_str();
  app.add_option("--lr", s.lr, "Adam learning rate")->capture_default_str();
  app.add_option("--seed", s.seed, "Seed of the weights and the shuffling")->capture_default_str();
  app.add_option("--data_dir", s.data_dir, "Directory of the *-idx*-ubyte.gz files")->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  try {
    // Single-threaded here so that the forked workers inherit no thread pool (docs/launching.md).
    torch::set_num_threads(1);
    torch::manual_seed(s.seed);
    const auto data = fashion_mnist::load_split(s.data_dir, "train");
    const auto test = fashion_mnist::load_split(s.data_dir, "t10k");
    Net model;  // built once; every worker starts from these weights
    auto accuracies = accelerant::launch(train, std::ref(model), std::cref(data), std::cref(test),
                                         std::cref(s), accelerant::LaunchOptions().num_processes(s.num_processes));
    std::printf("Fashion-MNIST test accuracy: %.2f%% after %d epoch%s on %d processes\n",
                accuracies.front(), s.epochs, s.epochs == 1 ? "" : "s", s.num_processes);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fashion_mnist: %s\n", e.what());
    return 1;
  }
}
