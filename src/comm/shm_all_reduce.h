// All-reduce between the ranks of one machine through a shared-memory segment, instead of Gloo's
// loopback TCP (which moves 1.1 GB/s at 25 MB on this project's machines, against 14-16 GB/s for
// memcpy). The shape of NCCL's and oneCCL's shared-memory transports, in plain C++:
//
//   segment:  control block | staging slot of rank 0 | ... | slot of rank n-1 | result chunk
//   per chunk of the tensor (ACCELERANT_SHM_CHUNK_BYTES, default 256 KiB, cache-sized):
//     1. each rank copies its chunk, all but its own part r, into its own slot -> barrier
//     2. rank r reduces part r of the chunk over the slots (its own values from its tensor), in
//        rank order ((s0 + s1) + s2) + ..., into the result chunk and its tensor -> barrier
//     3. each rank copies the other parts from the result chunk into its tensor
//   (Copying the whole chunk in step 1 moved a fifth more bytes on 2 ranks: 10.8 against 11.7
//   GB/s at 25 MB, median of 8 alternating runs.)
//   (A variant with two sets of slots and one barrier per chunk, every rank reducing the whole
//   chunk, measured slower here: 2.6 against 3.8 GB/s at 25 MB on 2 ranks.)
//
// Every element is combined by one rank in one fixed order, so every rank gets the same bits, run
// after run; with two ranks the sums equal Gloo's bit for bit (a + b == b + a).
//
// The barrier is a per-rank arrival counter in the segment: a waiter spins briefly, then sleeps
// on a futex, waking every few milliseconds to check the deadline (the communicator's timeout)
// and whether each awaited rank's process still exists, so that a dead peer fails the collective
// in milliseconds, with its rank and pid, instead of at the timeout. A rank that gives up marks
// the segment aborted, which fails its peers at once.
//
// Reduce-scatter and all-gather (single machine only) use the same slots and barriers, two per
// step; each step carries a window of k elements of every shard (k = slot / (ranks * element)):
//   reduce-scatter: 1. each rank copies element [o, o+k) of every other shard p of its input
//                      into part p of its slot                                -> barrier
//                   2. rank r folds part r of every slot (its own from its input) in rank
//                      order ((s0 + s1) + s2) + ... into its output [o, o+k)  -> barrier
//   all-gather:     1. each rank copies its input [o, o+k') into its slot     -> barrier
//                   2. every rank copies every other slot into its output, and its own
//                      input unless that is its part of the output (in place) -> barrier
// The fold is the all-reduce's (same combine, same order), so a reduce-scatter's shard has the
// bits of the same all-reduce's elements there. The input is only read.
//
// Collectives of every kind run in submission order on one thread of their own, so an async
// collective overlaps the caller's computation as Gloo's do, and an all-reduce queued before a
// reduce-scatter finishes first on every rank.
//
// Hierarchical (ranks on several machines): the ranks of each machine form a group; after the
// group's reduction its first rank, the node leader, all-reduces the node's result with the other
// leaders (through Gloo, set_cross_node), then hands the total to its group through its slot.
// Every element is still combined in one fixed order (rank order in the node, Gloo's ring order
// between nodes), the same on every rank.
#pragma once
#include <torch/types.h>

#include <chrono>
#include <functional>
#include <future>
#include <memory>
#include <string>

#include "accelerant/communicator.h"
#include "accelerant/error.h"
#include "base/torch_compat.h"

namespace accelerant::detail {

/// The shared-memory all-reduce broke (a rank gave up or timed out, or it broke earlier): a
/// transport failure that the Communicator diagnoses across ranks, as it does Gloo's, rather than
/// passing on as it passes on the Errors that are already explained.
class ShmTransportError : public Error {
 public:
  using Error::Error;
};

/// Reduces a tensor in place among the node leaders (blocking).
using CrossNodeAllReduce = std::function<void(const torch::Tensor&, ReduceOp)>;

class ShmAllReduce {
 public:
  /// Builds the segment among `size` ranks of one machine, meeting through `store` (rank 0
  /// creates, the others map, then it is unlinked). Every rank returns the same outcome: an
  /// object, or nullptr with `why_not` set (a rank could not map it; the caller falls back to
  /// Gloo). Throws only for a store failure.
  /// `hierarchical`: these ranks are one node of several (a group of one rank is then allowed);
  /// rank 0 must be given set_cross_node before the first submission. `job_ranks`: each group
  /// rank's rank in the job, which messages name (empty: the same numbers).
  static std::unique_ptr<ShmAllReduce> connect(c10d::Store& store, int rank, int size,
                                               std::chrono::milliseconds timeout,
                                               std::string* why_not, bool hierarchical = false,
                                               std::vector<int> job_ranks = {});
  /// The leader's reduction across nodes, run on the worker thread between the node's reduction
  /// and the hand-out to the node. A failure there fails the node's ranks at once.
  void set_cross_node(CrossNodeAllReduce leaders_all_reduce);
  ~ShmAllReduce();
  ShmAllReduce(const ShmAllReduce&) = delete;
  ShmAllReduce& operator=(const ShmAllReduce&) = delete;

  /// Whether this path reduces `tensor` with `op` (a CPU tensor of float, double, int32 or int64;
  /// kMean is reduced as kSum, the caller divides).
  static bool supports(const torch::Tensor& tensor);

  /// Queues an in-place all-reduce of `tensor` (contiguous, CPU, supported dtype). The future
  /// throws std::runtime_error naming the cause when a peer died, the timeout passed, or a peer
  /// gave up. After a failure every later submission fails at once.
  std::future<void> submit(torch::Tensor tensor, ReduceOp op);

  /// Queues a reduce-scatter: `output` (S elements) gets the reduction across ranks of elements
  /// [rank * S, (rank + 1) * S) of `input` (size * S elements). Both contiguous, CPU, the same
  /// supported dtype; `output` must not overlap `input`. kMean is reduced as kSum (the caller
  /// divides). Not on a hierarchical group (the Communicator falls back to an all-reduce there).
  /// Fails as submit does.
  std::future<void> submit_reduce_scatter(torch::Tensor input, torch::Tensor output, ReduceOp op);
  /// Queues an all-gather: `output` (size * S elements) gets every rank's `input` (S elements) in
  /// rank order. Both contiguous and CPU, of one dtype (any: only bytes move). Not on a
  /// hierarchical group. Fails as submit does.
  std::future<void> submit_all_gather(torch::Tensor input, torch::Tensor output);

  /// True for one node's group of a hierarchical all-reduce (several machines).
  bool hierarchical() const { return hierarchical_; }

  /// Bytes of each rank's staging slot.
  size_t chunk_bytes() const;

  struct Shared;

 private:
  ShmAllReduce() = default;
  std::unique_ptr<Shared> shared_;
  bool hierarchical_ = false;
};

}  // namespace accelerant::detail
