// Data-parallel gradients: averages a model's gradients across processes while backward is still
// running, so that communication hides behind computation (what DDP's Reducer does in Python).
//
// Gradients live in the buckets of plan_buckets(): each .grad is a slice of its bucket, so
// autograd accumulates into the bucket itself. A hook on each parameter's gradient accumulator
// marks the gradient finished; when a bucket is full its all-reduce starts at once, on Gloo's (or
// NCCL's, or the shared-memory transport's) own threads, while autograd goes on with earlier
// layers. Buckets start strictly in plan order, so every rank issues the same collectives in the
// same order. A callback queued on the autograd engine runs when backward ends: it waits for the
// buckets, whose contents are then the averaged gradients. (Gradients that cannot live in a
// bucket are copied in and back.)
//
// Accelerator::prepare builds one per model; it is usable alone:
//   accelerant::GradientReducer reducer(model->named_parameters(), communicator);
//   loss.backward();   // returns with averaged gradients
#pragma once
#include <torch/ordered_dict.h>
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "accelerant/communicator.h"
#include "accelerant/fused_optimizer.h"
#include "accelerant/options.h"

namespace accelerant {

/// How a GradientReducer buckets and reduces. Accelerator::prepare sets the bucket sizes from
/// AcceleratorOptions::bucket_cap_mb and passes allow_unused_parameters on.
struct GradientReducerOptions {
  /// Largest bucket in bytes. Default: 25 MiB (DDP's default).
  ACCELERANT_OPTION(int64_t, bucket_cap_bytes) = 25 * 1024 * 1024;
  /// Largest first bucket in bytes, so that communication starts early. Default: 1 MiB.
  ACCELERANT_OPTION(int64_t, first_bucket_cap_bytes) = 1024 * 1024;
  /// A trainable parameter that gets no gradient in a backward pass is an error by default (its
  /// bucket could never be reduced, and the ranks would wait for each other until the timeout).
  /// With this set, such parameters count as a zero gradient instead. Default: false.
  ACCELERANT_OPTION(bool, allow_unused_parameters) = false;
  /// Each parameter's .grad is a slice of its bucket (as DDP's gradient_as_bucket_view; not
  /// under ZeRO stage 2, which leaves .grad unset), so autograd accumulates into the bucket and
  /// the all-reduce averages the gradients in place: no copy into the bucket and none back.
  /// Gradients of another dtype than their bucket's (bf16 on the CPU, which travels as fp32) are
  /// still copied. A .grad replaced from outside (set to none, assigned) is copied once and bound
  /// again. Default: true.
  ACCELERANT_OPTION(bool, gradient_as_bucket_view) = true;
  /// ZeRO (AcceleratorOptions::zero_stage): with 1 or 2 each bucket is split into equal shares,
  /// one per process (shard_pieces), and gather_parameters() all-gathers the parameters after a
  /// sharded update. With 2 the gradients do not stay in the buckets: as each parameter's
  /// gradient is ready it is copied into its bucket and its .grad is released (left unset), a
  /// full bucket is reduce-scattered, and once that is done its buffer serves the next bucket (at
  /// most 2 reduce-scatters in flight, then backward waits for the oldest). What stays is this
  /// process's share of every bucket (gradient_shares(), which shard_pieces hands to the sharded
  /// update): gradient memory is 1/N plus about 3 buffers of the largest bucket. Default: 0.
  ACCELERANT_OPTION(int, zero_stage) = 0;
};

/// What the reducer did, for tests and benchmarks.
struct GradientReducerStats {
  /// Backward passes whose gradients were averaged.
  int64_t reductions = 0;
  /// Buckets in the plan.
  int64_t buckets = 0;
  /// Last reduction: buckets whose all-reduce started before the last gradient was ready, i.e.
  /// while backward was still computing. 0 would mean no overlap at all.
  int64_t buckets_started_during_backward = 0;
  /// Last reduction: seconds the end-of-backward callback spent waiting for all-reduces, the
  /// communication that computation did not hide.
  double exposed_wait_seconds = 0;
  /// Last reduction: gradients copied into their bucket (0 when every .grad already lived there).
  int64_t gradient_copies = 0;
};

/// Averages one model's gradients across the processes of a Communicator during backward (see
/// the file comment). Not copyable; one per model.
class GradientReducer {
 public:
  /// Hooks every parameter with requires_grad (frozen ones are left alone). `communicator` must
  /// outlive the reducer. With a single process the hooks do nothing.
  GradientReducer(const torch::OrderedDict<std::string, torch::Tensor>& named_parameters,
                  Communicator& communicator, GradientReducerOptions options = {});
  ~GradientReducer();
  GradientReducer(const GradientReducer&) = delete;
  GradientReducer& operator=(const GradientReducer&) = delete;

  /// With sync off, backward only accumulates local gradients (gradient accumulation); the next
  /// backward with sync on averages everything accumulated so far.
  void set_sync(bool enabled);
  /// Whether backward averages gradients now (set_sync); true when the reducer is made.
  bool sync() const;
  /// Calls `follower(enabled)` on every later set_sync, so that what reduces the rest of the same
  /// model follows its sync (ZeRO stage 3: the model's Sharded blocks, accelerant/sharded.h).
  void add_sync_follower(std::function<void(bool)> follower);

  /// What the reducer has done so far (a copy).
  GradientReducerStats stats() const;

  /// Under ZeRO, the elements this process updates: its share of every bucket, as runs of
  /// elements of the parameters in the order of `optimizer_params` (an optimizer's parameters,
  /// group by group), for FusedUpdater::shard; under stage 2 each run carries its gradient (a
  /// slice of gradient_shares()). Throws Error when ZeRO is off, or a trainable
  /// parameter of the model is not among `optimizer_params` (or the reverse).
  std::vector<FusedShardPiece> shard_pieces(
      const std::vector<torch::Tensor>& optimizer_params) const;
  /// Under ZeRO, after each process has updated its share: every parameter gets the values its
  /// owner computed (one all-gather per bucket). A collective: every process calls it.
  void gather_parameters();
  /// Under ZeRO stage 2: this process's share of every bucket's averaged gradient, one 1-D fp32
  /// tensor per bucket (zeros in the padding), valid after a synchronising backward until the
  /// next one; clipping scales them in place. Empty otherwise.
  std::vector<torch::Tensor> gradient_shares() const;
  /// Zeros the model's gradients, as Optimizer::zero_grad would: under ZeRO stage 2 the shares
  /// (the parameters' .grad are unset there anyway), otherwise the buckets and any gradient
  /// outside them.
  void zero_gradients();
  /// After a collective of this backward pass failed (a process died; in-place recovery): waits
  /// out what is still in flight (each returns or fails at once on a broken group) and drops it,
  /// zeros the gradients, and leaves the reducer ready for the next pass. Not a collective.
  void abandon_pass();

  struct State;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace accelerant
