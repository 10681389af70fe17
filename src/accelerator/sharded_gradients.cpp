// Where the gradients are under ZeRO, for clipping: stage 2's reducer shares, stage 3's shares
// of the sharded blocks' parameters beside the whole gradients of the rest.
#include <unordered_map>
#include <unordered_set>

#include "accelerant/error.h"
#include "accelerator/accelerator_impl.h"
#include "base/text.h"

namespace accelerant {

// Stage 2: the gradients are the shares of the reducers of the models these parameters are
// (every trainable parameter of a model, or none: a share cuts across parameters).
std::vector<torch::Tensor> Accelerator::Impl::stage2_gradient_shares(
    const std::vector<torch::Tensor>& parameters) const {
  std::vector<torch::Tensor> grads;
  std::unordered_set<const c10::TensorImpl*> given;
  for (const auto& p : parameters) given.insert(p.unsafeGetTensorImpl());
  for (const auto& prepared : models_) {
    size_t in = 0, trainable = 0;
    for (const auto& p : prepared.module->parameters()) {
      if (!p.requires_grad()) continue;
      ++trainable;
      in += given.count(p.unsafeGetTensorImpl());
    }
    if (in == 0) continue;
    if (in != trainable) {
      throw Error(detail::str(
          rank_prefix_, "clip_grad_norm under ZeRO stage 2 got ", in, " of a model's ", trainable,
          " trainable parameters. Its gradients are shares of its buckets, which ",
          "cut across parameters, so only a whole model can be clipped. Fix: pass the model "
          "(or all of its parameters), or zero_stage(1)."));
    }
    for (const auto& share : prepared.reducer->gradient_shares()) grads.push_back(share);
  }
  return grads;
}

// Stage 3: a sharded block's parameter has its gradient in its share, 1/N of it on each process;
// the other parameters have theirs whole on every process, so only rank 0 counts them in the norm
// (all of them are clipped).
void Accelerator::Impl::stage3_gradients(const std::vector<torch::Tensor>& parameters,
                                         std::vector<torch::Tensor>& grads,
                                         std::vector<torch::Tensor>& counted) const {
  std::unordered_map<const c10::TensorImpl*, torch::Tensor> share_of;
  for (const auto& prepared : models_) {
    for (const auto& block : prepared.sharded) {
      // A block's parameter, or the share itself (the optimizer's parameters), gives the share.
      const auto params = block->block()->parameters();
      for (size_t i = 0; i < params.size(); ++i) {
        share_of[params[i].unsafeGetTensorImpl()] = block->shares()[i];
        share_of[block->shares()[i].unsafeGetTensorImpl()] = block->shares()[i];
      }
    }
  }
  for (const auto& p : parameters) {
    auto found = share_of.find(p.unsafeGetTensorImpl());
    const torch::Tensor& grad = found == share_of.end() ? p.grad() : found->second.grad();
    if (!grad.defined()) continue;
    grads.push_back(grad);
    if (found != share_of.end() || rank_ == 0) counted.push_back(grad);
  }
}

}  // namespace accelerant
