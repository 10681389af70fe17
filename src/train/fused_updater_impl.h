// FusedUpdater's machinery, shared by the files that implement it, one concept each:
//   fused_arena.cpp      the parameters packed into one flat arena, gradients bound into another
//   fused_step.cpp       the update: the CPU loop, and the whole-arena tensor operations
//   fused_shards.cpp     ZeRO: restricting the update to this process's pieces, merging shards
//   fused_optimizer.cpp  the public class over them: construction, step, save and load
// Private to src/train.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "accelerant/fused_optimizer.h"
#include "train/fused_kernels.h"

namespace accelerant {
namespace detail {

/// This step's constants of one parameter group, as torch::optim computes them.
struct FusedGroupConstants {
  double lr = 0, weight_decay = 0, beta1 = 0, beta2 = 0, eps = 0;
  double momentum = 0, dampening = 0;
  bool nesterov = false;
};

/// Group `group`'s constants from its options; throws Error for amsgrad, which the fused
/// update does not implement.
FusedGroupConstants fused_group_constants(FusedKind kind, torch::optim::OptimizerOptions& options,
                                          size_t group);

/// What the device path needs to know of a parameter group, kept from one step to the next so
/// that a step issues no host-to-device copy (and so no synchronisation) while nothing changes.
struct FusedGroupLayout {
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

}  // namespace detail

struct FusedUpdater::Impl {
  torch::optim::Optimizer* optimizer = nullptr;
  detail::FusedKind kind = detail::FusedKind::kSGD;
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
  // The device path's per-group layouts; rebuilt after every packing.
  std::vector<detail::FusedGroupLayout> layouts;

  bool uses_state2() const { return kind != detail::FusedKind::kSGD; }
  bool uses_state1() const;

  // The arena (fused_arena.cpp).
  std::vector<torch::Tensor> current_params(std::vector<size_t>* groups) const;
  bool packed() const;
  // Packs the parameters into fresh arenas on their device, keeping the state of parameters
  // already known (matched by identity), binding gradients that are unset or in our old arena.
  void pack();
  void check_packable(const std::vector<torch::Tensor>& now) const;
  // The arenas a packing fills, made before the parameters move into them.
  struct Arenas {
    std::vector<int64_t> offsets;
    torch::Tensor params, grads, state1, state2, steps;
  };
  Arenas fresh_arenas(const std::vector<torch::Tensor>& now) const;
  void move_into(torch::Tensor& param, size_t i, const Arenas& fresh,
                 const std::unordered_map<const c10::TensorImpl*, size_t>& before) const;
  void take_arenas(std::vector<torch::Tensor> now, std::vector<size_t> groups, Arenas fresh);
  static bool standalone(const torch::Tensor& grad);
  static void adopt_gradient(torch::Tensor& param, const torch::Tensor& arena, int64_t offset);
  void adopt_new_gradients();
  void ensure_packed();
  static torch::Tensor usable_grad(const torch::Tensor& grad, const torch::Tensor& param);

  // The step (fused_step.cpp).
  void step(const torch::Tensor& skip);
  void step_on_cpu();
  std::vector<torch::Tensor> cpu_gradients(std::vector<torch::Tensor>& converted) const;
  detail::FusedSegment segment_of(const FusedShardPiece& piece, int64_t state_at,
                                  const torch::Tensor& grad,
                                  const detail::FusedGroupConstants& c) const;
  void build_layouts();
  void add_shard_runs(detail::FusedGroupLayout& layout) const;
  const torch::Tensor& neg_lr(size_t g, double lr);
  void refresh_lr(size_t g);
  void step_with_tensor_ops(const torch::Tensor& skip);
  void step_group_with_tensor_ops(size_t g, const detail::FusedGroupConstants& c,
                                  const torch::Tensor& skip);
  torch::Tensor group_gradients(const detail::FusedGroupLayout& layout) const;
  void refresh_keep(detail::FusedGroupLayout& layout) const;

  // ZeRO shards (fused_shards.cpp).
  void shard(std::vector<FusedShardPiece> new_pieces);
  void check_pieces(const std::vector<FusedShardPiece>& new_pieces) const;
  torch::Tensor whole_state(const torch::Tensor& state) const;
  torch::Tensor pieces_of(const torch::Tensor& whole) const;
};

}  // namespace accelerant
