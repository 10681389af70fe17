// A user's first program: a linear model trained by 2 forked processes. Exits 0 when both ranks
// learned the same weights and the loss fell, so that the consumer tests can fail.
#include <accelerant/accelerant.h>
#include <torch/torch.h>

#include <cstdio>

int main() {
  auto losses = accelerant::launch(
      [] {
        accelerant::Accelerator accelerator;
        torch::manual_seed(0);  // the same data and initial weights on both ranks
        auto x = torch::randn({256, 4});
        auto y = x.matmul(torch::tensor({1.0f, -2.0f, 3.0f, 0.5f})).unsqueeze(1);
        auto model = torch::nn::Linear(4, 1);
        torch::optim::SGD optimizer(model->parameters(), 0.1);
        auto loader =
            accelerant::make_data_loader(x, y, accelerant::DataLoaderOptions().batch_size(32));
        auto [m, o, l] = accelerator.prepare(model, optimizer, loader);
        torch::Tensor loss;
        for (int epoch = 0; epoch < 30; ++epoch) {
          for (auto& batch : l) {
            loss = torch::mse_loss(m->forward(batch.data), batch.target);
            accelerator.backward(loss);
            o.step();
            o.zero_grad();
          }
        }
        // Ranks must agree on the weights: their sum across ranks is twice rank 0's.
        auto w = m->weight.detach().flatten();
        auto total = accelerator.reduce(w.clone());
        const bool same = torch::allclose(total, 2 * w);
        return same ? loss.item<double>() : -1.0;
      },
      accelerant::LaunchOptions().processes_per_node(2).verbose(false));
  for (double loss : losses) {
    if (loss < 0 || loss > 1e-3) {
      std::printf("consumer: FAILED (final losses %g, %g; -1 means the ranks' weights differ)\n",
                  losses[0], losses[1]);
      return 1;
    }
  }
  std::printf("consumer: 2 processes trained, final loss %.2e on both\n", losses[0]);
  return 0;
}
