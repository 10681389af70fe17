// The per-rank memory model behind `accelerant estimate-memory`: bytes for parameters, gradients,
// optimizer state and the fp32 master copy under ZeRO stages 0-3, as the fused optimizers' arenas
// (fused_optimizer.h) and stage 3's sharded blocks (sharded.h) shard them. Pure arithmetic,
// table-tested through the command (tests/estimate/estimate-memory-test); docs/cli.md states the
// formulas.
#pragma once
#include <cstdint>

namespace accelerant::cli {

/// The dtype the weights are trained in. kFp32: weights, gradients fp32 (also Accelerant's
/// autocast today, which keeps weights fp32). kBf16 / kFp16: 16-bit weights and gradients with an
/// fp32 master copy that the optimizer updates.
enum class TrainingPrecision { kFp32, kBf16, kFp16 };

enum class OptimizerKind { kAdamW, kAdam, kSgd, kSgdMomentum };

/// Bytes each parameter costs when nothing is sharded (ZeRO stage 0).
struct BytesPerParameter {
  int parameters = 4;  ///< the weights in the training dtype
  int gradients = 4;   ///< same dtype as the weights
  int optimizer = 8;   ///< fp32 state: Adam(W) 2 moments, SGD momentum 1 buffer, SGD none
  int master = 0;      ///< the fp32 copy of 16-bit weights; 0 for fp32 training
};

BytesPerParameter bytes_per_parameter(TrainingPrecision precision, OptimizerKind optimizer);

/// One rank's bytes at one ZeRO stage and world size.
struct RankMemory {
  int zero_stage = 0;
  int64_t world_size = 1;
  uint64_t parameters = 0, gradients = 0, optimizer = 0, master = 0;
  /// Stage 3: one block's parameters and gradients, whole while its backward runs (0 when the
  /// block's size is not known, and below stage 3).
  uint64_t gathered_block = 0;
  /// Stage 3: the next block's parameters, gathered ahead while this one runs (the prefetch).
  uint64_t prefetched_block = 0;
  /// The largest single allocation among them (one arena or one shard of it): what must fit in
  /// one piece of free device memory.
  uint64_t largest_buffer = 0;
  uint64_t total() const {
    return parameters + gradients + optimizer + master + gathered_block + prefetched_block;
  }
};

/// Stage 0 replicates everything; stage 1 shards the optimizer state and the master copy (each rank
/// owns ceil(P/N) elements of every arena); stage 2 shards the gradients too; stage 3 the
/// parameters too (every parameter taken to be in a sharded block), plus one block of
/// `block_parameters` gathered whole with its gradients. `num_parameters` must be at most
/// kMaxParameters, `block_parameters` at most `num_parameters`.
RankMemory estimate_rank_memory(uint64_t num_parameters, const BytesPerParameter& bytes,
                                int zero_stage, int64_t world_size, uint64_t block_parameters = 0);

/// A bound that keeps every product in uint64_t (10^15 parameters x 20 bytes < 2^64).
constexpr uint64_t kMaxParameters = 1'000'000'000'000'000ULL;

}  // namespace accelerant::cli
