// Data-parallel gradients: averages a model's gradients across processes while backward is still
// running, so that communication hides behind computation (what DDP's Reducer does in Python).
//
// Gradients are packed into the buckets of plan_buckets(). A hook on each parameter's gradient
// accumulator copies the finished gradient into its bucket; when a bucket is full its all-reduce
// starts at once, on Gloo's (or NCCL's) own threads, while autograd goes on with earlier layers.
// Buckets start strictly in plan order, so every rank issues the same collectives in the same
// order. A callback queued on the autograd engine runs when backward ends: it waits for the
// buckets and writes the averages back into .grad.
//
// Accelerator::prepare builds one per model; it is usable alone:
//   accelerant::GradientReducer reducer(model->named_parameters(), communicator);
//   loss.backward();   // returns with averaged gradients
#pragma once
#include <torch/arg.h>
#include <torch/ordered_dict.h>
#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <string>

#include "accelerant/communicator.h"

namespace accelerant {

struct GradientReducerOptions {
  /// Largest bucket in bytes. Default: 25 MiB (DDP's default).
  TORCH_ARG(int64_t, bucket_cap_bytes) = 25 * 1024 * 1024;
  /// Largest first bucket in bytes, so that communication starts early. Default: 1 MiB.
  TORCH_ARG(int64_t, first_bucket_cap_bytes) = 1024 * 1024;
  /// A trainable parameter that gets no gradient in a backward pass is an error by default (its
  /// bucket could never be reduced, and the ranks would wait for each other until the timeout).
  /// With this set, such parameters count as a zero gradient instead. Default: false.
  TORCH_ARG(bool, allow_unused_parameters) = false;
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
};

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
  bool sync() const;

  GradientReducerStats stats() const;

  struct State;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace accelerant
