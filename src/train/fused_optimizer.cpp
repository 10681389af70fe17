#include "accelerant/fused_optimizer.h"

#include <algorithm>
#include <cmath>
#include <unordered_map>

#include "accelerant/error.h"
#include "base/step_recording.h"
#include "base/tensor_alias.h"
#include "base/text.h"
#include "train/fused_kernels.h"
#include "train/fused_state_format.h"

namespace accelerant {

using detail::FusedKind;
using detail::FusedSegment;

namespace {

const char* kind_name(FusedKind kind) { return detail::fused_kind_name(kind); }
FusedKind kind_of(torch::optim::Optimizer& optimizer) { return detail::fused_kind_of(optimizer); }

// This step's constants of one parameter group, as torch::optim computes them.
struct GroupConstants {
  double lr = 0, weight_decay = 0, beta1 = 0, beta2 = 0, eps = 0;
  double momentum = 0, dampening = 0;
  bool nesterov = false;
};

GroupConstants constants_of(FusedKind kind, torch::optim::OptimizerOptions& options, size_t group) {
  GroupConstants c;
  auto amsgrad_refused = [&] {
    throw Error(detail::str(
        "Parameter group ", group, " sets amsgrad, which the fused ", kind_name(kind),
        " does not implement. Fix: set amsgrad(false), or use torch::optim::", kind_name(kind),
        " unfused."));
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

}  // namespace

struct FusedUpdater::Impl {
  torch::optim::Optimizer* optimizer = nullptr;
  FusedKind kind = FusedKind::kSGD;
  FusedUpdaterOptions options;

  // The packing: parameters in group order, each at an element offset of the arenas.
  std::vector<torch::Tensor> params;
  std::vector<size_t> group_of;
  std::vector<int64_t> offsets, numels;
  torch::Tensor param_arena, grad_arena;
  torch::Tensor state1, state2;  // Adam: exp_avg, exp_avg_sq; SGD: momentum buffers (state2 empty)
  torch::Tensor steps;           // double [params]: updates each parameter has had
  // ZeRO (shard()): the elements this process updates. While sharded, state1 and state2 hold
  // the pieces' elements only, piece after piece (piece k from state_offsets[k]); the step
  // counts stay whole, the same on every process.
  bool is_sharded = false;
  std::vector<FusedShardPiece> pieces;
  std::vector<int64_t> state_offsets;
  int64_t state_numel() const { return is_sharded ? shard_numel : param_arena.numel(); }
  int64_t shard_numel = 0;
  // The pieces carry their gradients (ZeRO stage 2): the parameters' .grad are unset, and every
  // parameter counts as having a gradient (the reducer gave each one, zeros for an unused one).
  bool gradients_in_pieces = false;
  bool has_gradient(size_t i) const { return gradients_in_pieces || params[i].grad().defined(); }

  bool uses_state2() const { return kind != FusedKind::kSGD; }
  bool uses_state1() const {
    if (kind != FusedKind::kSGD) return true;
    for (auto& group : optimizer->param_groups()) {
      if (static_cast<torch::optim::SGDOptions&>(group.options()).momentum() != 0) return true;
    }
    return false;
  }

  std::vector<torch::Tensor> current_params(std::vector<size_t>* groups) const {
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

  bool packed() const {
    const auto now = current_params(nullptr);
    if (now.size() != params.size()) return false;
    for (size_t i = 0; i < now.size(); ++i) {
      if (now[i].unsafeGetTensorImpl() != params[i].unsafeGetTensorImpl()) return false;
      if (!detail::aliases(now[i], param_arena, offsets[i])) return false;
    }
    return true;
  }

  // Packs the parameters into fresh arenas on their device, keeping the state of parameters
  // already known (matched by identity), binding gradients that are unset or in our old arena.
  void pack() {
    std::vector<size_t> groups;
    std::vector<torch::Tensor> now = current_params(&groups);
    std::unordered_map<const c10::TensorImpl*, size_t> before;
    for (size_t i = 0; i < params.size(); ++i) before[params[i].unsafeGetTensorImpl()] = i;
    int64_t total = 0;
    std::vector<int64_t> new_offsets;
    for (size_t i = 0; i < now.size(); ++i) {
      const torch::Tensor& p = now[i];
      if (p.scalar_type() != torch::kFloat || p.is_sparse() || p.layout() != torch::kStrided) {
        throw Error(detail::str(
            "The fused ", kind_name(kind), " takes dense fp32 parameters; parameter ", i,
            " (shape ", p.sizes(), ") is ", p.toString(), ". Fix: keep master weights in ",
            "fp32 (mixed precision does), or use torch::optim::", kind_name(kind), "."));
      }
      if (p.device() != now.front().device()) {
        throw Error(detail::str(
            "The fused ", kind_name(kind), " keeps all parameters in one arena, but they are on ",
            now.front().device(), " and ", p.device(), " (parameter ", i, "). Fix: one ",
            "optimizer per device, or move the model to one device first."));
      }
      for (size_t j = 0; j < i; ++j) {
        if (now[j].unsafeGetTensorImpl() == p.unsafeGetTensorImpl()) {
          throw Error(detail::str("Parameter ", i, " is also parameter ", j,
                                  " of this optimizer (listed twice, ",
                                  "e.g. in two groups). Fix: give each parameter to one group."));
        }
      }
      new_offsets.push_back(total);
      total += p.numel();
    }
    const auto options = now.empty()
                             ? torch::TensorOptions(torch::kFloat)
                             : torch::TensorOptions(torch::kFloat).device(now.front().device());
    torch::Tensor new_params = torch::empty({total}, options);
    torch::Tensor new_grads = torch::zeros({total}, options);  // filled as gradients appear
    // Sharded state is laid out by pieces, not by the arena: it stays as it is. State not made
    // yet is made at its first use (ensure_packed), so that an updater sharded before its first
    // step never holds the whole arena's moments, not even for a moment.
    torch::Tensor new_state1 = is_sharded         ? state1
                               : state1.defined() ? torch::zeros({total}, options)
                                                  : torch::Tensor();
    torch::Tensor new_state2 = is_sharded         ? state2
                               : state2.defined() ? torch::zeros({total}, options)
                                                  : torch::Tensor();
    torch::Tensor new_steps =
        torch::zeros({static_cast<int64_t>(now.size())}, options.dtype(torch::kDouble));
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < now.size(); ++i) {
      torch::Tensor& p = now[i];
      const int64_t n = p.numel();
      new_params.narrow(0, new_offsets[i], n).copy_(p.detach().reshape({-1}));
      auto old = before.find(p.unsafeGetTensorImpl());
      if (old != before.end()) {
        const size_t j = old->second;
        auto carry = [&](torch::Tensor& into, const torch::Tensor& from) {
          if (!is_sharded && into.defined() && from.defined()) {
            into.narrow(0, new_offsets[i], n).copy_(from.narrow(0, offsets[j], n));
          }
        };
        carry(new_state1, state1);
        carry(new_state2, state2);
        new_steps[static_cast<int64_t>(i)].copy_(steps[static_cast<int64_t>(j)]);
      }
      const torch::Tensor& grad = p.grad();
      if (grad.defined() && old != before.end() &&
          detail::aliases(grad, grad_arena, offsets[old->second])) {
        adopt_gradient(p, new_grads, new_offsets[i]);
      }
      p.set_data(detail::alias_into(new_params, new_offsets[i], p.sizes()));
    }
    if (is_sharded && now.size() != params.size() && !params.empty()) {
      throw Error(detail::str("The sharded fused ", kind_name(kind), " was made for ",
                              params.size(), " parameters; the optimizer now has ", now.size(),
                              ". Fix: add parameter groups ",
                              "before accelerator.prepare, which shards the update (ZeRO)."));
    }
    params = std::move(now);
    group_of = std::move(groups);
    offsets = std::move(new_offsets);
    numels.clear();
    for (const auto& p : params) numels.push_back(p.numel());
    param_arena = new_params, grad_arena = new_grads, state1 = new_state1, state2 = new_state2,
    steps = new_steps;
    layouts.clear();
  }

  // Gradients are bound into the arena once they exist (an unset .grad stays unset, so a
  // parameter without gradients is skipped as torch::optim skips it). A gradient that is a slice
  // of a larger buffer (the reducer's bucket) stays where it is and is read in place.
  static bool standalone(const torch::Tensor& grad) {
    return grad.defined() && grad.layout() == torch::kStrided && grad.storage_offset() == 0 &&
           grad.storage().nbytes() == static_cast<size_t>(grad.numel()) * grad.element_size();
  }

  static void adopt_gradient(torch::Tensor& param, const torch::Tensor& arena, int64_t offset) {
    torch::Tensor bound = detail::alias_into(arena, offset, param.sizes());
    bound.copy_(param.grad());
    param.mutable_grad() = bound;
  }

  void adopt_new_gradients() {
    for (size_t i = 0; i < params.size(); ++i) {
      const torch::Tensor& grad = params[i].grad();
      if (standalone(grad) && grad.scalar_type() == torch::kFloat &&
          grad.device() == grad_arena.device() && !detail::aliases(grad, grad_arena, offsets[i])) {
        adopt_gradient(params[i], grad_arena, offsets[i]);
      }
    }
  }

  void ensure_packed() {
    if (!packed()) pack();
    // First use, or momentum turned on.
    if (uses_state1() && !state1.defined())
      state1 = torch::zeros({state_numel()}, param_arena.options());
    if (uses_state2() && !state2.defined())
      state2 = torch::zeros({state_numel()}, param_arena.options());
  }

  // A gradient as fp32 contiguous memory on the arena's device: itself when it already is.
  static torch::Tensor usable_grad(const torch::Tensor& grad, const torch::Tensor& param) {
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

  void step_on_cpu() {
    std::vector<FusedSegment> segments;
    std::vector<torch::Tensor> converted;  // keeps converted gradients alive during the update
    auto* step_counts = steps.data_ptr<double>();
    auto& groups = optimizer->param_groups();
    std::vector<GroupConstants> constants;
    for (size_t g = 0; g < groups.size(); ++g)
      constants.push_back(constants_of(kind, groups[g].options(), g));
    // Every parameter with a gradient counts a step, owned here or not, so that the counts (and
    // the bias corrections) are the same on every process. Undefined: no step for it.
    std::vector<torch::Tensor> grads(params.size());
    for (size_t i = 0; i < params.size(); ++i) {
      const torch::Tensor& grad = params[i].grad();
      if (!grad.defined() || numels[i] == 0) continue;
      grads[i] = usable_grad(grad, params[i]);
      if (!grads[i].is_same(grad)) converted.push_back(grads[i]);
    }
    // Unsharded, parameter k is one piece of itself, with its state at its arena offset.
    const size_t count = is_sharded ? pieces.size() : params.size();
    for (size_t k = 0; k < count; ++k) {
      const FusedShardPiece piece =
          is_sharded ? pieces[k]
                     : FusedShardPiece{static_cast<int64_t>(k), 0, numels[k], torch::Tensor()};
      const auto i = static_cast<size_t>(piece.param);
      if (!has_gradient(i) || piece.length == 0) continue;
      const torch::Tensor& g = grads[i];
      const int64_t state_at = is_sharded ? state_offsets[k] : offsets[i];
      const GroupConstants& c = constants[group_of[i]];
      FusedSegment s;
      s.param = param_arena.data_ptr<float>() + offsets[i] + piece.begin;
      s.grad =
          piece.grad.defined() ? piece.grad.data_ptr<float>() : g.data_ptr<float>() + piece.begin;
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
      segments.push_back(s);
    }
    for (size_t i = 0; i < params.size(); ++i) {
      if (has_gradient(i)) step_counts[i] += 1;
    }
    detail::run_fused_update(kind, segments);
  }

  // What the device path needs to know of a parameter group, kept from one step to the next so
  // that a step issues no host-to-device copy (and so no synchronisation) while nothing changes.
  struct GroupLayout {
    std::vector<int64_t> members;  // parameters with elements, in arena order
    int64_t first = 0, last = 0;   // first and last member
    int64_t begin = 0, end = 0;    // their elements in the arena
    torch::Tensor sizes;           // int64 [members] on the device
    std::vector<bool> has_grad;    // the pattern `keep` was made for
    torch::Tensor keep;            // float [members] on the device: 1 where a gradient exists
    torch::Tensor neg_lr;          // float 0-dim on the device: -lr, what the update reads
    double lr_in_tensor = 0;       // the lr neg_lr holds
    // Sharded (ZeRO): this process's elements of the group, the pieces' one after the other. The
    // update gathers them by index and scatters the result back, so that its operations stay
    // those of one group however many pieces there are.
    int64_t shard_elements = 0;
    torch::Tensor shard_local;    // int64 [shard_elements]: element index in [begin, end)
    torch::Tensor shard_state;    // int64 [shard_elements]: element index in state1 / state2
    torch::Tensor shard_member;   // int64 [pieces]: the piece's parameter, as a member position
    torch::Tensor shard_lengths;  // int64 [pieces]
    std::vector<torch::Tensor> shard_grads;  // gradients_in_pieces: the pieces' gradients
  };
  std::vector<GroupLayout> layouts;  // rebuilt after every packing

  void build_layouts() {
    layouts.clear();
    const auto& groups = optimizer->param_groups();
    for (size_t g = 0; g < groups.size(); ++g) {
      GroupLayout layout;
      std::vector<int64_t> sizes;
      for (size_t i = 0; i < params.size(); ++i) {
        if (group_of[i] == g && numels[i] > 0) {
          layout.members.push_back(static_cast<int64_t>(i));
          sizes.push_back(numels[i]);
        }
      }
      if (!layout.members.empty()) {
        layout.first = layout.members.front(), layout.last = layout.members.back();
        layout.begin = offsets[layout.first],
        layout.end = offsets[layout.last] + numels[layout.last];
        layout.sizes = torch::tensor(sizes, torch::kLong).to(param_arena.device());
        if (is_sharded) add_shard_runs(layout);
      }
      layouts.push_back(std::move(layout));
    }
  }

  void add_shard_runs(GroupLayout& layout) const {
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
  const torch::Tensor& neg_lr(size_t g, double lr) {
    GroupLayout& layout = layouts[g];
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

  void refresh_lr(size_t g) {
    if (g >= layouts.size() || !layouts[g].neg_lr.defined())
      return;  // packed again since: the graph is stale
    GroupLayout& layout = layouts[g];
    const double lr = constants_of(kind, optimizer->param_groups()[g].options(), g).lr;
    layout.neg_lr.fill_(-lr);
    layout.lr_in_tensor = lr;
  }

  // The device path: per group, whole-slice tensor operations whose count does not grow with the
  // number of parameters. `keep` (per parameter, 1 = update) folds in both "has a gradient" and
  // the skip flag, so nothing is read on the host.
  void step_with_tensor_ops(const torch::Tensor& skip) {
    auto& groups = optimizer->param_groups();
    const auto float_options = param_arena.options();
    if (layouts.size() != groups.size()) build_layouts();
    for (size_t g = 0; g < groups.size(); ++g) {
      const GroupConstants c = constants_of(kind, groups[g].options(), g);
      GroupLayout& layout = layouts[g];
      if (layout.members.empty()) continue;
      const int64_t begin = layout.begin, end = layout.end, elements = end - begin;
      // Gradients: the arena slice itself when every one lives there (the usual case), else
      // gathered into one buffer.
      std::vector<bool> has_grad;
      bool in_arena = true;
      for (int64_t i : layout.members) {
        const torch::Tensor& grad = params[i].grad();
        has_grad.push_back(has_gradient(static_cast<size_t>(i)));
        in_arena = in_arena && (!grad.defined() || detail::aliases(grad, grad_arena, offsets[i]));
      }
      torch::Tensor G;
      if (in_arena) {
        G = grad_arena.slice(0, begin, end);  // undefined gradients: their slots hold zeros
      } else {
        std::vector<torch::Tensor> grads;
        for (int64_t i : layout.members) {
          const torch::Tensor& grad = params[i].grad();
          grads.push_back(grad.defined() ? usable_grad(grad, params[i]).reshape({-1})
                                         : torch::zeros({numels[i]}, float_options));
        }
        G = torch::cat(grads);
      }
      if (has_grad != layout.has_grad || !layout.keep.defined()) {
        std::vector<float> ones(has_grad.begin(), has_grad.end());
        layout.keep = torch::tensor(ones).to(float_options.device());
        layout.has_grad = has_grad;
      }
      torch::Tensor group_params = param_arena.slice(0, begin, end);
      const torch::Tensor& lr_neg = neg_lr(g, c.lr);
      torch::Tensor keep = layout.keep;
      if (skip.defined()) keep = keep * (1 - skip.to(float_options).reshape({}));
      const torch::Tensor& sizes = layout.sizes;
      // output_size: without it repeat_interleave reads the sizes' sum on the host.
      auto per_element = [&](const torch::Tensor& per_param) {
        if (is_sharded) {
          return torch::repeat_interleave(per_param.index_select(0, layout.shard_member),
                                          layout.shard_lengths, 0, layout.shard_elements);
        }
        return torch::repeat_interleave(per_param, sizes, 0, elements);
      };
      torch::Tensor group_steps = steps.slice(0, layout.first, layout.last + 1);
      torch::Tensor was_first = group_steps == 0;
      group_steps.add_(keep.to(torch::kDouble));  // every process counts, owner or not
      if (is_sharded && layout.shard_elements == 0) continue;
      // The elements updated here: the group's slices, or copies of this process's pieces that
      // put_back() writes back.
      auto updated = [&](const torch::Tensor& group_slice) {
        return is_sharded ? group_slice.index_select(0, layout.shard_local) : group_slice;
      };
      auto state_of = [&](const torch::Tensor& state) {
        return is_sharded ? state.index_select(0, layout.shard_state) : state.slice(0, begin, end);
      };
      auto put_back = [&](torch::Tensor& state, const torch::Tensor& value) {
        if (is_sharded) state.index_copy_(0, layout.shard_state, value);
      };
      torch::Tensor P = updated(group_params);
      G = gradients_in_pieces ? torch::cat(layout.shard_grads) : updated(G);
      auto put_back_params = [&] {
        if (is_sharded) group_params.index_copy_(0, layout.shard_local, P);
      };
      torch::Tensor k = per_element(keep);
      // Where nothing may change, the gradient becomes 0: an overflowed (inf / nan) gradient of a
      // skipped step would otherwise leak through the zero weights (0 * inf is nan).
      G = torch::where(k > 0, G, torch::zeros({}, float_options));
      if (kind == FusedKind::kSGD) {
        torch::Tensor d = c.weight_decay != 0 ? G + c.weight_decay * P : G;
        if (c.momentum != 0) {
          torch::Tensor B = state_of(state1);
          torch::Tensor first_e = per_element(was_first);
          torch::Tensor next = torch::where(first_e, d, B * c.momentum + (1 - c.dampening) * d);
          B.copy_(torch::where(k > 0, next, B));
          put_back(state1, B);
          d = c.nesterov ? d + c.momentum * B : B;
        }
        P.addcmul_(d, k * lr_neg);
        put_back_params();
        continue;
      }
      torch::Tensor M = state_of(state1), V = state_of(state2);
      torch::Tensor counted = group_steps.clamp_min(1);  // never-stepped parameters: k is 0 there
      torch::Tensor bc1 = per_element((1 - torch::pow(c.beta1, counted)).to(torch::kFloat));
      torch::Tensor bc2 = per_element((1 - torch::pow(c.beta2, counted)).to(torch::kFloat));
      torch::Tensor grad = G;
      if (kind == FusedKind::kAdamW) {
        P.mul_(1 + (lr_neg * c.weight_decay) * k);
      } else if (c.weight_decay != 0) {
        grad = G + c.weight_decay * P;
      }
      M.lerp_(grad, (1 - c.beta1) * k);
      V.lerp_(grad * grad, (1 - c.beta2) * k);
      torch::Tensor denom = V.sqrt() / bc2.sqrt() + c.eps;
      P.addcmul_(M / denom, (k / bc1) * lr_neg);
      put_back(state1, M);
      put_back(state2, V);
      put_back_params();
    }
  }

  // The whole-arena state from the sharded one (zeros outside the pieces), or itself.
  torch::Tensor whole_state(const torch::Tensor& state) const {
    if (!is_sharded || !state.defined()) return state;
    torch::Tensor whole = torch::zeros_like(param_arena);
    for (size_t k = 0; k < pieces.size(); ++k) {
      whole.narrow(0, offsets[pieces[k].param] + pieces[k].begin, pieces[k].length)
          .copy_(state.narrow(0, state_offsets[k], pieces[k].length));
    }
    return whole;
  }

  // The pieces' elements of a whole-arena state, piece after piece.
  torch::Tensor pieces_of(const torch::Tensor& whole) const {
    if (!whole.defined()) return whole;
    torch::Tensor out = torch::empty({shard_numel}, whole.options());
    for (size_t k = 0; k < pieces.size(); ++k) {
      out.narrow(0, state_offsets[k], pieces[k].length)
          .copy_(whole.narrow(0, offsets[pieces[k].param] + pieces[k].begin, pieces[k].length));
    }
    return out;
  }

  void shard(std::vector<FusedShardPiece> new_pieces) {
    torch::NoGradGuard no_grad;
    if (!packed()) pack();  // not ensure_packed: it would make the whole state first
    std::vector<std::pair<int64_t, int64_t>> ranges;  // arena [begin, end) of each piece
    for (const auto& piece : new_pieces) {
      const bool inside = piece.param >= 0 && piece.param < static_cast<int64_t>(params.size()) &&
                          piece.begin >= 0 && piece.length >= 0 &&
                          piece.begin + piece.length <= numels[piece.param];
      if (!inside) {
        throw Error(detail::str(
            "FusedUpdater::shard: the piece {param ", piece.param, ", begin ", piece.begin,
            ", length ", piece.length, "} is outside the optimizer's parameters (", params.size(),
            " of them",
            piece.param >= 0 && piece.param < static_cast<int64_t>(params.size())
                ? detail::str("; that one has ", numels[piece.param], " elements")
                : std::string(),
            "). Fix: take the pieces from GradientReducer::shard_pieces for this optimizer."));
      }
      if (piece.grad.defined() &&
          (piece.grad.scalar_type() != torch::kFloat || !piece.grad.is_contiguous() ||
           piece.grad.numel() != piece.length || piece.grad.device() != param_arena.device())) {
        throw Error(detail::str(
            "FusedUpdater::shard: the gradient of piece {param ", piece.param, ", begin ",
            piece.begin, ", length ", piece.length, "} is ",
            c10::toString(piece.grad.scalar_type()), " with ", piece.grad.numel(), " elements on ",
            piece.grad.device(), "; it must be contiguous fp32 with `length` elements on ",
            param_arena.device(), ". Fix: take the pieces from GradientReducer::shard_pieces."));
      }
      ranges.emplace_back(offsets[piece.param] + piece.begin,
                          offsets[piece.param] + piece.begin + piece.length);
    }
    std::sort(ranges.begin(), ranges.end());
    for (size_t k = 1; k < ranges.size(); ++k) {
      if (ranges[k].first < ranges[k - 1].second) {
        throw Error(detail::str("FusedUpdater::shard: two pieces overlap at arena element ",
                                ranges[k].first,
                                ". Fix: give each element to one piece (GradientReducer::"
                                "shard_pieces does)."));
      }
    }
    const auto carrying = std::count_if(new_pieces.begin(), new_pieces.end(),
                                        [](const FusedShardPiece& p) { return p.grad.defined(); });
    if (carrying != 0 && carrying != static_cast<std::ptrdiff_t>(new_pieces.size())) {
      // The update reads either every gradient from the pieces or every one from .grad.
      throw Error(detail::str(
          "FusedUpdater::shard: ", carrying, " of the ", new_pieces.size(),
          " pieces carry a gradient; it must be all of them (ZeRO stage 2) or none. Fix: take "
          "the pieces from GradientReducer::shard_pieces, which gives all or none."));
    }
    const torch::Tensor whole1 = whole_state(state1), whole2 = whole_state(state2);
    const bool carry = carrying != 0;
    pieces = std::move(new_pieces);
    state_offsets.clear();
    shard_numel = 0;
    for (const auto& piece : pieces) {
      state_offsets.push_back(shard_numel);
      shard_numel += piece.length;
    }
    is_sharded = true;
    gradients_in_pieces = carry;
    layouts.clear();  // the device path's layouts now need the shard's runs
    state1 = pieces_of(whole1);
    state2 = pieces_of(whole2);
  }

  void step(const torch::Tensor& skip) {
    torch::NoGradGuard no_grad;
    ensure_packed();
    adopt_new_gradients();
    // A recorded step takes the device path on the CPU too: the CPU loop reads the skip flag and
    // computes the step sizes on the host, which a replay would not repeat.
    if (param_arena.is_cpu() && !options.tensor_ops_on_cpu() && !detail::recording_step()) {
      if (skip.defined() && skip.item<double>() != 0)
        return;  // on the CPU reading it costs nothing
      step_on_cpu();
    } else {
      step_with_tensor_ops(skip);
    }
  }
};

FusedUpdater::FusedUpdater(torch::optim::Optimizer& optimizer, FusedUpdaterOptions options)
    : impl_(std::make_unique<Impl>()) {
  impl_->optimizer = &optimizer;
  impl_->kind = kind_of(optimizer);
  impl_->options = options;
  for (size_t g = 0; g < optimizer.param_groups().size(); ++g) {
    constants_of(impl_->kind, optimizer.param_groups()[g].options(),
                 g);  // refuses amsgrad now, not at step 1
  }
  if (!optimizer.state().empty()) {
    throw Error(detail::str(
        "This ", kind_name(impl_->kind), " already has state (it has stepped or loaded a ",
        "checkpoint), which the fused update would not continue from. Fix: create the ",
        "fused update before the first step, and load checkpoints through it."));
  }
  impl_->pack();
}

FusedUpdater::~FusedUpdater() = default;

void FusedUpdater::shard(std::vector<FusedShardPiece> pieces) { impl_->shard(std::move(pieces)); }

const std::vector<FusedShardPiece>& FusedUpdater::shard_pieces() const { return impl_->pieces; }

bool FusedUpdater::sharded() const { return impl_->is_sharded; }

void FusedUpdater::step() { impl_->step(torch::Tensor()); }

void FusedUpdater::step_unless(const torch::Tensor& skip) {
  if (!skip.defined() || skip.numel() != 1) {
    throw Error(detail::str(
        "step_unless needs a one-element skip flag (e.g. GradScaler::found_inf()); got ",
        skip.defined() ? detail::str("shape ", skip.sizes()) : std::string("an undefined tensor"),
        "."));
  }
  impl_->step(skip);
}

namespace {
const char* kKind = detail::kFusedKindKey;
const char* kNumels = detail::kFusedNumelsKey;
const char* kSteps = detail::kFusedStepsKey;
const char* kState1 = detail::kFusedState1Key;
const char* kState2 = detail::kFusedState2Key;
// A shard: [pieces, 3] int64 rows of (parameter, begin, length); its states hold those elements.
const char* kPieces = detail::kFusedPiecesKey;

torch::Tensor pieces_tensor(const std::vector<FusedShardPiece>& pieces) {
  torch::Tensor t = torch::empty({static_cast<int64_t>(pieces.size()), 3}, torch::kLong);
  auto a = t.accessor<int64_t, 2>();
  for (size_t k = 0; k < pieces.size(); ++k) {
    a[k][0] = pieces[k].param, a[k][1] = pieces[k].begin, a[k][2] = pieces[k].length;
  }
  return t;
}
}  // namespace

void FusedUpdater::save(torch::serialize::OutputArchive& archive) const {
  impl_->ensure_packed();
  archive.write(kKind, torch::tensor(static_cast<int64_t>(impl_->kind)));
  archive.write(kNumels, torch::tensor(impl_->numels));
  archive.write(kSteps, impl_->steps);
  if (impl_->is_sharded) archive.write(kPieces, pieces_tensor(impl_->pieces));
  if (impl_->state1.defined()) archive.write(kState1, impl_->state1);
  if (impl_->state2.defined()) archive.write(kState2, impl_->state2);
}

void FusedUpdater::load(torch::serialize::InputArchive& archive) {
  Impl& s = *impl_;
  s.ensure_packed();
  torch::Tensor kind, numels, steps, state1, state2;
  archive.read(kKind, kind);
  archive.read(kNumels, numels);
  archive.read(kSteps, steps);
  const auto saved_kind = static_cast<FusedKind>(kind.item<int64_t>());
  if (saved_kind != s.kind) {
    throw Error(detail::str("The saved state is a fused ", kind_name(saved_kind),
                            "'s, this is a fused ", kind_name(s.kind),
                            ". Fix: build the optimizer the saved run used."));
  }
  const std::vector<int64_t> saved(numels.data_ptr<int64_t>(),
                                   numels.data_ptr<int64_t>() + numels.numel());
  if (saved != s.numels) {
    throw Error(detail::str("The saved fused state is for ", saved.size(), " parameters of sizes [",
                            detail::join(saved, ", "), "], this optimizer has ", s.numels.size(),
                            " of sizes [", detail::join(s.numels, ", "),
                            "]. Fix: build the model and parameter groups as ",
                            "the saved run did."));
  }
  torch::Tensor saved_pieces;
  const bool own_shard = archive.try_read(kPieces, saved_pieces) && s.is_sharded &&
                         saved_pieces.equal(pieces_tensor(s.pieces));
  if (saved_pieces.defined() && !own_shard) {
    throw Error(
        "This fused optimizer state is one process's shard (saved under ZeRO); alone it lacks "
        "the other processes' elements. Fix: merge the shards first (merge_optimizer_shards; "
        "Accelerator::load_state does it, and `accelerant checkpoint merge` on the command line).");
  }
  const bool has1 = archive.try_read(kState1, state1), has2 = archive.try_read(kState2, state2);
  torch::NoGradGuard no_grad;
  if (s.uses_state2() && (!has1 || !has2))
    throw Error("The saved fused Adam state lacks its moments. Fix: save it again.");
  // Saved whole, a sharded updater keeps its pieces of it; its own shard it takes as it is.
  if (s.is_sharded && !own_shard) state1 = s.pieces_of(state1), state2 = s.pieces_of(state2);
  s.steps.copy_(steps);
  if (s.uses_state2()) s.state2.copy_(state2);
  if (has1) {
    if (!s.state1.defined()) s.state1 = torch::zeros({s.state_numel()}, s.param_arena.options());
    s.state1.copy_(state1);
  } else if (s.state1.defined()) {
    s.state1.zero_();
  }
}

void merge_optimizer_shards(const std::vector<torch::serialize::InputArchive*>& shards,
                            torch::serialize::OutputArchive& merged) {
  if (shards.empty()) throw Error("merge_optimizer_shards: no shards given.");
  torch::Tensor kind0, numels0, steps_all, whole1, whole2;
  std::vector<int64_t> sizes, starts;
  std::vector<int64_t> covered;  // per parameter, elements that some shard holds
  for (size_t r = 0; r < shards.size(); ++r) {
    torch::serialize::InputArchive& a = *shards[r];
    torch::Tensor kind, numels, steps, pieces, state1, state2;
    a.read(kKind, kind);
    a.read(kNumels, numels);
    a.read(kSteps, steps);
    if (!a.try_read(kPieces, pieces)) {
      throw Error(detail::str("merge_optimizer_shards: archive ", r,
                              " is a whole optimizer state, not a shard. Fix: pass the shards "
                              "that each process saved under ZeRO, in rank order."));
    }
    const bool has1 = a.try_read(kState1, state1), has2 = a.try_read(kState2, state2);
    if (r == 0) {
      kind0 = kind, numels0 = numels, steps_all = steps.clone();
      sizes.assign(numels.data_ptr<int64_t>(), numels.data_ptr<int64_t>() + numels.numel());
      int64_t total = 0;
      for (int64_t n : sizes) starts.push_back(total), total += n;
      covered.assign(sizes.size(), 0);
      if (has1) whole1 = torch::zeros({total}, torch::kFloat);
      if (has2) whole2 = torch::zeros({total}, torch::kFloat);
    } else if (!kind.equal(kind0) || !numels.equal(numels0)) {
      throw Error(detail::str("merge_optimizer_shards: shard ", r,
                              " was saved by another optimizer (kind or parameter sizes differ "
                              "from shard 0's). Fix: merge the shards of one checkpoint."));
    } else if (!steps.equal(steps_all)) {
      // Every process counts every parameter's updates, owner or not: the shards of one
      // checkpoint agree on them. Differing counts mean a shard of another step.
      const auto differ = (steps != steps_all).nonzero();
      const int64_t p = differ[0][0].item<int64_t>();
      throw Error(detail::str(
          "merge_optimizer_shards: shard ", r, " was saved at another step than ",
          "shard 0: parameter ", p, " has had ", static_cast<int64_t>(steps[p].item<double>()),
          " updates there and ", static_cast<int64_t>(steps_all[p].item<double>()),
          " in shard 0. Likely cause: a shard of another checkpoint was put "
          "in this one. Fix: use the shards one save_state wrote, together "
          "(or an older checkpoint)."));
    }
    if (has1 != whole1.defined() || has2 != whole2.defined()) {
      throw Error(detail::str("merge_optimizer_shards: shard ", r,
                              " holds other state buffers than shard 0. Fix: merge the shards of "
                              "one checkpoint."));
    }
    auto rows = pieces.accessor<int64_t, 2>();
    int64_t at = 0;
    for (int64_t k = 0; k < pieces.size(0); ++k) {
      const int64_t p = rows[k][0], begin = rows[k][1], length = rows[k][2];
      if (p < 0 || p >= static_cast<int64_t>(sizes.size()) || begin < 0 ||
          begin + length > sizes[p]) {
        throw Error(detail::str("merge_optimizer_shards: shard ", r, " has a piece outside its ",
                                "parameters. The file is damaged; use another checkpoint."));
      }
      if (has1) whole1.narrow(0, starts[p] + begin, length).copy_(state1.narrow(0, at, length));
      if (has2) whole2.narrow(0, starts[p] + begin, length).copy_(state2.narrow(0, at, length));
      covered[p] += length;
      at += length;
    }
  }
  const double* step_counts = steps_all.data_ptr<double>();
  for (size_t p = 0; p < sizes.size(); ++p) {
    if (step_counts[p] > 0 && covered[p] != sizes[p]) {
      throw Error(detail::str("merge_optimizer_shards: parameter ", p, " has ", sizes[p],
                              " elements, but the shards hold the state of ", covered[p],
                              ". Likely cause: a rank's shard is missing. Fix: pass every "
                              "rank's shard, in rank order."));
    }
  }
  merged.write(kKind, kind0);
  merged.write(kNumels, numels0);
  merged.write(kSteps, steps_all);
  if (whole1.defined()) merged.write(kState1, whole1);
  if (whole2.defined()) merged.write(kState2, whole2);
}

int64_t FusedUpdater::numel() const { return impl_->param_arena.numel(); }

bool FusedUpdater::parameters_packed() const { return impl_->packed(); }

torch::optim::Optimizer& FusedUpdater::optimizer() const { return *impl_->optimizer; }

FusedUpdater* fused_updater_of(torch::optim::Optimizer& optimizer) {
  auto* fused = dynamic_cast<FusedOptimizerBase*>(&optimizer);
  return fused ? &fused->updater() : nullptr;
}

}  // namespace accelerant
