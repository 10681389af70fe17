// ZeRO for the fused update: restricting it to the pieces of the parameters this process owns
// (its state then holds those elements only), and merging the shards that the processes saved
// into the whole state (note "Fused state form" in fused_state_format.h).
#include <algorithm>

#include "accelerant/error.h"
#include "base/text.h"
#include "train/fused_state_format.h"
#include "train/fused_updater_impl.h"

namespace accelerant {

// The whole-arena state from the sharded one (zeros outside the pieces), or itself.
torch::Tensor FusedUpdater::Impl::whole_state(const torch::Tensor& state) const {
  if (!is_sharded || !state.defined()) return state;
  torch::Tensor whole = torch::zeros_like(param_arena);
  for (size_t k = 0; k < pieces.size(); ++k) {
    whole.narrow(0, offsets[pieces[k].param] + pieces[k].begin, pieces[k].length)
        .copy_(state.narrow(0, state_offsets[k], pieces[k].length));
  }
  return whole;
}

// The pieces' elements of a whole-arena state, piece after piece.
torch::Tensor FusedUpdater::Impl::pieces_of(const torch::Tensor& whole) const {
  if (!whole.defined()) return whole;
  torch::Tensor out = torch::empty({shard_numel}, whole.options());
  for (size_t k = 0; k < pieces.size(); ++k) {
    out.narrow(0, state_offsets[k], pieces[k].length)
        .copy_(whole.narrow(0, offsets[pieces[k].param] + pieces[k].begin, pieces[k].length));
  }
  return out;
}

void FusedUpdater::Impl::shard(std::vector<FusedShardPiece> new_pieces) {
  torch::NoGradGuard no_grad;
  if (!packed()) pack();  // not ensure_packed: it would make the whole state first
  check_pieces(new_pieces);
  const bool carry = std::any_of(new_pieces.begin(), new_pieces.end(),
                                 [](const FusedShardPiece& p) { return p.grad.defined(); });
  const torch::Tensor whole1 = whole_state(state1), whole2 = whole_state(state2);
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

namespace {

void refuse_piece_outside(const FusedShardPiece& piece, const std::vector<int64_t>& numels) {
  const bool known_param = piece.param >= 0 && piece.param < static_cast<int64_t>(numels.size());
  throw Error(detail::str(
      "FusedUpdater::shard: the piece {param ", piece.param, ", begin ", piece.begin, ", length ",
      piece.length, "} is outside the optimizer's parameters (", numels.size(), " of them",
      known_param ? detail::str("; that one has ", numels[piece.param], " elements")
                  : std::string(),
      "). Fix: take the pieces from GradientReducer::shard_pieces for this optimizer."));
}

void refuse_piece_gradient(const FusedShardPiece& piece, const torch::Device& arena_device) {
  throw Error(detail::str("FusedUpdater::shard: the gradient of piece {param ", piece.param,
                          ", begin ", piece.begin, ", length ", piece.length, "} is ",
                          c10::toString(piece.grad.scalar_type()), " with ", piece.grad.numel(),
                          " elements on ", piece.grad.device(),
                          "; it must be contiguous fp32 with `length` elements on ", arena_device,
                          ". Fix: take the pieces from GradientReducer::shard_pieces."));
}

}  // namespace

// Each piece inside its parameter, with a usable gradient if any; no two overlapping; all or
// none carrying a gradient.
void FusedUpdater::Impl::check_pieces(const std::vector<FusedShardPiece>& new_pieces) const {
  std::vector<std::pair<int64_t, int64_t>> ranges;  // arena [begin, end) of each piece
  for (const auto& piece : new_pieces) {
    const bool inside = piece.param >= 0 && piece.param < static_cast<int64_t>(params.size()) &&
                        piece.begin >= 0 && piece.length >= 0 &&
                        piece.begin + piece.length <= numels[piece.param];
    if (!inside) refuse_piece_outside(piece, numels);
    if (piece.grad.defined() &&
        (piece.grad.scalar_type() != torch::kFloat || !piece.grad.is_contiguous() ||
         piece.grad.numel() != piece.length || piece.grad.device() != param_arena.device())) {
      refuse_piece_gradient(piece, param_arena.device());
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
}

namespace {

// What one process's shard holds.
struct ShardContents {
  torch::Tensor kind, numels, steps, pieces, state1, state2;
  bool has1 = false, has2 = false;
};

ShardContents read_shard(torch::serialize::InputArchive& a, size_t r) {
  ShardContents shard;
  a.read(detail::kFusedKindKey, shard.kind);
  a.read(detail::kFusedNumelsKey, shard.numels);
  a.read(detail::kFusedStepsKey, shard.steps);
  if (!a.try_read(detail::kFusedPiecesKey, shard.pieces)) {
    throw Error(detail::str("merge_optimizer_shards: archive ", r,
                            " is a whole optimizer state, not a shard. Fix: pass the shards "
                            "that each process saved under ZeRO, in rank order."));
  }
  shard.has1 = a.try_read(detail::kFusedState1Key, shard.state1);
  shard.has2 = a.try_read(detail::kFusedState2Key, shard.state2);
  return shard;
}

// The whole state as the shards fill it in.
struct MergedState {
  torch::Tensor kind, numels, steps, whole1, whole2;
  std::vector<int64_t> sizes, starts;
  std::vector<int64_t> covered;  // per parameter, elements that some shard holds

  // Shard 0 sets the kind, the parameters and the step counts the others must agree with.
  void start_from(const ShardContents& first) {
    kind = first.kind, numels = first.numels, steps = first.steps.clone();
    sizes.assign(numels.data_ptr<int64_t>(), numels.data_ptr<int64_t>() + numels.numel());
    int64_t total = 0;
    for (int64_t n : sizes) starts.push_back(total), total += n;
    covered.assign(sizes.size(), 0);
    if (first.has1) whole1 = torch::zeros({total}, torch::kFloat);
    if (first.has2) whole2 = torch::zeros({total}, torch::kFloat);
  }

  void check_same_checkpoint(const ShardContents& shard, size_t r) const {
    if (!shard.kind.equal(kind) || !shard.numels.equal(numels)) {
      throw Error(detail::str("merge_optimizer_shards: shard ", r,
                              " was saved by another optimizer (kind or parameter sizes differ "
                              "from shard 0's). Fix: merge the shards of one checkpoint."));
    }
    if (!shard.steps.equal(steps)) {
      // Every process counts every parameter's updates, owner or not: the shards of one
      // checkpoint agree on them. Differing counts mean a shard of another step.
      const auto differ = (shard.steps != steps).nonzero();
      const int64_t p = differ[0][0].item<int64_t>();
      throw Error(detail::str("merge_optimizer_shards: shard ", r,
                              " was saved at another step than ", "shard 0: parameter ", p,
                              " has had ", static_cast<int64_t>(shard.steps[p].item<double>()),
                              " updates there and ", static_cast<int64_t>(steps[p].item<double>()),
                              " in shard 0. Likely cause: a shard of another checkpoint was put "
                              "in this one. Fix: use the shards one save_state wrote, together "
                              "(or an older checkpoint)."));
    }
  }

  // Copies the shard's pieces of state into the whole.
  void add_pieces(const ShardContents& shard, size_t r) {
    if (shard.has1 != whole1.defined() || shard.has2 != whole2.defined()) {
      throw Error(detail::str("merge_optimizer_shards: shard ", r,
                              " holds other state buffers than shard 0. Fix: merge the shards of "
                              "one checkpoint."));
    }
    auto rows = shard.pieces.accessor<int64_t, 2>();
    int64_t at = 0;
    for (int64_t k = 0; k < shard.pieces.size(0); ++k) {
      const int64_t p = rows[k][0], begin = rows[k][1], length = rows[k][2];
      if (p < 0 || p >= static_cast<int64_t>(sizes.size()) || begin < 0 ||
          begin + length > sizes[p]) {
        throw Error(detail::str("merge_optimizer_shards: shard ", r, " has a piece outside its ",
                                "parameters. The file is damaged; use another checkpoint."));
      }
      if (shard.has1)
        whole1.narrow(0, starts[p] + begin, length).copy_(shard.state1.narrow(0, at, length));
      if (shard.has2)
        whole2.narrow(0, starts[p] + begin, length).copy_(shard.state2.narrow(0, at, length));
      covered[p] += length;
      at += length;
    }
  }

  // Every parameter that has stepped has state for all its elements.
  void check_complete() const {
    const double* step_counts = steps.data_ptr<double>();
    for (size_t p = 0; p < sizes.size(); ++p) {
      if (step_counts[p] > 0 && covered[p] != sizes[p]) {
        throw Error(detail::str("merge_optimizer_shards: parameter ", p, " has ", sizes[p],
                                " elements, but the shards hold the state of ", covered[p],
                                ". Likely cause: a rank's shard is missing. Fix: pass every "
                                "rank's shard, in rank order."));
      }
    }
  }

  void write(torch::serialize::OutputArchive& merged) const {
    merged.write(detail::kFusedKindKey, kind);
    merged.write(detail::kFusedNumelsKey, numels);
    merged.write(detail::kFusedStepsKey, steps);
    if (whole1.defined()) merged.write(detail::kFusedState1Key, whole1);
    if (whole2.defined()) merged.write(detail::kFusedState2Key, whole2);
  }
};

}  // namespace

void merge_optimizer_shards(const std::vector<torch::serialize::InputArchive*>& shards,
                            torch::serialize::OutputArchive& merged) {
  if (shards.empty()) throw Error("merge_optimizer_shards: no shards given.");
  MergedState state;
  for (size_t r = 0; r < shards.size(); ++r) {
    const ShardContents shard = read_shard(*shards[r], r);
    if (r == 0) {
      state.start_from(shard);
    } else {
      state.check_same_checkpoint(shard, r);
    }
    state.add_pieces(shard, r);
  }
  state.check_complete();
  state.write(merged);
}

}  // namespace accelerant
