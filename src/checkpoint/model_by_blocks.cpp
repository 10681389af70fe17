#include "checkpoint/model_by_blocks.h"

#include <exception>
#include <memory>
#include <unordered_map>

#include "accelerant/sharded.h"
#include "checkpoint/safetensors_stream.h"
#include "checkpoint/state_pieces.h"

namespace accelerant::detail {
namespace {

using OwnerMap = std::unordered_map<const c10::TensorImpl*, std::shared_ptr<ShardedImpl>>;

// Which sharded block (sharded now) owns each parameter.
OwnerMap owners_of(const torch::nn::Module& model) {
  OwnerMap owner;
  for (const auto& block : sharded_blocks(model)) {
    if (!block->sharded()) continue;
    for (const auto& p : block->block()->parameters()) owner[p.unsafeGetTensorImpl()] = block;
  }
  return owner;
}

// Walks a model's tensors with at most one sharded block gathered: the block of the tensor at
// hand. Every process walks alike, so the gathers pair up.
class BlockByBlock {
 public:
  explicit BlockByBlock(const torch::nn::Module& model) : owner_(owners_of(model)) {}
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
  OwnerMap owner_;
  ShardedImpl* current_ = nullptr;
};

}  // namespace

bool has_sharded_blocks(const torch::nn::Module& model) {
  for (const auto& block : sharded_blocks(model)) {
    if (block->sharded()) return true;
  }
  return false;
}

void visit_model_by_blocks(
    const torch::nn::Module& model, bool keep,
    const std::function<void(const std::string& name, torch::Tensor& tensor)>& visit) {
  std::exception_ptr failure;
  {
    BlockByBlock walk(model);
    for (auto& [name, tensor] : model_tensors_in_file_order(model)) {
      walk.reach(tensor, keep && !failure);
      if (failure) continue;  // the gathers go on for the other processes
      try {
        visit(name, tensor);
      } catch (...) {
        failure = std::current_exception();
      }
    }
    walk.leave(keep && !failure);
  }
  if (failure) std::rethrow_exception(failure);
}

HeldModelValues::HeldModelValues(const torch::nn::Module& model) {
  const OwnerMap owner = owners_of(model);
  for (const auto& block : sharded_blocks(model)) {
    if (!block->sharded()) continue;
    for (const auto& share : block->shares()) shares_.push_back(share.detach().clone());
  }
  for (const auto& [name, tensor] : named_state(model)) {
    if (!owner.count(tensor.unsafeGetTensorImpl()))
      others_.emplace_back(name, tensor.detach().clone());
  }
}

void HeldModelValues::restore(torch::nn::Module& model) const {
  torch::NoGradGuard no_grad;
  size_t next = 0;
  for (const auto& block : sharded_blocks(model)) {
    if (!block->sharded()) continue;
    for (const auto& share : block->shares()) share.detach().copy_(shares_.at(next++));
  }
  auto state = named_state(model);
  for (const auto& [name, held] : others_) state.at(name).copy_(held);
}

}  // namespace accelerant::detail
