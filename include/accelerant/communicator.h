// Collectives between the processes of one job: all_reduce, reduce_scatter and all_gather (for
// sharded training), gather (also of unequal lengths), broadcast of tensors and of small values,
// barrier. Gloo carries CPU tensors, NCCL CUDA tensors
// (in CUDA builds). Every call has a timeout; a failure names the ranks that never arrived.
//
// Debug mode (ACCELERANT_DEBUG_MODE=1 or ProcessStateOptions::debug) makes the ranks exchange
// each call's op, dtype and shape through the store before running it, so that a mismatch raises
// CollectiveMismatchError listing every rank's view instead of hanging or corrupting data.
#pragma once

#include <torch/arg.h>
#include <torch/types.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

namespace accelerant {
namespace detail {
struct CommunicatorAccess;
}

/// How all_reduce and reduce_scatter combine the ranks' values.
enum class ReduceOp { kSum, kMean, kMax, kMin };

/// "sum", "mean", "max" or "min".
const char* to_string(ReduceOp op);

/// A collective started by an *_async call and still in flight. wait() finishes it and raises
/// exactly what the blocking call would have raised. Collectives complete in the order they were
/// started, so every rank must start them in the same order.
class PendingCollective {
 public:
  /// A handle with nothing in flight: wait() returns at once.
  PendingCollective() = default;
  /// Blocks until the collective is done and its result is in the tensor it was started on.
  /// Throws CollectiveError as the blocking call would; later calls return at once.
  void wait();
  /// True while the collective has been started and not yet waited for.
  bool pending() const { return state_ != nullptr; }
  /// True when wait() would return (or throw) without blocking: the transport has finished, or
  /// nothing is pending. Lets a caller act on collectives that finished while it went on working
  /// (ZeRO stage 2 frees a bucket's gradients once its reduce-scatter is done).
  bool done() const;

 private:
  friend struct detail::CommunicatorAccess;  // the *_async_ calls make it
  struct State;                              // src/comm/communicator.cpp
  std::shared_ptr<State> state_;
};

/// One process's end of the job's collectives: every rank calls the same collectives in the same
/// order, each on its own Communicator. ProcessState::communicator() is the one of the job; a
/// default-constructed one stands for a job of one process. Movable, not copyable.
class Communicator {
 public:
  /// A communicator of one process: every collective returns (a copy of) its input.
  Communicator();
  ~Communicator();
  /// Takes over the moved-from communicator's connections; that one must not be used afterwards.
  Communicator(Communicator&&) noexcept;
  /// Takes over the moved-from communicator's connections and releases this one's; the moved-from
  /// one must not be used afterwards.
  Communicator& operator=(Communicator&&) noexcept;

  /// This process's rank in the group, 0 to world_size() - 1 (ProcessState::rank()).
  int rank() const;
  /// Processes in the group (ProcessState::world_size()); 1 for a communicator of one.
  int world_size() const;

  /// Combines `tensor` across ranks and returns the result; the input is unchanged.
  /// kMean sums then divides (Gloo has no average) and needs a floating-point tensor.
  /// bf16 tensors travel as fp32 (Gloo cannot reduce bf16) and come back as bf16.
  torch::Tensor all_reduce(const torch::Tensor& tensor, ReduceOp op = ReduceOp::kSum);
  /// all_reduce, writing the result into `tensor`.
  void all_reduce_(const torch::Tensor& tensor, ReduceOp op = ReduceOp::kSum);
  /// all_reduce_ that returns once the collective is queued; the result is in `tensor` after
  /// wait(). Used to overlap communication with computation (the gradient reducer). `tensor` must
  /// stay alive and untouched until then. Same dtype rules as all_reduce_.
  PendingCollective all_reduce_async_(const torch::Tensor& tensor, ReduceOp op = ReduceOp::kSum);

  /// Reduces across ranks and leaves each rank its shard: with N = world_size() and `output` of S
  /// elements, `input` holds N * S elements and rank r gets in `output` the reduction of elements
  /// [r * S, (r + 1) * S) of every rank's `input`, flat (shapes are ignored, only element counts
  /// count). Both contiguous, of one dtype and device; `output` must not overlap `input`.
  /// `input` is unchanged (no path uses it as scratch). Op and dtype rules as all_reduce: kMean
  /// sums then divides and needs a floating-point tensor; bf16 travels as fp32. On CPU tensors each
  /// element has the bits the same all_reduce gives it (NCCL's may add in another order). A
  /// communicator of one process copies.
  /// Paths: shared memory on one machine; NCCL's reduce-scatter for CUDA tensors; elsewhere (Gloo,
  /// whose 1.13 group has no reduce-scatter, and several machines) an all-reduce of a copy of
  /// `input` from which the shard is taken, which moves N times the data a reduce-scatter would.
  /// See docs/collectives.md "Reduce-scatter and all-gather".
  void reduce_scatter_(const torch::Tensor& input, const torch::Tensor& output,
                       ReduceOp op = ReduceOp::kSum);
  /// reduce_scatter_ that returns once the collective is queued; the result is in `output` after
  /// wait(). `input` and `output` must stay alive and untouched until then. It completes in
  /// submission order with the other collectives (an all_reduce started before it finishes first).
  PendingCollective reduce_scatter_async_(const torch::Tensor& input, const torch::Tensor& output,
                                          ReduceOp op = ReduceOp::kSum);
  /// Every rank's `input` (S elements) in `output` (world_size() * S elements), in rank order,
  /// flat: rank r's input in elements [r * S, (r + 1) * S). Both contiguous, of one dtype (any) and
  /// device. In place, as NCCL allows: `input` may be this rank's own slice of `output`
  /// (output.view({-1}).narrow(0, rank() * S, S)), which shared memory and NCCL then leave where
  /// it is (Gloo sends a copy); no other overlap is allowed. A communicator of one process
  /// copies.
  /// Paths: shared memory on one machine; NCCL's all-gather for CUDA tensors; Gloo's allgather
  /// otherwise (several machines too).
  void all_gather_(const torch::Tensor& input, const torch::Tensor& output);
  /// all_gather_ that returns once the collective is queued; the result is in `output` after
  /// wait(). `input` and `output` must stay alive and untouched until then.
  PendingCollective all_gather_async_(const torch::Tensor& input, const torch::Tensor& output);

  /// Every rank's tensor, concatenated along dim 0 in rank order. The first dimension may differ
  /// between ranks (each is padded to the longest, sent, then trimmed); the others must match.
  /// 0-dimensional tensors are treated as shape [1].
  torch::Tensor gather(const torch::Tensor& tensor);
  /// Every rank's tensor as a list indexed by rank (first dimension may differ).
  std::vector<torch::Tensor> gather_list(const torch::Tensor& tensor);

  /// Pads `tensor` along `dim` to the largest size any rank has there, with `pad_value`,
  /// at the end (or at the start with `pad_first`). Needed before collectives of equal shapes.
  torch::Tensor pad_across_processes(const torch::Tensor& tensor, int64_t dim = 0,
                                     double pad_value = 0, bool pad_first = false);

  /// Overwrites `tensor` on every rank with rank `src`'s. Shapes and dtypes must match.
  void broadcast_(const torch::Tensor& tensor, int src = 0);
  /// Every rank's bytes (any length, each its own, empty too), indexed by rank, on every rank.
  std::vector<std::string> gather_bytes(const std::string& bytes);
  /// Rank `src`'s bytes on every rank (any length; the others' argument is ignored).
  std::string broadcast_bytes(const std::string& bytes, int src = 0);
  /// Rank `src`'s value on every rank: a std::string or any trivially copyable value.
  template <class T>
  T broadcast_value(const T& value, int src = 0);

  /// Returns when every rank has called barrier().
  void barrier();

  /// True when CPU all-reduces of float, double, int32 and int64 go through shared-memory
  /// segments (ACCELERANT_SHM_ALLREDUCE not 0): one segment when every rank is on this machine,
  /// or one per machine with Gloo between the machines' first ranks (hierarchical). On one
  /// machine reduce_scatter and all_gather use the segment too.
  /// See docs/collectives.md "Shared memory".
  bool shared_memory_all_reduce() const;
  /// How CPU all-reduces travel, in words: "Gloo", "shared memory (4 ranks)", or, on several
  /// machines, "hierarchical: shared memory in each of 2 nodes (2+2 ranks), Gloo between the
  /// node leaders".
  const std::string& all_reduce_path() const;

  /// Set after a failed collective: the message of that failure. A broken communicator throws
  /// at once on every later call, since the peers' state is unknown.
  const std::string& broken_reason() const;

 private:
  friend struct detail::CommunicatorAccess;  // ProcessState's rendezvous makes it
  struct Impl;                               // src/comm/communicator_impl.h
  std::unique_ptr<Impl> impl_;
};

template <class T>
T Communicator::broadcast_value(const T& value, int src) {
  if constexpr (std::is_same_v<T, std::string>) {
    return broadcast_bytes(value, src);
  } else {
    static_assert(std::is_trivially_copyable_v<T>,
                  "broadcast_value sends std::string or trivially copyable values; "
                  "serialize other types to a std::string first");
    std::string bytes(reinterpret_cast<const char*>(&value), sizeof(T));
    bytes = broadcast_bytes(bytes, src);
    T out;
    std::memcpy(&out, bytes.data(), sizeof(T));
    return out;
  }
}

}  // namespace accelerant
