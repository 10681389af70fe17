// A ZeRO-3 model's values reached one sharded block at a time, for the files that hold a model
// (save_model, load_model, and the model file of save_state and load_state): every process
// gathers each sharded block in turn (a collective), and the block's tensors are read or written
// while it is whole, so that no process ever holds the whole model. A model without sharded
// blocks takes the same path, each tensor reached in place, with no collective.
#pragma once
#include <torch/nn/module.h>
#include <torch/types.h>

#include <functional>
#include <string>
#include <vector>

namespace accelerant::detail {

/// Whether `model` holds a sharded block whose parameters are sharded now (ZeRO stage 3 with more
/// than one process).
bool has_sharded_blocks(const torch::nn::Module& model);

/// Calls `visit` with each of `model`'s tensors, whole, in file order
/// (model_tensors_in_file_order): a sharded block's tensor while its block is gathered, one block
/// gathered at a time. With `keep` (a load: `visit` writes the tensors), each block's new values
/// are kept into its shares before it is released. A collective when the model has sharded
/// blocks: every process walks alike. A `visit` that throws does not end the walk, since the
/// other processes' gathers must still pair up: the walk goes on without visiting or keeping,
/// and the first failure is rethrown at its end.
void visit_model_by_blocks(
    const torch::nn::Module& model, bool keep,
    const std::function<void(const std::string& name, torch::Tensor& tensor)>& visit);

/// A model's values as this process holds them: each sharded block's shares, every other tensor
/// whole (copies). What a failed load puts back, with no collective and no gather.
class HeldModelValues {
 public:
  explicit HeldModelValues(const torch::nn::Module& model);
  /// Copies the held values back into `model` (the one they were taken from), in place.
  void restore(torch::nn::Module& model) const;

 private:
  std::vector<torch::Tensor> shares_;  // every sharded block's shares, block after block
  std::vector<std::pair<std::string, torch::Tensor>> others_;  // tensors outside those blocks
};

}  // namespace accelerant::detail
