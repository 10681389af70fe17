#include "accelerator/sharded_model_files.h"

#include <exception>
#include <memory>
#include <unordered_map>

#include "accelerant/error.h"
#include "accelerant/sharded.h"
#include "base/text.h"
#include "checkpoint/safetensors_stream.h"
#include "checkpoint/state_pieces.h"

namespace accelerant::detail {
namespace {

// Walks a model's tensors in file order with at most one sharded block gathered: the block of
// the tensor at hand. Every process walks alike, so the gathers pair up.
class BlockByBlock {
 public:
  explicit BlockByBlock(const torch::nn::Module& model) {
    for (const auto& block : sharded_blocks(model)) {
      if (!block->sharded()) continue;
      for (const auto& p : block->block()->parameters()) owner_[p.unsafeGetTensorImpl()] = block;
    }
  }
  ~BlockByBlock() {
    if (current_) current_->release();  // also when a step threw
  }
  BlockByBlock(const BlockByBlock&) = delete;
  BlockByBlock& operator=(const BlockByBlock&) = delete;

  // Makes `tensor` hold its values: gathers its block, after releasing the previous one (its
  // values first kept into its shares when `keep` is set: a load).
  void reach(const torch::Tensor& tensor, bool keep) {
    auto found = owner_.find(tensor.unsafeGetTensorImpl());
    ShardedImpl* owner = found == owner_.end() ? nullptr : found->second.get();
    if (owner == current_) return;
    leave(keep);
    if (owner) owner->gather();
    current_ = owner;
  }
  // Releases the block at hand (keeping its values into its shares when `keep` is set).
  void leave(bool keep) {
    if (!current_) return;
    ShardedImpl* block = current_;
    current_ = nullptr;
    if (keep) {
      try {
        block->store_gathered();
      } catch (...) {
        block->release();
        throw;
      }
    }
    block->release();
  }

 private:
  std::unordered_map<const c10::TensorImpl*, std::shared_ptr<ShardedImpl>> owner_;
  ShardedImpl* current_ = nullptr;
};

}  // namespace

void save_model_by_blocks(const torch::nn::Module& model, const std::string& dir,
                          int64_t max_shard_bytes, const CheckpointRanks& ranks) {
  const auto tensors = model_tensors_in_file_order(model);
  std::unique_ptr<ModelSafetensorsWriter> writer;
  std::exception_ptr failure;  // the main process's, said on every process at the end
  if (ranks.is_main()) {
    try {
      std::vector<TensorLayout> layouts;
      for (const auto& [name, tensor] : tensors) layouts.push_back(layout_of(name, tensor));
      writer = std::make_unique<ModelSafetensorsWriter>(dir, std::move(layouts), max_shard_bytes);
    } catch (...) {
      failure = std::current_exception();
    }
  }
  {
    BlockByBlock walk(model);
    for (const auto& [name, tensor] : tensors) {
      walk.reach(tensor, /*keep=*/false);
      if (!writer) continue;
      try {
        writer->write(tensor);
      } catch (...) {
        failure = std::current_exception();
        writer.reset();  // removes what it wrote; the walk goes on for the other processes
      }
    }
  }
  if (writer) {
    try {
      writer->finish();
    } catch (...) {
      failure = std::current_exception();
    }
  }
  on_every_process(ranks, "save_model into " + dir, [&] {
    if (failure) std::rethrow_exception(failure);
  });
}

void load_model_by_blocks(torch::nn::Module& model, const std::string& dir,
                          const CheckpointRanks& ranks) {
  std::unique_ptr<MappedModelWeights> weights;
  on_every_process(ranks, "load_model from " + dir, [&] {
    weights = std::make_unique<MappedModelWeights>(dir);
    const auto problems = state_mismatches(named_state(model), weights->shapes());
    if (!problems.empty()) {
      throw CheckpointError(
          str("the weights in ", dir,
              " do not fit the model; nothing was loaded: ", join(problems, "; "),
              ". Fix: build the model with the same layers and sizes as the one saved."),
          dir);
    }
  });
  torch::NoGradGuard no_grad;
  BlockByBlock walk(model);
  for (const auto& [name, tensor] : model_tensors_in_file_order(model)) {
    walk.reach(tensor, /*keep=*/true);
    torch::Tensor target = tensor;
    target.copy_(weights->tensor(name));
  }
  walk.leave(/*keep=*/true);
}

}  // namespace accelerant::detail
