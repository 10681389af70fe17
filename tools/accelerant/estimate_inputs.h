// The inputs of `accelerant estimate-memory`, parsed with errors that say what was wrong, the
// value and the fix: human counts (125M, 1.3B), lists of world sizes and ZeRO stages, precision,
// optimizer, and the activations' order of magnitude.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "memory_estimate.h"

namespace accelerant::cli {

/// A positive count, plain (350000000) or with a decimal suffix K, M, B or T (350M, 1.3B, 0.5K),
/// case-insensitive; exact (no floating point), at most `max`. Throws accelerant::Error naming
/// `flag`, the text and the fix.
uint64_t parse_count(const std::string& text, const std::string& flag, uint64_t max);

/// a x b, or throws accelerant::Error saying `what` is too large.
uint64_t checked_multiply(uint64_t a, uint64_t b, const std::string& what);

/// "1,2,4,8": each a positive count of processes, sorted, duplicates dropped.
std::vector<int64_t> parse_world_sizes(const std::string& text);
/// "all", "2" or "0,2": stages 0-3, sorted; anything else refused.
std::vector<int> parse_zero_stages(const std::string& text);

/// fp32 (or no), bf16, fp16.
TrainingPrecision parse_precision(const std::string& text);
std::string precision_name(TrainingPrecision precision);
/// adamw, adam, sgd, sgd_momentum.
OptimizerKind parse_optimizer(const std::string& text);
std::string optimizer_name(OptimizerKind optimizer);

/// The activations one rank keeps for backward, as an order of magnitude, and how it was found.
struct Activations {
  uint64_t bytes = 0;
  std::string rule;
};

/// Nothing when no activation flag is given; batch x bytes per sample when measured; else the
/// transformer rule of thumb batch x 34 x seq_len x hidden_size x num_layers bytes at 16 bits
/// (x 2 at fp32). Throws when the flags given are not enough for either.
std::optional<Activations> parse_activations(
    const std::string& batch_size, const std::string& bytes_per_sample, const std::string& seq_len,
    const std::string& hidden_size, const std::string& num_layers, TrainingPrecision precision);

}  // namespace accelerant::cli
