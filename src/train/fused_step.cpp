// The fused update itself, two ways: on the CPU one vectorised loop over the arena
// (fused_kernels.cpp), its constants computed on the host; on other devices (and while a step is
// recorded) per parameter group a fixed handful of whole-slice tensor operations, whatever the
// number of parameters, that read nothing on the host.
#include <cmath>
#include <unordered_map>

#include "accelerant/error.h"
#include "base/step_recording.h"
#include "base/tensor_alias.h"
#include "base/text.h"
#include "train/fused_state_format.h"
#include "train/fused_updater_impl.h"

namespace accelerant {

using detail::FusedGroupConstants;
using detail::FusedGroupLayout;
using detail::FusedKind;
using detail::FusedSegment;

FusedGroupConstants detail::fused_group_constants(FusedKind kind,
                                                  torch::optim::OptimizerOptions& options,
                                                  size_t group) {
  FusedGroupConstants c;
  auto amsgrad_refused = [&] {
    throw Error(detail::str("Parameter group ", group, " sets amsgrad, which the fused ",
                            fused_kind_name(kind), " does not implement. Fix: set amsgrad(false), ",
                            "or use torch::optim::", fused_kind_name(kind), " unfused."));
  };
  if (kind == FusedKind::kAdamW) {
    auto& o = static_cast<torch::optim::AdamWOptions&>(options);
    if (o.amsgrad()) amsgrad_refused();
    c.lr = o.lr(), c.weight_decay = o.weight_decay(), c.eps = o.eps();
    c.beta1 = std::get<0>(o.betas()), c.beta2 = std::get<1>(o.betas());
  } else if (kind == FusedKind::kAdam) {
    auto& o = static_cast<torch::optim::AdamOptions&>(options);
    if (o.amsgrad()) amsgrad_refused();
    c.lr = o.lr(), c.weight_decay = o.weight_decay(), c.eps = o.eps();
    c.beta1 = std::get<0>(o.betas()), c.beta2 = std::get<1>(o.betas());
  } else {
    auto& o = static_cast<torch::optim::SGDOptions&>(options);
    c.lr = o.lr(), c.weight_decay = o.weight_decay(), c.momentum = o.momentum(),
    c.dampening = o.dampening();
    c.nesterov = o.nesterov();
  }
  return c;
}

void FusedUpdater::Impl::step(const torch::Tensor& skip) {
  torch::NoGradGuard no_grad;
  ensure_packed();
  adopt_new_gradients();
  // A recorded step takes the device path on the CPU too: the CPU loop reads the skip flag and
  // computes the step sizes on the host, which a replay would not repeat.
  if (param_arena.is_cpu() && !options.tensor_ops_on_cpu() && !detail::recording_step()) {
    if (skip.defined() && skip.item<double>() != 0) return;  // on the CPU reading it costs nothing
    step_on_cpu();
  } else {
    step_with_tensor_ops(skip);
  }
}

// ---- The CPU loop --------------------------------------------------------------------------

void FusedUpdater::Impl::step_on_cpu() {
  auto& groups = optimizer->param_groups();
  std::vector<FusedGroupConstants> constants;
  for (size_t g = 0; g < groups.size(); ++g)
    constants.push_back(detail::fused_group_constants(kind, groups[g].options(), g));
  std::vector<torch::Tensor> converted;  // keeps converted gradients alive during the update
  const std::vector<torch::Tensor> grads = cpu_gradients(converted);
  std::vector<FusedSegment> segments;
  // Unsharded, parameter k is one piece of itself, with its state at its arena offset.
  const size_t count = is_sharded ? pieces.size() : params.size();
  for (size_t k = 0; k < count; ++k) {
    const FusedShardPiece piece =
        is_sharded ? pieces[k]
                   : FusedShardPiece{static_cast<int64_t>(k), 0, numels[k], torch::Tensor()};
    const auto i = static_cast<size_t>(piece.param);
    if (!has_gradient(i) || piece.length == 0) continue;
    const int64_t state_at = is_sharded ? state_offsets[k] : offsets[i];
    segments.push_back(segment_of(piece, state_at, grads[i], constants[group_of[i]]));
  }
  auto* step_counts = steps.data_ptr<double>();
  for (size_t i = 0; i < params.size(); ++i) {
    if (has_gradient(i)) step_counts[i] += 1;
  }
  detail::run_fused_update(kind, segments);
}

// Every parameter with a gradient counts a step, owned here or not, so that the counts (and the
// bias corrections) are the same on every process. Undefined: no step for it. `converted` keeps
// the gradients that had to be converted (usable_grad).
std::vector<torch::Tensor> FusedUpdater::Impl::cpu_gradients(
    std::vector<torch::Tensor>& converted) const {
  std::vector<torch::Tensor> grads(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    const torch::Tensor& grad = params[i].grad();
    if (!grad.defined() || numels[i] == 0) continue;
    grads[i] = usable_grad(grad, params[i]);
    if (!grads[i].is_same(grad)) converted.push_back(grads[i]);
  }
  return grads;
}

// The CPU loop's view of one piece: its memory and this step's constants, computed in double as
// torch::optim does.
FusedSegment FusedUpdater::Impl::segment_of(const FusedShardPiece& piece, int64_t state_at,
                                            const torch::Tensor& grad,
                                            const FusedGroupConstants& c) const {
  const auto i = static_cast<size_t>(piece.param);
  const double* step_counts = steps.data_ptr<double>();
  FusedSegment s;
  s.param = param_arena.data_ptr<float>() + offsets[i] + piece.begin;
  s.grad =
      piece.grad.defined() ? piece.grad.data_ptr<float>() : grad.data_ptr<float>() + piece.begin;
  s.numel = piece.length;
  s.weight_decay = static_cast<float>(c.weight_decay);
  const double step = step_counts[i] + 1;
  if (kind == FusedKind::kSGD) {
    s.state1 = state1.defined() ? state1.data_ptr<float>() + state_at : nullptr;
    s.momentum = static_cast<float>(c.momentum);
    s.one_minus_dampening = static_cast<float>(1 - c.dampening);
    s.nesterov = c.nesterov;
    s.first_step = step_counts[i] == 0;
    s.neg_lr = static_cast<float>(-c.lr);
  } else {
    s.state1 = state1.data_ptr<float>() + state_at;
    s.state2 = state2.data_ptr<float>() + state_at;
    s.decay = static_cast<float>(kind == FusedKind::kAdamW ? 1 - c.lr * c.weight_decay : 1.0);
    s.beta1 = static_cast<float>(c.beta1), s.one_minus_beta1 = static_cast<float>(1 - c.beta1);
    s.beta2 = static_cast<float>(c.beta2), s.one_minus_beta2 = static_cast<float>(1 - c.beta2);
    s.sqrt_bias_correction2 = static_cast<float>(std::sqrt(1 - std::pow(c.beta2, step)));
    s.eps = static_cast<float>(c.eps);
    s.neg_step_size = static_cast<float>(-c.lr / (1 - std::pow(c.beta1, step)));
  }
  return s;
}

// ---- The device path: whole-slice tensor operations ----------------------------------------

void FusedUpdater::Impl::build_layouts() {
  layouts.clear();
  const auto& groups = optimizer->param_groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    FusedGroupLayout layout;
    std::vector<int64_t> sizes;
    for (size_t i = 0; i < params.size(); ++i) {
      if (group_of[i] == g && numels[i] > 0) {
        layout.members.push_back(static_cast<int64_t>(i));
        sizes.push_back(numels[i]);
      }
    }
    if (!layout.members.empty()) {
      layout.first = layout.members.front(), layout.last = layout.members.back();
      layout.begin = offsets[layout.first], layout.end = offsets[layout.last] + numels[layout.last];
      layout.sizes = torch::tensor(sizes, torch::kLong).to(param_arena.device());
      if (is_sharded) add_shard_runs(layout);
    }
    layouts.push_back(std::move(layout));
  }
}

void FusedUpdater::Impl::add_shard_runs(FusedGroupLayout& layout) const {
  const auto on_device = torch::TensorOptions(torch::kLong).device(param_arena.device());
  std::unordered_map<int64_t, int64_t> member_position;
  for (size_t m = 0; m < layout.members.size(); ++m)
    member_position[layout.members[m]] = static_cast<int64_t>(m);
  std::vector<torch::Tensor> local, state;
  std::vector<int64_t> member, lengths;
  for (size_t k = 0; k < pieces.size(); ++k) {
    const FusedShardPiece& piece = pieces[k];
    auto found = member_position.find(piece.param);
    if (found == member_position.end() || piece.length == 0) continue;
    const int64_t at = offsets[piece.param] + piece.begin - layout.begin;
    local.push_back(torch::arange(at, at + piece.length, on_device));
    state.push_back(torch::arange(state_offsets[k], state_offsets[k] + piece.length, on_device));
    member.push_back(found->second);
    lengths.push_back(piece.length);
    if (gradients_in_pieces) layout.shard_grads.push_back(piece.grad);
    layout.shard_elements += piece.length;
  }
  if (local.empty()) return;
  layout.shard_local = torch::cat(local);
  layout.shard_state = torch::cat(state);
  layout.shard_member = torch::tensor(member, torch::kLong).to(param_arena.device());
  layout.shard_lengths = torch::tensor(lengths, torch::kLong).to(param_arena.device());
}

// -lr of group g as a device tensor. A scheduler changes the lr on the host between steps;
// the update reads it from this tensor, so that a captured step reads each replay's value
// instead of a constant frozen at the capture. Filled here in an eager step; while a step is
// recorded it is filled before every replay instead (a fill inside the capture would be
// replayed too, overwriting the refreshed value with the captured one).
const torch::Tensor& FusedUpdater::Impl::neg_lr(size_t g, double lr) {
  FusedGroupLayout& layout = layouts[g];
  const bool created = !layout.neg_lr.defined();
  if (created) layout.neg_lr = torch::empty({}, param_arena.options());
  if (detail::recording_step()) {
    detail::before_replay([this, g] { refresh_lr(g); });
    // The CPU emulation runs this step at once, with no replay to refresh it first.
    if (created && detail::recorded_work_runs_now()) refresh_lr(g);
  } else if (created || layout.lr_in_tensor != lr) {
    refresh_lr(g);
  }
  return layout.neg_lr;
}

void FusedUpdater::Impl::refresh_lr(size_t g) {
  if (g >= layouts.size() || !layouts[g].neg_lr.defined())
    return;  // packed again since: the graph is stale
  FusedGroupLayout& layout = layouts[g];
  const double lr =
      detail::fused_group_constants(kind, optimizer->param_groups()[g].options(), g).lr;
  layout.neg_lr.fill_(-lr);
  layout.lr_in_tensor = lr;
}

namespace {

// One group's update as tensor operations: the elements updated here (the group's slice of the
// arena, or under ZeRO copies of this process's pieces that put_back writes back), their
// gradients, and per element whether it changes at all.
struct GroupUpdate {
  GroupUpdate(const FusedGroupLayout& layout, bool sharded, torch::Tensor group_params)
      : layout(layout), sharded(sharded), group_params(std::move(group_params)) {}

  const FusedGroupLayout& layout;
  bool sharded = false;
  torch::Tensor group_params;  // the group's slice of the parameter arena
  torch::Tensor P, G;          // the elements updated here and their gradients
  torch::Tensor k;             // per element: 1 = update, 0 = leave as is
  torch::Tensor lr_neg;        // -lr, 0-dim on the device

  // A per-parameter value for each element. output_size: without it repeat_interleave reads the
  // sizes' sum on the host.
  torch::Tensor per_element(const torch::Tensor& per_param) const {
    if (sharded) {
      return torch::repeat_interleave(per_param.index_select(0, layout.shard_member),
                                      layout.shard_lengths, 0, layout.shard_elements);
    }
    return torch::repeat_interleave(per_param, layout.sizes, 0, layout.end - layout.begin);
  }
  torch::Tensor updated(const torch::Tensor& group_slice) const {
    return sharded ? group_slice.index_select(0, layout.shard_local) : group_slice;
  }
  torch::Tensor state_of(const torch::Tensor& state) const {
    return sharded ? state.index_select(0, layout.shard_state)
                   : state.slice(0, layout.begin, layout.end);
  }
  void put_back(torch::Tensor& state, const torch::Tensor& value) const {
    if (sharded) state.index_copy_(0, layout.shard_state, value);
  }
  void put_back_params() {
    if (sharded) group_params.index_copy_(0, layout.shard_local, P);
  }
};

void sgd_with_tensor_ops(GroupUpdate& u, const FusedGroupConstants& c,
                         const torch::Tensor& was_first, torch::Tensor& state1) {
  torch::Tensor d = c.weight_decay != 0 ? u.G + c.weight_decay * u.P : u.G;
  if (c.momentum != 0) {
    torch::Tensor B = u.state_of(state1);
    torch::Tensor first_e = u.per_element(was_first);
    torch::Tensor next = torch::where(first_e, d, B * c.momentum + (1 - c.dampening) * d);
    B.copy_(torch::where(u.k > 0, next, B));
    u.put_back(state1, B);
    d = c.nesterov ? d + c.momentum * B : B;
  }
  u.P.addcmul_(d, u.k * u.lr_neg);
  u.put_back_params();
}

void adam_with_tensor_ops(GroupUpdate& u, const FusedGroupConstants& c, FusedKind kind,
                          const torch::Tensor& group_steps, torch::Tensor& state1,
                          torch::Tensor& state2) {
  torch::Tensor M = u.state_of(state1), V = u.state_of(state2);
  torch::Tensor counted = group_steps.clamp_min(1);  // never-stepped parameters: k is 0 there
  torch::Tensor bc1 = u.per_element((1 - torch::pow(c.beta1, counted)).to(torch::kFloat));
  torch::Tensor bc2 = u.per_element((1 - torch::pow(c.beta2, counted)).to(torch::kFloat));
  torch::Tensor grad = u.G;
  if (kind == FusedKind::kAdamW) {
    u.P.mul_(1 + (u.lr_neg * c.weight_decay) * u.k);
  } else if (c.weight_decay != 0) {
    grad = u.G + c.weight_decay * u.P;
  }
  M.lerp_(grad, (1 - c.beta1) * u.k);
  V.lerp_(grad * grad, (1 - c.beta2) * u.k);
  torch::Tensor denom = V.sqrt() / bc2.sqrt() + c.eps;
  u.P.addcmul_(M / denom, (u.k / bc1) * u.lr_neg);
  u.put_back(state1, M);
  u.put_back(state2, V);
  u.put_back_params();
}

}  // namespace

// Per group, whole-slice tensor operations whose count does not grow with the number of
// parameters. `keep` (per parameter, 1 = update) folds in both "has a gradient" and the skip
// flag, so nothing is read on the host.
void FusedUpdater::Impl::step_with_tensor_ops(const torch::Tensor& skip) {
  auto& groups = optimizer->param_groups();
  if (layouts.size() != groups.size()) build_layouts();
  for (size_t g = 0; g < groups.size(); ++g) {
    const FusedGroupConstants c = detail::fused_group_constants(kind, groups[g].options(), g);
    if (layouts[g].members.empty()) continue;
    step_group_with_tensor_ops(g, c, skip);
  }
}

void FusedUpdater::Impl::step_group_with_tensor_ops(size_t g, const FusedGroupConstants& c,
                                                    const torch::Tensor& skip) {
  FusedGroupLayout& layout = layouts[g];
  const auto float_options = param_arena.options();
  torch::Tensor G = group_gradients(layout);
  refresh_keep(layout);
  torch::Tensor group_params = param_arena.slice(0, layout.begin, layout.end);
  const torch::Tensor& lr_neg = neg_lr(g, c.lr);
  torch::Tensor keep = layout.keep;
  if (skip.defined()) keep = keep * (1 - skip.to(float_options).reshape({}));
  torch::Tensor group_steps = steps.slice(0, layout.first, layout.last + 1);
  torch::Tensor was_first = group_steps == 0;
  group_steps.add_(keep.to(torch::kDouble));  // every process counts, owner or not
  if (is_sharded && layout.shard_elements == 0) return;
  GroupUpdate u(layout, is_sharded, group_params);
  u.P = u.updated(group_params);
  u.G = gradients_in_pieces ? torch::cat(layout.shard_grads) : u.updated(G);
  u.k = u.per_element(keep);
  // Where nothing may change, the gradient becomes 0: an overflowed (inf / nan) gradient of a
  // skipped step would otherwise leak through the zero weights (0 * inf is nan).
  u.G = torch::where(u.k > 0, u.G, torch::zeros({}, float_options));
  u.lr_neg = lr_neg;
  if (kind == FusedKind::kSGD) {
    sgd_with_tensor_ops(u, c, was_first, state1);
  } else {
    adam_with_tensor_ops(u, c, kind, group_steps, state1, state2);
  }
}

// The group's gradients as one tensor: the arena slice itself when every one lives there (the
// usual case), else gathered into one buffer.
torch::Tensor FusedUpdater::Impl::group_gradients(const FusedGroupLayout& layout) const {
  bool in_arena = true;
  for (int64_t i : layout.members) {
    const torch::Tensor& grad = params[i].grad();
    in_arena = in_arena && (!grad.defined() || detail::aliases(grad, grad_arena, offsets[i]));
  }
  if (in_arena) {
    return grad_arena.slice(0, layout.begin, layout.end);  // unset gradients: slots of zeros
  }
  std::vector<torch::Tensor> grads;
  for (int64_t i : layout.members) {
    const torch::Tensor& grad = params[i].grad();
    grads.push_back(grad.defined() ? usable_grad(grad, params[i]).reshape({-1})
                                   : torch::zeros({numels[i]}, param_arena.options()));
  }
  return torch::cat(grads);
}

// `keep` (1 where a parameter has a gradient) made again only when that pattern changed, so that
// a steady step copies nothing to the device.
void FusedUpdater::Impl::refresh_keep(FusedGroupLayout& layout) const {
  std::vector<bool> has_grad;
  for (int64_t i : layout.members) has_grad.push_back(has_gradient(static_cast<size_t>(i)));
  if (has_grad != layout.has_grad || !layout.keep.defined()) {
    std::vector<float> ones(has_grad.begin(), has_grad.end());
    layout.keep = torch::tensor(ones).to(param_arena.device());
    layout.has_grad = has_grad;
  }
}

}  // namespace accelerant
