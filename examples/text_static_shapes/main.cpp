// Static shapes in graph mode: a small transformer text classifier trained on generated
// variable-length sequences, three times, with three ways of collating a batch:
//
//   dynamic     pad to the batch's longest sequence: a new shape almost every batch
//   buckets     pad to the smallest of a few bucket lengths: at most that many shapes
//   max_length  pad everything to the longest possible sequence: one shape, the most padding
//
// Batches come from an accelerant::DataLoader over samples of named tensors ("ids" of their own
// length, "label"), whose collate (accelerant/collate.h) pads "ids" and adds "mask" and "lengths":
// the step takes three tensors, ids, mask and labels. Each run goes through an
// accelerant::GraphStep, which counts the distinct input signatures (captures; every one after the
// first is a recompile) and times the steps. On a GPU each recompile is a CUDA graph capture; on
// the CPU the same program runs eagerly with the same accounting, so what the table shows is what
// the GPU would see. Run with ACCELERANT_METRICS=1 for the full report at exit.
//
//   text_static_shapes [--steps 60] [--batch 8] [--max_length 128] [--buckets 4]
#include <accelerant/accelerant.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <functional>
#include <optional>
#include <random>
#include <vector>

namespace nn = torch::nn;

namespace {

constexpr int64_t kVocab = 64;
constexpr int64_t kWidth = 32;

// Lengths 8 + an exponential tail (mean max_length / 5), capped at max_length. Label 1 when more
// than half of a sequence's tokens come from the lower half of the vocabulary: the model has to
// look at every real position and ignore the padding.
struct Example {
  torch::Tensor tokens;
  int64_t label = 0;
};

std::vector<Example> make_data(int64_t count, int64_t max_length, uint64_t seed) {
  std::mt19937_64 rng(seed);
  // Most sequences short, a few long, as in real text: lengths 8 + an exponential tail, capped.
  std::exponential_distribution<double> tail(5.0 / static_cast<double>(max_length));
  std::uniform_int_distribution<int64_t> token(1, kVocab - 1);  // 0 is padding
  std::bernoulli_distribution lower_heavy(0.5);
  std::vector<Example> out;
  for (int64_t i = 0; i < count; ++i) {
    const int64_t n = std::min<int64_t>(max_length, 8 + static_cast<int64_t>(tail(rng)));
    const bool heavy = lower_heavy(rng);
    std::vector<int64_t> ids;
    int64_t lower = 0;
    for (int64_t k = 0; k < n; ++k) {
      int64_t id = token(rng);
      if (heavy && id >= kVocab / 2 && k % 3 != 0) id -= kVocab / 2;  // skew towards the lower half
      lower += id < kVocab / 2;
      ids.push_back(id);
    }
    out.push_back({torch::tensor(ids, torch::kLong), 2 * lower > n ? 1 : 0});
  }
  return out;
}

struct ClassifierImpl : nn::Module {
  nn::Embedding tokens{nullptr}, positions{nullptr};
  nn::TransformerEncoderLayer encoder{nullptr};
  nn::Linear head{nullptr};
  explicit ClassifierImpl(int64_t max_length) {
    tokens = register_module("tokens", nn::Embedding(kVocab, kWidth));
    positions = register_module("positions", nn::Embedding(max_length, kWidth));
    encoder = register_module(
        "encoder",
        nn::TransformerEncoderLayer(
            nn::TransformerEncoderLayerOptions(kWidth, 4).dim_feedforward(64).dropout(0.0)));
    head = register_module("head", nn::Linear(kWidth, 2));
  }
  // values, mask: [batch, length]; mask true at real tokens.
  torch::Tensor forward(const torch::Tensor& values, const torch::Tensor& mask) {
    const int64_t length = values.size(1);
    auto x = tokens->forward(values) + positions->forward(torch::arange(length)).unsqueeze(0);
    // LibTorch 1.13's encoder layer takes [length, batch, width] and a key padding mask that is
    // true at padding.
    x = encoder->forward(x.transpose(0, 1), {}, mask.logical_not()).transpose(0, 1);
    const auto weights = mask.unsqueeze(-1).to(x.scalar_type());
    const auto pooled = (x * weights).sum(1) / weights.sum(1).clamp_min(1);
    return head->forward(pooled);
  }
};
TORCH_MODULE(Classifier);

// The data set as the DataLoader sees it: sample i is a Batch of named tensors, "ids" (its tokens,
// of its own length) and "label". A padding collate turns a batch of them into "ids" [batch,
// length], "label" [batch], "mask" and "lengths".
struct Texts {
  const std::vector<Example>* examples;
  accelerant::Batch get(size_t i) const {
    const Example& e = (*examples)[i];
    return accelerant::Batch().set("ids", e.tokens).set("label", torch::tensor(e.label));
  }
  std::optional<size_t> size() const { return examples->size(); }
};

struct Outcome {
  int64_t signatures = 0;
  double step_ms_median = 0;
  double padding_share = 0;  // padded positions / all positions
  double accuracy = 0;
};

Outcome train(const std::string& name, const accelerant::Collate& collate,
              const std::vector<Example>& train_set, const std::vector<Example>& test_set,
              int64_t batch, int64_t max_length) {
  // Fused optimizers: the update a GPU can capture (its step sizes and lr live on the device).
  accelerant::Accelerator accelerator(accelerant::AcceleratorOptions().fused_optimizers(true));
  torch::manual_seed(0);
  Classifier model(max_length);
  torch::optim::AdamW adamw(model->parameters(), torch::optim::AdamWOptions(3e-3));
  // drop_last: every batch has `batch` rows, so only the padded length varies.
  auto [net, optimizer, loader] = accelerator.prepare(
      model, adamw,
      accelerant::make_data_loader(
          Texts{&train_set}, accelerant::DataLoaderOptions().batch_size(batch).drop_last(true),
          collate));
  // compile: the whole step (forward, backward, optimizer) is one graph per input signature.
  accelerant::GraphStep step = accelerator.compile(
      [&, net = net, optimizer = optimizer](const accelerant::GraphStep::Inputs& in) mutable {
        auto loss = torch::nn::functional::cross_entropy(net->forward(in[0], in[1]), in[2]);
        accelerator.backward(loss);
        optimizer.step();
        optimizer.zero_grad();
        return accelerant::GraphStep::Outputs{loss.detach()};
      },
      accelerant::GraphStepOptions().name(name).recompile_warning_after(
          1000));  // the table says it

  int64_t real = 0, total = 0;
  std::vector<double> times;
  for (auto& b : loader) {
    real += b["lengths"].sum().item<int64_t>();
    total += b["ids"].numel();
    const auto t0 = std::chrono::steady_clock::now();
    auto loss = step({b["ids"], b["mask"], b["label"]})[0].clone();
    times.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    // Logging in a step closure, outside the step function (a CUDA graph replay would not run
    // code inside it): it runs when the next step ends, without stalling this one.
    const int64_t now = static_cast<int64_t>(times.size());
    if (now % 20 == 0) {
      accelerant::add_step_closure([&accelerator, name, now, loss] {
        accelerator.print(name, ": step ", now, " loss ", loss.item<float>());
      });
    }
  }
  accelerant::mark_step();  // the last step's closures
  Outcome out;
  out.signatures = step.signatures();
  std::nth_element(times.begin(), times.begin() + static_cast<std::ptrdiff_t>(times.size() / 2),
                   times.end());
  out.step_ms_median = times[times.size() / 2];
  out.padding_share = 1.0 - static_cast<double>(real) / static_cast<double>(total);
  torch::NoGradGuard no_grad;
  int64_t correct = 0;
  auto test_loader = accelerant::make_data_loader(Texts{&test_set}, {}, collate);
  for (auto& b : test_loader) {
    correct += net->forward(b["ids"], b["mask"]).argmax(1).item<int64_t>() ==
               b["label"][0].item<int64_t>();
  }
  out.accuracy = static_cast<double>(correct) / static_cast<double>(test_set.size());
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app(
      "Dynamic padding vs buckets vs max-length padding under graph mode (recompiles, step time)");
  int64_t steps = 60, batch = 8, max_length = 128;
  int buckets = 4;
  app.add_option("--steps", steps, "training steps per run")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--batch", batch, "sequences per batch")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--max_length", max_length, "longest generated sequence")
      ->check(CLI::Range(8, 4096))
      ->capture_default_str();
  app.add_option("--buckets", buckets, "bucket lengths for the bucketed run")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.footer("Example: ACCELERANT_METRICS=1 text_static_shapes --steps 100 --buckets 4");
  CLI11_PARSE(app, argc, argv);

  const auto train_set = make_data(steps * batch, max_length, 1);
  const auto test_set = make_data(200, max_length, 2);
  const auto lengths = accelerant::bucket_lengths(max_length, buckets);
  // The ready collates pad "ids" and add "mask" and "lengths" (accelerant/collate.h).
  const auto pad = accelerant::PaddingOptions().pad({"ids"});
  const std::vector<std::pair<std::string, accelerant::Collate>> runs = {
      {"dynamic", accelerant::collate::pad_to_longest(pad)},
      {"buckets", accelerant::collate::pad_to_bucket(lengths, pad)},
      {"max_length", accelerant::collate::pad_to_length(max_length, pad)},
  };
  std::vector<Outcome> outcomes;
  for (const auto& [name, collate] : runs)
    outcomes.push_back(train(name, collate, train_set, test_set, batch, max_length));

  std::printf("\n%zu steps of %lld sequences of 8..%lld tokens; buckets [",
              static_cast<size_t>(steps), static_cast<long long>(batch),
              static_cast<long long>(max_length));
  for (size_t i = 0; i < lengths.size(); ++i)
    std::printf("%s%lld", i ? ", " : "", static_cast<long long>(lengths[i]));
  std::printf(
      "]\n\n| padding | signatures (captures) | recompiles | step ms (median) | padded positions | "
      "test accuracy |\n");
  std::printf("|---|---:|---:|---:|---:|---:|\n");
  for (size_t i = 0; i < runs.size(); ++i) {
    const Outcome& o = outcomes[i];
    std::printf("| %s | %lld | %lld | %.2f | %.0f %% | %.1f %% |\n", runs[i].first.c_str(),
                static_cast<long long>(o.signatures), static_cast<long long>(o.signatures - 1),
                o.step_ms_median, 100 * o.padding_share, 100 * o.accuracy);
  }
  const bool bounded =
      outcomes[1].signatures <= static_cast<int64_t>(lengths.size()) && outcomes[2].signatures == 1;
  std::printf(
      "\nstatic shapes: buckets %s the recompiles (%lld signatures for %zu buckets; dynamic "
      "padding: %lld)\n",
      bounded ? "bounded" : "did NOT bound", static_cast<long long>(outcomes[1].signatures),
      lengths.size(), static_cast<long long>(outcomes[0].signatures));
  return bounded ? 0 : 1;
}
