// Batches of any structure: named tensors in a Batch, the tensor-tree helpers (apply_to_tensors,
// send_to_device, for_each_tensor), the ready collates with exact values, masks and lengths, the
// stack error that names the fix, and on two forked ranks over loopback a three-tensor batch of
// variable-length samples that every epoch sees each sample exactly once and that
// gather_for_metrics returns as exactly the dataset.
#include <accelerant/accelerant.h>
#include <gtest/gtest.h>

#include <map>
#include <optional>
#include <tuple>

#include "test_support.h"

using namespace accelerant;
using accelerant::testing::contains;
using accelerant::testing::error_message;

namespace {

torch::Tensor longs(std::vector<int64_t> values) { return torch::tensor(values, torch::kLong); }

LaunchOptions ranks(int n) {
  return LaunchOptions()
      .processes_per_node(n)
      .collective_timeout(std::chrono::seconds(60))
      .verbose(false);
}

// Sample i: "ids" = i*100 + 0 .. len(i)-1 (1 to 5 tokens), "label" = i.
int64_t length_of(int64_t i) { return 1 + (i * 7) % 5; }
torch::Tensor ids_of(int64_t i) { return torch::arange(length_of(i), torch::kLong) + i * 100; }

struct Sequences {
  int64_t count = 11;
  Batch get(size_t i) const {
    const auto n = static_cast<int64_t>(i);
    return Batch().set("ids", ids_of(n)).set("label", torch::tensor(n));
  }
  std::optional<size_t> size() const { return static_cast<size_t>(count); }
};

// A torch::data dataset returning Example<>, of unequal sizes when `ragged`.
struct Rows : torch::data::datasets::Dataset<Rows> {
  bool ragged = false;
  explicit Rows(bool ragged) : ragged(ragged) {}
  torch::data::Example<> get(size_t i) override {
    const int64_t width = ragged && i == 2 ? 5 : 3;
    return {torch::full({width}, static_cast<float>(i)), torch::tensor(static_cast<int64_t>(i))};
  }
  torch::optional<size_t> size() const override { return 4; }
};

std::vector<Batch> samples_of(std::vector<int64_t> indices) {
  std::vector<Batch> out;
  for (int64_t i : indices) out.push_back(Sequences().get(static_cast<size_t>(i)));
  return out;
}

}  // namespace

// ---- Batch ---------------------------------------------------------------------------------

TEST(Batch, TheDataTargetPairStaysTheEasyCase) {
  Batch batch{torch::ones({2, 3}), longs({0, 1})};
  EXPECT_TRUE(batch.has("data"));
  EXPECT_TRUE(batch.has("target"));
  EXPECT_TRUE(batch["data"].is_same(batch.data));
  EXPECT_EQ(batch.names(), (std::vector<std::string>{"data", "target"}));
  torch::data::Example<> example{torch::zeros({1}), longs({7})};
  Batch from_example = example;
  EXPECT_TRUE(from_example.target.equal(longs({7})));
}

TEST(Batch, NamedTensorsKeepAFixedOrderDataAndTargetFirst) {
  Batch batch;
  EXPECT_TRUE(batch.items().empty());
  batch.set("mask", torch::ones({2}, torch::kBool)).set("input_ids", longs({4, 5}));
  batch.set("target", longs({1}));
  batch.set("mask", torch::zeros({2}, torch::kBool));  // replaced in place: keeps its position
  EXPECT_EQ(batch.names(), (std::vector<std::string>{"target", "mask", "input_ids"}));
  EXPECT_FALSE(batch["mask"].any().item<bool>());
  batch["input_ids"].add_(1);  // in place, through the reference
  EXPECT_TRUE(batch["input_ids"].equal(longs({5, 6})));
  batch.set("mask", torch::Tensor());  // an undefined tensor removes the name
  EXPECT_FALSE(batch.has("mask"));
  EXPECT_EQ(batch.tensors().size(), 2u);
}

TEST(Batch, AMissingNameIsAnErrorListingTheNamesHeld) {
  Batch batch;
  batch.set("input_ids", longs({1}));
  const std::string message = error_message([&] { (void)batch["inputs_ids"]; });
  EXPECT_TRUE(contains(message, "\"inputs_ids\"")) << message;
  EXPECT_TRUE(contains(message, "[input_ids]")) << message;
  EXPECT_FALSE(error_message([&] { (void)batch["data"]; }).empty()) << "data is undefined";
  EXPECT_FALSE(error_message([&] { batch.set("", longs({1})); }).empty());
}

// ---- tensor_tree.h -------------------------------------------------------------------------

TEST(TensorTree, ApplyReachesEveryTensorOfANestedValueAndKeepsTheRest) {
  using Tree = std::map<std::string, std::vector<std::tuple<torch::Tensor, int, std::string>>>;
  Tree tree{{"a", {{torch::ones({2}), 3, "x"}, {torch::Tensor(), 4, "y"}}},
            {"b", {{torch::full({1}, 5.0), 6, "z"}}}};
  auto doubled = apply_to_tensors(tree, [](const torch::Tensor& t) { return t * 2; });
  EXPECT_TRUE(std::get<0>(doubled["a"][0]).equal(torch::full({2}, 2.0)));
  EXPECT_FALSE(std::get<0>(doubled["a"][1]).defined()) << "undefined tensors stay undefined";
  EXPECT_TRUE(std::get<0>(doubled["b"][0]).equal(torch::full({1}, 10.0)));
  EXPECT_EQ(std::get<1>(doubled["a"][1]), 4);
  EXPECT_EQ(std::get<2>(doubled["b"][0]), "z");
  EXPECT_TRUE(std::get<0>(tree["a"][0]).equal(torch::ones({2}))) << "the input is not modified";

  std::vector<double> order;
  for_each_tensor(tree, [&](const torch::Tensor& t) { order.push_back(t[0].item<double>()); });
  EXPECT_EQ(order, (std::vector<double>{1.0, 5.0})) << "key order, undefined skipped";

  std::pair<std::optional<torch::Tensor>, std::array<torch::Tensor, 2>> other{
      torch::ones({1}), {torch::ones({1}), torch::ones({1})}};
  int visited = 0;
  for_each_tensor(other, [&](const torch::Tensor&) { ++visited; });
  EXPECT_EQ(visited, 3);
}

TEST(TensorTree, SendToDeviceMovesABatchWithItsNames) {
  Batch batch{torch::ones({2}), longs({1, 2})};
  batch.set("mask", torch::ones({2}, torch::kBool));
  // The meta device: a device other than the batch's that every machine has, so that the move
  // is a real one (a CPU-to-CPU move would pass with send_to_device doing nothing).
  Batch moved = send_to_device(batch, torch::kMeta, /*non_blocking=*/true);
  EXPECT_EQ(moved.names(), batch.names());
  ASSERT_EQ(moved.tensors().size(), 3u);
  for (const auto& t : moved.tensors()) EXPECT_TRUE(t.is_meta()) << t.device();
  for (const auto& t : batch.tensors()) EXPECT_TRUE(t.is_cpu()) << "the input must stay";
  EXPECT_EQ(moved["mask"].scalar_type(), torch::kBool);
  auto as_double = apply_to_tensors(std::vector<Batch>{batch},
                                    [](const torch::Tensor& t) { return t.to(torch::kDouble); });
  EXPECT_EQ(as_double[0]["mask"].scalar_type(), torch::kDouble);
  EXPECT_EQ(as_double[0].names(), batch.names());
}

// ---- collates ------------------------------------------------------------------------------

TEST(Collate, StackStacksEveryNamedTensor) {
  Batch out = collate::stack()(std::vector<Batch>{Batch{torch::ones({2}), longs({1})},
                                                  Batch{torch::zeros({2}), longs({2})}});
  EXPECT_TRUE(out.data.equal(torch::tensor({{1.0f, 1.0f}, {0.0f, 0.0f}})));
  EXPECT_TRUE(out.target.equal(torch::tensor({{1}, {2}}, torch::kLong)));
}

TEST(Collate, StackOfUnequalSizesNamesTheShapesAndThePaddingCollate) {
  const std::string message = error_message([] { collate::stack()(samples_of({0, 1})); });
  EXPECT_TRUE(contains(message, "\"ids\"")) << message;
  EXPECT_TRUE(contains(message, "[1]")) << message;  // sample 0: 1 token
  EXPECT_TRUE(contains(message, "[3]")) << message;  // sample 1: 1 + 7 % 5 = 3 tokens
  EXPECT_TRUE(contains(message, "accelerant::collate::pad_to_longest")) << message;
  // Through a loader over a torch::data dataset, whose default collate is stack.
  auto loader = make_data_loader(Rows(/*ragged=*/true), DataLoaderOptions().batch_size(4));
  const std::string through = error_message([&] {
    for (auto& batch : loader) (void)batch;
  });
  EXPECT_TRUE(contains(through, "[3]") && contains(through, "[5]")) << through;
  EXPECT_TRUE(contains(through, "pad_to_longest")) << through;
}

TEST(Collate, PadToLongestReturnsValuesMaskAndLengths) {
  // Lengths 1, 3, 5 (samples 0, 1, 2).
  Batch out =
      collate::pad_to_longest(PaddingOptions().pad({"ids"}).pad_value(-1))(samples_of({0, 1, 2}));
  EXPECT_EQ(out.names(), (std::vector<std::string>{"ids", "label", "mask", "lengths"}));
  EXPECT_TRUE(out["ids"].equal(torch::tensor(
      {{0, -1, -1, -1, -1}, {100, 101, 102, -1, -1}, {200, 201, 202, 203, 204}}, torch::kLong)));
  EXPECT_TRUE(out["mask"].equal(
      torch::tensor({{1, 0, 0, 0, 0}, {1, 1, 1, 0, 0}, {1, 1, 1, 1, 1}}, torch::kLong)
          .to(torch::kBool)));
  EXPECT_TRUE(out["lengths"].equal(longs({1, 3, 5})));
  EXPECT_TRUE(out["label"].equal(longs({0, 1, 2})));
}

TEST(Collate, PadToBucketPadsToTheSmallestBucketThatHoldsTheBatch) {
  auto bucket = collate::pad_to_bucket({2, 4, 8}, PaddingOptions().pad({"ids"}));
  Batch small = bucket(samples_of({0, 1}));  // longest 3 -> bucket 4
  EXPECT_TRUE(small["ids"].equal(torch::tensor({{0, 0, 0, 0}, {100, 101, 102, 0}}, torch::kLong)));
  EXPECT_TRUE(small["mask"].equal(
      torch::tensor({{1, 0, 0, 0}, {1, 1, 1, 0}}, torch::kLong).to(torch::kBool)));
  EXPECT_TRUE(small["lengths"].equal(longs({1, 3})));
  EXPECT_EQ(bucket(samples_of({0, 2}))["ids"].size(1), 8);  // longest 5 -> bucket 8
  EXPECT_EQ(bucket(samples_of({0, 3}))["ids"].size(1), 2);  // longest 2 -> bucket 2
  // Longer than the largest bucket: an error, or truncated to it when asked.
  auto tight = collate::pad_to_bucket({2}, PaddingOptions().pad({"ids"}));
  EXPECT_TRUE(contains(error_message([&] { tight(samples_of({1})); }), "largest"));
  Batch cut =
      collate::pad_to_bucket({2}, PaddingOptions().pad({"ids"}).truncate(true))(samples_of({1}));
  EXPECT_TRUE(cut["ids"].equal(torch::tensor({{100, 101}}, torch::kLong)));
  EXPECT_TRUE(cut["lengths"].equal(longs({2})));
  EXPECT_FALSE(error_message([] { collate::pad_to_bucket({8, 4}); }).empty());
}

TEST(Collate, PadToLengthGivesOneShapeAndCustomNames) {
  auto fixed = collate::pad_to_length(
      6, PaddingOptions().pad({"ids"}).mask_name("attention_mask").lengths_name("n"));
  Batch out = fixed(samples_of({1, 0}));
  EXPECT_EQ(out.names(), (std::vector<std::string>{"ids", "label", "attention_mask", "n"}));
  EXPECT_TRUE(out["ids"].equal(
      torch::tensor({{100, 101, 102, 0, 0, 0}, {0, 0, 0, 0, 0, 0}}, torch::kLong)));
  EXPECT_TRUE(out["attention_mask"].equal(
      torch::tensor({{1, 1, 1, 0, 0, 0}, {1, 0, 0, 0, 0, 0}}, torch::kLong).to(torch::kBool)));
  EXPECT_TRUE(out["n"].equal(longs({3, 1})));
}

TEST(Collate, SeveralPaddedTensorsShareOneMaskOnlyWhenTheirLengthsAgree) {
  auto both = collate::pad_to_longest(PaddingOptions().pad({"ids", "tags"}));
  auto with_tags = [](std::vector<int64_t> indices, bool agree) {
    auto samples = samples_of(indices);
    for (auto& s : samples) {
      const int64_t n = s["ids"].size(0) + (agree ? 0 : 1);
      s.set("tags", torch::ones({n}, torch::kLong));
    }
    return samples;
  };
  Batch out = both(with_tags({0, 1}, true));
  EXPECT_TRUE(out["tags"].equal(torch::tensor({{1, 0, 0}, {1, 1, 1}}, torch::kLong)));
  const std::string message = error_message([&] { both(with_tags({0, 1}, false)); });
  EXPECT_TRUE(contains(message, "\"ids\"") && contains(message, "\"tags\"")) << message;
  // A name that is not there, and samples that disagree on their names.
  EXPECT_TRUE(contains(error_message([] { collate::pad_to_longest()(samples_of({0})); }),
                       "PaddingOptions::pad names \"data\""));
  auto mixed = samples_of({0, 1});
  mixed[1].set("extra", torch::ones({1}));
  EXPECT_TRUE(contains(error_message([&] { collate::stack()(mixed); }), "sample 1"));
}

TEST(Collate, ALoaderOverADatasetOfNamedSamplesUsesTheCollate) {
  auto loader = make_data_loader(Sequences(), DataLoaderOptions().batch_size(4),
                                 collate::pad_to_longest(PaddingOptions().pad({"ids"})));
  std::vector<int64_t> labels;
  for (auto& batch : loader) {
    EXPECT_TRUE(batch.has("mask") && batch.has("lengths"));
    EXPECT_EQ(batch["ids"].size(1), batch["lengths"].max().item<int64_t>());
    for (int64_t k = 0; k < batch["label"].size(0); ++k)
      labels.push_back(batch["label"][k].item<int64_t>());
  }
  EXPECT_EQ(labels, (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10}));
  // A torch::data dataset keeps stacking by default.
  auto rows = make_data_loader(Rows(/*ragged=*/false), DataLoaderOptions().batch_size(2));
  for (auto& batch : rows) EXPECT_EQ(batch.data.sizes(), (std::vector<int64_t>{2, 3}));
  EXPECT_FALSE(error_message([] { make_data_loader(Sequences(), {}, Collate()); }).empty());
}

// ---- through the Accelerator ---------------------------------------------------------------

TEST(BatchThroughPrepare, EveryNamedTensorGetsTheDeviceTransform) {
  // downcast_bf16 makes the CPU take the transform path: a float tensor under any name is cast.
  Accelerator acc(AcceleratorOptions().mixed_precision(MixedPrecision::kBf16).downcast_bf16(true));
  struct Features {
    Batch get(size_t i) const {
      return Batch().set("x", torch::ones({2})).set("ids", longs({static_cast<int64_t>(i)}));
    }
    std::optional<size_t> size() const { return 4; }
  };
  auto loader = acc.prepare(make_data_loader(Features(), DataLoaderOptions().batch_size(2)));
  int batches = 0;
  for (auto& batch : loader) {
    ++batches;
    EXPECT_EQ(batch["x"].scalar_type(), torch::kBFloat16);
    EXPECT_EQ(batch["ids"].scalar_type(), torch::kLong);
    EXPECT_EQ(batch.names(), (std::vector<std::string>{"x", "ids"}));
  }
  EXPECT_EQ(batches, 2);
}

// On two ranks, with and without even_batches: each epoch hands every sample to exactly one rank
// (even_batches off) and gather_for_metrics of the padded three-tensor batch (ids, label, mask;
// lengths too) returns exactly the dataset, each sample's real tokens intact (even_batches on:
// without the padding's repeats).
TEST(BatchOnRanks, VariableLengthSamplesAreSeenOnceAndGatheredExactly) {
  for (bool even : {false, true}) {
    auto results = launch(
        [even](int) {
          Accelerator acc(AcceleratorOptions().even_batches(even));
          auto loader = acc.prepare(
              make_data_loader(Sequences(), DataLoaderOptions().batch_size(2).shuffle(true).seed(5),
                               collate::pad_to_longest(PaddingOptions().pad({"ids"}))));
          std::vector<torch::Tensor> out;
          int64_t bad_rows = 0;
          for (int epoch = 0; epoch < 2; ++epoch) {
            std::vector<torch::Tensor> own, gathered;
            for (auto& batch : loader) {
              own.push_back(batch["label"]);
              Batch all = acc.gather_for_metrics(batch);
              for (int64_t r = 0; r < all["label"].size(0); ++r) {
                const int64_t i = all["label"][r].item<int64_t>();
                const auto real = all["ids"][r].masked_select(all["mask"][r]);
                const bool ok = real.equal(ids_of(i)) &&
                                all["lengths"][r].item<int64_t>() == length_of(i) &&
                                all["ids"][r]
                                    .masked_select(all["mask"][r].logical_not())
                                    .eq(0)
                                    .all()
                                    .item<bool>();
                bad_rows += ok ? 0 : 1;
              }
              gathered.push_back(all["label"]);
            }
            out.push_back(torch::cat(own));
            out.push_back(torch::cat(gathered));
          }
          out.push_back(torch::tensor(bad_rows));
          return out;
        },
        ranks(2));
    ASSERT_EQ(results.size(), 2u);
    const auto dataset = torch::arange(11, torch::kLong);
    for (int epoch = 0; epoch < 2; ++epoch) {
      const auto& own0 = results[0][2 * epoch];
      const auto& own1 = results[1][2 * epoch];
      const auto seen = std::get<0>(torch::cat({own0, own1}).sort());
      if (!even) {
        EXPECT_TRUE(seen.equal(dataset))
            << "epoch " << epoch << ": some sample missing or repeated: " << seen;
      } else {
        EXPECT_EQ(seen.size(0), 12) << "even_batches repeats one sample to fill the last step";
      }
      for (int rank = 0; rank < 2; ++rank) {
        const auto gathered = std::get<0>(results[rank][2 * epoch + 1].sort());
        EXPECT_TRUE(gathered.equal(dataset))
            << "rank " << rank << " epoch " << epoch << " even_batches " << even
            << ": gather_for_metrics did not return exactly the dataset: " << gathered;
      }
    }
    EXPECT_FALSE(torch::equal(results[0][0], results[0][2])) << "shuffled anew every epoch";
    for (int rank = 0; rank < 2; ++rank)
      EXPECT_EQ(results[rank][4].item<int64_t>(), 0)
          << "rows whose tokens, mask or length are wrong";
  }
}
