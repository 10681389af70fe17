// Weight-decay groups: split_weight_decay's rules (dimensions, norms, embeddings, name suffixes),
// frozen parameters left out and a tied weight counted once; weight_decay_groups' two groups; and
// on two processes the groups train alike under ZeRO stages 0, 1 and 2 and the fused AdamW, while
// the undecayed parameters really are undecayed (decaying everything trains otherwise).
#include <accelerant/accelerant.h>
#include <accelerant/weight_decay.h>
#include <gtest/gtest.h>

#include <cmath>

#include "test_support.h"

using namespace accelerant;
using accelerant::testing::flat_parameters;

namespace {

// Every kind of parameter the rules tell apart: a 2-D parameter of its own (pos_emb), an
// embedding, a linear layer with bias, a LayerNorm over [2, 4] (so its gain and bias are 2-D and
// only exclude_norms leaves them out), an output head that is the embedding's matrix (with
// `register_tied`, registered a second time as head.weight) and a frozen linear layer. The
// trainings on two processes read the embedding's matrix in forward instead, as examples/gpt
// does: under ZeRO stage 2 the gradient reducer keeps a parameter registered under two names in
// two slots and trains it wrongly, an issue of the reducer, not of the groups.
struct Net : torch::nn::Module {
  torch::Tensor pos_emb;
  torch::nn::Embedding emb{nullptr};
  torch::nn::Linear fc{nullptr}, frozen{nullptr};
  torch::nn::LayerNorm ln{nullptr};
  std::shared_ptr<torch::nn::Module> head;

  explicit Net(bool register_tied) {
    pos_emb = register_parameter("pos_emb", torch::randn({4, 8}) * 0.1);
    emb = register_module("emb", torch::nn::Embedding(10, 8));
    fc = register_module("fc", torch::nn::Linear(8, 8));
    ln = register_module("ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({2, 4})));
    head = register_module("head", std::make_shared<torch::nn::Module>());
    if (register_tied) head->register_parameter("weight", emb->weight);  // a second name
    frozen = register_module("frozen", torch::nn::Linear(8, 8));
    for (auto& p : frozen->parameters()) p.set_requires_grad(false);
  }

  // tokens [B, 4] -> logits [B, 4, 10]
  torch::Tensor forward(const torch::Tensor& tokens) {
    auto x = emb->forward(tokens) + pos_emb;
    x = torch::tanh(fc->forward(x)) + frozen->forward(x);
    x = ln->forward(x.reshape({-1, 4, 2, 4})).reshape({-1, 4, 8});
    return torch::matmul(x, emb->weight.t());
  }
};

std::shared_ptr<Net> make_net(bool register_tied = true) {
  torch::manual_seed(5);
  return std::make_shared<Net>(register_tied);
}

using Names = std::vector<std::string>;

}  // namespace

TEST(WeightDecaySplit, DefaultsDecayMatricesNotBiasesOrNormsAndCountATiedWeightOnce) {
  auto net = make_net();
  const auto split = split_weight_decay(*net);
  EXPECT_EQ(split.decay_names, (Names{"pos_emb", "emb.weight", "fc.weight"}));
  EXPECT_EQ(split.no_decay_names, (Names{"fc.bias", "ln.weight", "ln.bias"}));
  // The tensors are the module's own, in the same order as the names.
  ASSERT_EQ(split.decay.size(), 3u);
  ASSERT_EQ(split.no_decay.size(), 3u);
  EXPECT_TRUE(split.decay[1].is_same(net->emb->weight));
  EXPECT_TRUE(split.no_decay[0].is_same(net->fc->bias));
  // Of the 9 names, the tied head's second name and the frozen layer's are in neither list.
  EXPECT_EQ(net->named_parameters().size(), 9u);
}

TEST(WeightDecaySplit, EachRuleMovesWhatItNames) {
  auto net = make_net();
  // Norms decayed once their rule is off: their parameters are 2-D here.
  auto split = split_weight_decay(*net, WeightDecayOptions().exclude_norms(false));
  EXPECT_EQ(split.decay_names,
            (Names{"pos_emb", "emb.weight", "fc.weight", "ln.weight", "ln.bias"}));
  EXPECT_EQ(split.no_decay_names, (Names{"fc.bias"}));
  // Embeddings: the tied weight goes with its embedding, under its first name.
  split = split_weight_decay(*net, WeightDecayOptions().exclude_embeddings(true));
  EXPECT_EQ(split.decay_names, (Names{"pos_emb", "fc.weight"}));
  EXPECT_EQ(split.no_decay_names, (Names{"emb.weight", "fc.bias", "ln.weight", "ln.bias"}));
  // Name suffixes match the full name's end only.
  split =
      split_weight_decay(*net, WeightDecayOptions().exclude_name_suffixes({"pos_emb", "c.weight"}));
  EXPECT_EQ(split.decay_names, (Names{"emb.weight"}));
  // min_dim 0 and no norm rule: everything trainable decays; min_dim 3: nothing does.
  split = split_weight_decay(*net, WeightDecayOptions().min_dim(0).exclude_norms(false));
  EXPECT_EQ(split.decay.size(), 6u);
  EXPECT_TRUE(split.no_decay.empty());
  split = split_weight_decay(*net, WeightDecayOptions().min_dim(3));
  EXPECT_TRUE(split.decay.empty());
  EXPECT_EQ(split.no_decay.size(), 6u);
}

TEST(WeightDecayGroups, DecayGroupFirstThenAZeroDecayCopyAndNoEmptyGroup) {
  auto net = make_net();
  const auto options = torch::optim::AdamWOptions(3e-4).betas({0.9, 0.95}).weight_decay(0.1);
  auto groups = weight_decay_groups(*net, options);
  ASSERT_EQ(groups.size(), 2u);
  const auto split = split_weight_decay(*net);
  for (size_t g = 0; g < 2; ++g) {
    const auto& expected = g == 0 ? split.decay : split.no_decay;
    ASSERT_EQ(groups[g].params().size(), expected.size());
    for (size_t i = 0; i < expected.size(); ++i)
      EXPECT_TRUE(groups[g].params()[i].is_same(expected[i]));
    const auto& o = static_cast<const torch::optim::AdamWOptions&>(groups[g].options());
    EXPECT_DOUBLE_EQ(o.weight_decay(), g == 0 ? 0.1 : 0.0) << "group " << g;
    EXPECT_DOUBLE_EQ(o.lr(), 3e-4);
    EXPECT_DOUBLE_EQ(std::get<1>(o.betas()), 0.95);
  }
  EXPECT_DOUBLE_EQ(options.weight_decay(), 0.1) << "the caller's options were changed";
  // Nothing to decay: only the zero-decay group; and an optimizer accepts the groups as they are.
  groups = weight_decay_groups(*net, torch::optim::SGDOptions(0.1).weight_decay(0.5),
                               WeightDecayOptions().min_dim(3));
  ASSERT_EQ(groups.size(), 1u);
  EXPECT_DOUBLE_EQ(static_cast<torch::optim::SGDOptions&>(groups[0].options()).weight_decay(), 0.0);
  torch::optim::SGD sgd(groups, torch::optim::SGDOptions(0.1));
  EXPECT_EQ(sgd.param_groups().size(), 1u);
}

namespace {

struct TrainingRun {
  int stage = 0;
  bool fused = false;
  bool decay_everything = false;  // one group of every trainable parameter, decayed
  bool zero_loss = false;         // a loss whose gradients are all 0: only the decay moves weights
};

constexpr int kSteps = 10;
constexpr double kAdamLr = 1e-2, kDecay = 0.1;

// Trains for kSteps on the process's half of a fixed global batch; returns the parameters.
torch::Tensor train(int rank, const TrainingRun& run) {
  Accelerator acc(AcceleratorOptions()
                      .cpu(true)
                      .zero_stage(run.stage)
                      .fused_optimizers(run.fused || run.stage > 0)
                      .bucket_cap_mb(1));
  auto net = make_net(false);
  const auto options = torch::optim::AdamWOptions(kAdamLr).weight_decay(kDecay);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  if (run.decay_everything) {
    auto split = split_weight_decay(*net);
    auto all = split.decay;
    all.insert(all.end(), split.no_decay.begin(), split.no_decay.end());
    groups.emplace_back(all, std::make_unique<torch::optim::AdamWOptions>(options));
  } else {
    groups = weight_decay_groups(*net, options);
  }
  torch::optim::AdamW adamw(groups, options);
  auto [m, opt] = acc.prepare(net, adamw);
  for (int step = 0; step < kSteps; ++step) {
    torch::manual_seed(100 + step);
    auto tokens = torch::randint(0, 10, {8, 4}).narrow(0, rank * 4, 4);
    auto targets = torch::randint(0, 10, {8, 4}).narrow(0, rank * 4, 4);
    auto loss = torch::nn::functional::cross_entropy(m->forward(tokens).reshape({-1, 10}),
                                                     targets.reshape({-1}));
    acc.backward(run.zero_loss ? loss * 0.0 : loss);
    opt.step();
    opt.zero_grad();
  }
  return flat_parameters(*m);
}

std::vector<torch::Tensor> train_on_two(const TrainingRun& run) {
  return launch([run](int rank) { return train(rank, run); },
                LaunchOptions()
                    .processes_per_node(2)
                    .collective_timeout(std::chrono::seconds(60))
                    .verbose(false));
}

// The offsets of the named parameters in flat_parameters' order.
std::vector<std::pair<int64_t, int64_t>> spans_of(const Names& names) {
  auto net = make_net(false);
  std::vector<std::pair<int64_t, int64_t>> spans;
  for (const auto& name : names) {
    int64_t offset = 0;
    for (const auto& item : net->named_parameters()) {
      if (item.key() == name) spans.emplace_back(offset, item.value().numel());
      offset += item.value().numel();
    }
  }
  return spans;
}

}  // namespace

// The sharded update reads each group's own options; a stage or the fused update that applied one
// group's weight_decay to all would train otherwise.
TEST(WeightDecayGroups, ZeroStages1And2AndTheFusedAdamWTrainAsStage0OnTwoProcesses) {
  const auto base = train_on_two(TrainingRun{});
  const auto start = flat_parameters(*make_net(false));
  ASSERT_GT((base[0] - start).abs().max().item<double>(), 1e-3) << "nothing trained";
  for (const TrainingRun& run :
       {TrainingRun{0, true}, TrainingRun{1, true}, TrainingRun{2, true}}) {
    const auto results = train_on_two(run);
    for (int r = 0; r < 2; ++r) {
      const double worst = (results[r] - base[0]).abs().max().item<double>();
      EXPECT_LT(worst, 1e-5) << "stage " << run.stage << ", rank " << r;
    }
  }
}

// With gradients of 0 AdamW's update is the decoupled decay alone, p *= 1 - lr * weight_decay per
// step: the decay group shrinks by exactly that, the no-decay group does not move, under stage 2.
TEST(WeightDecayGroups, UnderZeroStage2OnlyTheDecayGroupDecays) {
  const auto start = flat_parameters(*make_net(false));
  const auto after = train_on_two(TrainingRun{2, true, false, true})[0];
  const double shrink = std::pow(1.0 - kAdamLr * kDecay, kSteps);
  const auto split = split_weight_decay(*make_net(false));
  for (const auto& [offset, n] : spans_of(split.decay_names)) {
    EXPECT_TRUE(torch::allclose(after.narrow(0, offset, n), start.narrow(0, offset, n) * shrink,
                                1e-5, 1e-7));
  }
  for (const auto& [offset, n] : spans_of(split.no_decay_names))
    EXPECT_TRUE(torch::equal(after.narrow(0, offset, n), start.narrow(0, offset, n)));
}

// Without the groups (one decayed group of everything) the biases and norm parameters end
// elsewhere than with them: the groups are what keeps them undecayed.
TEST(WeightDecayGroups, DecayingEverythingTrainsTheOneDimensionalParametersOtherwise) {
  const auto grouped = train_on_two(TrainingRun{})[0];
  const auto everything = train_on_two(TrainingRun{0, false, true})[0];
  for (const auto& [offset, n] : spans_of({"fc.bias", "ln.weight", "ln.bias"})) {
    const double difference =
        (grouped.narrow(0, offset, n) - everything.narrow(0, offset, n)).abs().max().item<double>();
    EXPECT_GT(difference, 1e-6) << "offset " << offset;
  }
}
