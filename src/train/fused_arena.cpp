// The fused update's arenas: every parameter of the optimizer packed into one flat fp32 buffer
// (each keeps its identity; its storage moves), the state in buffers of the same layout, and the
// gradients bound into a gradient arena as they appear, so that the update is one pass over
// contiguous memory.
#include <unordered_map>

#include "accelerant/error.h"
#include "base/tensor_alias.h"
#include "base/text.h"
#include "train/fused_state_format.h"
#include "train/fused_updater_impl.h"

namespace accelerant {

using detail::fused_kind_name;

bool FusedUpdater::Impl::uses_state1() const {
  if (kind != detail::FusedKind::kSGD) return true;
  for (auto& group : optimizer->param_groups()) {
    if (static_cast<torch::optim::SGDOptions&>(group.options()).momentum() != 0) return true;
  }
  return false;
}

std::vector<torch::Tensor> FusedUpdater::Impl::current_params(std::vector<size_t>* groups) const {
  std::vector<torch::Tensor> out;
  const auto& param_groups = optimizer->param_groups();
  for (size_t g = 0; g < param_groups.size(); ++g) {
    for (const auto& p : param_groups[g].params()) {
      out.push_back(p);
      if (groups) groups->push_back(g);
    }
  }
  return out;
}

bool FusedUpdater::Impl::packed() const {
  const auto now = current_params(nullptr);
  if (now.size() != params.size()) return false;
  for (size_t i = 0; i < now.size(); ++i) {
    if (now[i].unsafeGetTensorImpl() != params[i].unsafeGetTensorImpl()) return false;
    if (!detail::aliases(now[i], param_arena, offsets[i])) return false;
  }
  return true;
}

void FusedUpdater::Impl::pack() {
  std::vector<size_t> groups;
  std::vector<torch::Tensor> now = current_params(&groups);
  std::unordered_map<const c10::TensorImpl*, size_t> before;
  for (size_t i = 0; i < params.size(); ++i) before[params[i].unsafeGetTensorImpl()] = i;
  check_packable(now);
  Arenas fresh = fresh_arenas(now);
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < now.size(); ++i) move_into(now[i], i, fresh, before);
  if (is_sharded && now.size() != params.size() && !params.empty()) {
    throw Error(detail::str("The sharded fused ", fused_kind_name(kind), " was made for ",
                            params.size(), " parameters; the optimizer now has ", now.size(),
                            ". Fix: add parameter groups ",
                            "before accelerator.prepare, which shards the update (ZeRO)."));
  }
  take_arenas(std::move(now), std::move(groups), std::move(fresh));
}

// Dense fp32 parameters on one device, each listed once: what one arena can hold.
void FusedUpdater::Impl::check_packable(const std::vector<torch::Tensor>& now) const {
  for (size_t i = 0; i < now.size(); ++i) {
    const torch::Tensor& p = now[i];
    if (p.scalar_type() != torch::kFloat || p.is_sparse() || p.layout() != torch::kStrided) {
      throw Error(detail::str(
          "The fused ", fused_kind_name(kind), " takes dense fp32 parameters; parameter ", i,
          " (shape ", p.sizes(), ") is ", p.toString(), ". Fix: keep master weights in ",
          "fp32 (mixed precision does), or use torch::optim::", fused_kind_name(kind), "."));
    }
    if (p.device() != now.front().device()) {
      throw Error(detail::str(
          "The fused ", fused_kind_name(kind), " keeps all parameters in one arena, but they are ",
          "on ", now.front().device(), " and ", p.device(), " (parameter ", i, "). Fix: one ",
          "optimizer per device, or move the model to one device first."));
    }
    for (size_t j = 0; j < i; ++j) {
      if (now[j].unsafeGetTensorImpl() == p.unsafeGetTensorImpl()) {
        throw Error(detail::str("Parameter ", i, " is also parameter ", j,
                                " of this optimizer (listed twice, ",
                                "e.g. in two groups). Fix: give each parameter to one group."));
      }
    }
  }
}

FusedUpdater::Impl::Arenas FusedUpdater::Impl::fresh_arenas(
    const std::vector<torch::Tensor>& now) const {
  Arenas fresh;
  int64_t total = 0;
  for (const torch::Tensor& p : now) {
    fresh.offsets.push_back(total);
    total += p.numel();
  }
  const auto options = now.empty()
                           ? torch::TensorOptions(torch::kFloat)
                           : torch::TensorOptions(torch::kFloat).device(now.front().device());
  fresh.params = torch::empty({total}, options);
  fresh.grads = torch::zeros({total}, options);  // filled as gradients appear
  // Sharded state is laid out by pieces, not by the arena: it stays as it is. State not made
  // yet is made at its first use (ensure_packed), so that an updater sharded before its first
  // step never holds the whole arena's moments, not even for a moment.
  auto fresh_state = [&](const torch::Tensor& state) {
    return is_sharded ? state : state.defined() ? torch::zeros({total}, options) : torch::Tensor();
  };
  fresh.state1 = fresh_state(state1);
  fresh.state2 = fresh_state(state2);
  fresh.steps = torch::zeros({static_cast<int64_t>(now.size())}, options.dtype(torch::kDouble));
  return fresh;
}

// Parameter i (`param`) into the fresh arenas: its values, the state and step count it had at
// its old place (`before`: old index by identity), and its gradient when that was in our arena.
void FusedUpdater::Impl::move_into(
    torch::Tensor& param, size_t i, const Arenas& fresh,
    const std::unordered_map<const c10::TensorImpl*, size_t>& before) const {
  const int64_t n = param.numel();
  const int64_t at = fresh.offsets[i];
  fresh.params.narrow(0, at, n).copy_(param.detach().reshape({-1}));
  auto old = before.find(param.unsafeGetTensorImpl());
  if (old != before.end()) {
    const size_t j = old->second;
    auto carry = [&](const torch::Tensor& into, const torch::Tensor& from) {
      if (!is_sharded && into.defined() && from.defined()) {
        into.narrow(0, at, n).copy_(from.narrow(0, offsets[j], n));
      }
    };
    carry(fresh.state1, state1);
    carry(fresh.state2, state2);
    fresh.steps[static_cast<int64_t>(i)].copy_(steps[static_cast<int64_t>(j)]);
  }
  const torch::Tensor& grad = param.grad();
  if (grad.defined() && old != before.end() &&
      detail::aliases(grad, grad_arena, offsets[old->second])) {
    adopt_gradient(param, fresh.grads, at);
  }
  param.set_data(detail::alias_into(fresh.params, at, param.sizes()));
}

void FusedUpdater::Impl::take_arenas(std::vector<torch::Tensor> now, std::vector<size_t> groups,
                                     Arenas fresh) {
  params = std::move(now);
  group_of = std::move(groups);
  offsets = std::move(fresh.offsets);
  numels.clear();
  for (const auto& p : params) numels.push_back(p.numel());
  param_arena = fresh.params, grad_arena = fresh.grads, state1 = fresh.state1,
  state2 = fresh.state2, steps = fresh.steps;
  layouts.clear();
}

// Gradients are bound into the arena once they exist (an unset .grad stays unset, so a
// parameter without gradients is skipped as torch::optim skips it). A gradient that is a slice
// of a larger buffer (the reducer's bucket) stays where it is and is read in place.
bool FusedUpdater::Impl::standalone(const torch::Tensor& grad) {
  return grad.defined() && grad.layout() == torch::kStrided && grad.storage_offset() == 0 &&
         grad.storage().nbytes() == static_cast<size_t>(grad.numel()) * grad.element_size();
}

void FusedUpdater::Impl::adopt_gradient(torch::Tensor& param, const torch::Tensor& arena,
                                        int64_t offset) {
  torch::Tensor bound = detail::alias_into(arena, offset, param.sizes());
  bound.copy_(param.grad());
  param.mutable_grad() = bound;
}

void FusedUpdater::Impl::adopt_new_gradients() {
  for (size_t i = 0; i < params.size(); ++i) {
    const torch::Tensor& grad = params[i].grad();
    if (standalone(grad) && grad.scalar_type() == torch::kFloat &&
        grad.device() == grad_arena.device() && !detail::aliases(grad, grad_arena, offsets[i])) {
      adopt_gradient(params[i], grad_arena, offsets[i]);
    }
  }
}

void FusedUpdater::Impl::ensure_packed() {
  if (!packed()) pack();
  // First use, or momentum turned on.
  if (uses_state1() && !state1.defined())
    state1 = torch::zeros({state_numel()}, param_arena.options());
  if (uses_state2() && !state2.defined())
    state2 = torch::zeros({state_numel()}, param_arena.options());
}

// A gradient as fp32 contiguous memory on the arena's device: itself when it already is.
torch::Tensor FusedUpdater::Impl::usable_grad(const torch::Tensor& grad,
                                              const torch::Tensor& param) {
  if (grad.is_sparse()) {
    throw Error(
        "The fused optimizers take dense gradients; a parameter has a sparse one. Fix: use dense "
        "gradients (e.g. Embedding without sparse=true) or torch::optim.");
  }
  if (grad.scalar_type() == torch::kFloat && grad.is_contiguous() &&
      grad.device() == param.device())
    return grad;
  return grad.to(param.device(), torch::kFloat).contiguous();
}

}  // namespace accelerant
