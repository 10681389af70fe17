#include "memory_estimate.h"

#include <algorithm>

namespace accelerant::cli {

BytesPerParameter bytes_per_parameter(TrainingPrecision precision, OptimizerKind optimizer) {
  BytesPerParameter bytes;
  const bool sixteen_bit = precision != TrainingPrecision::kFp32;
  bytes.parameters = sixteen_bit ? 2 : 4;
  bytes.gradients = bytes.parameters;
  // The optimizer updates fp32 values whatever the training dtype: 16-bit weights alone would lose
  // small updates to rounding, hence the master copy.
  bytes.master = sixteen_bit ? 4 : 0;
  switch (optimizer) {
    case OptimizerKind::kAdamW:
    case OptimizerKind::kAdam:
      bytes.optimizer = 8;
      break;  // exp_avg, exp_avg_sq
    case OptimizerKind::kSgdMomentum:
      bytes.optimizer = 4;
      break;
    case OptimizerKind::kSgd:
      bytes.optimizer = 0;
      break;
  }
  return bytes;
}

RankMemory estimate_rank_memory(uint64_t num_parameters, const BytesPerParameter& bytes,
                                int zero_stage, int64_t world_size, uint64_t block_parameters) {
  RankMemory m;
  m.zero_stage = zero_stage;
  m.world_size = world_size;
  // The rank that owns the most: ceil(P/N) elements. Each shard is also padded to the vector
  // alignment (tens of bytes per rank and bucket, or per parameter at stage 3), which this leaves
  // out as negligible.
  const uint64_t n = static_cast<uint64_t>(world_size);
  const uint64_t shard = zero_stage >= 1 ? (num_parameters + n - 1) / n : num_parameters;
  const uint64_t grad_elements = zero_stage >= 2 ? shard : num_parameters;
  const uint64_t parameter_elements = zero_stage >= 3 ? shard : num_parameters;
  m.parameters = parameter_elements * bytes.parameters;
  m.gradients = grad_elements * bytes.gradients;
  m.optimizer = shard * bytes.optimizer;
  m.master = shard * bytes.master;
  // Stage 3 with one process shards nothing: the block is among the whole parameters already.
  if (zero_stage >= 3 && n > 1) {
    m.gathered_block = block_parameters * (bytes.parameters + bytes.gradients);
    m.prefetched_block = block_parameters * bytes.parameters;
  }
  // Each optimizer buffer (a moment, the momentum) is an arena of its own, 4 bytes per element.
  const int optimizer_buffers = bytes.optimizer / 4;
  const uint64_t one_optimizer_buffer = optimizer_buffers ? m.optimizer / optimizer_buffers : 0;
  m.largest_buffer = std::max({m.parameters, m.gradients, one_optimizer_buffer, m.master});
  // Stage 3 gathers a block into its parameters' own storage: one allocation per parameter, the
  // block's largest at most as large as the whole block (counted so, an upper bound).
  if (m.gathered_block > 0) {
    m.largest_buffer = std::max(m.largest_buffer, block_parameters * bytes.parameters);
  }
  return m;
}

}  // namespace accelerant::cli
