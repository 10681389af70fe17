// What a DataLoader yields and a GraphStep takes: one batch of training data, as named tensors.
//
//   for (auto& batch : loader) {
//     auto logits = model->forward(batch["input_ids"], batch["mask"]);
//     auto loss = torch::nn::functional::cross_entropy(logits, batch["labels"]);
//   }
//
// The data/target pair stays the easy case: `batch.data`, `batch.target` and `Batch{x, y}` work
// as they did when a batch was a torch::data::Example<>. Any number of further tensors ride along
// under names. Why names rather than the user's own batch type: docs/data_loading.md, "Batches of
// any structure" (user types are served by tensor_tree.h's TensorTree instead).
#pragma once
#include <torch/data/example.h>
#include <torch/types.h>

#include <string>
#include <utility>
#include <vector>

namespace accelerant {

/// A batch, or (from a dataset's get()) one sample: `data` and `target` plus any named tensors.
/// "data" and "target" are names too: batch["data"] is batch.data, and set("target", t) sets
/// batch.target. An undefined tensor counts as absent (has() is false, items() leaves it out).
class Batch {
 public:
  /// One named tensor, as items() lists them.
  using Item = std::pair<std::string, torch::Tensor>;

  /// The input tensor (the easy case); may stay undefined in a batch of named tensors only.
  torch::Tensor data;
  /// The target tensor (the easy case); may stay undefined.
  torch::Tensor target;

  /// An empty batch (no tensor defined).
  Batch() = default;
  /// The easy case: `Batch{x, y}`.
  Batch(torch::Tensor data, torch::Tensor target)
      : data(std::move(data)), target(std::move(target)) {}
  /// What a torch::data dataset's get() returns: its data and target.
  Batch(torch::data::Example<> example)  // NOLINT: implicit, so that get() may return either
      : data(std::move(example.data)), target(std::move(example.target)) {}

  /// Whether a defined tensor is held under `name` ("data" and "target" included).
  bool has(const std::string& name) const;
  /// The tensor held under `name`. Throws Error naming the names it holds when there is none.
  const torch::Tensor& operator[](const std::string& name) const;
  /// The tensor held under `name`, to replace or modify in place. Throws Error when there is
  /// none (set() adds one).
  torch::Tensor& operator[](const std::string& name);
  /// Holds `tensor` under `name` (replacing what was there, keeping its place in items()); an
  /// undefined `tensor` removes the name. Returns *this, so that sets chain. Throws Error for an
  /// empty name.
  Batch& set(const std::string& name, torch::Tensor tensor);

  /// Every defined tensor with its name, in a fixed order: "data", "target", then the others in
  /// the order they were first set. Collectives over a batch run in this order on every rank.
  std::vector<Item> items() const;
  /// The names of items(), in its order.
  std::vector<std::string> names() const;
  /// The tensors of items(), in its order.
  std::vector<torch::Tensor> tensors() const;

 private:
  std::vector<Item> named_;  // the names other than data and target, in order of first set()
};

}  // namespace accelerant
