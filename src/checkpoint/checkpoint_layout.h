// The names of the files inside a checkpoint directory (accelerant/checkpoint.h), shared by the
// save and the load so that they cannot drift apart.
#pragma once
#include <cstdint>
#include <string>

#include "base/text.h"

namespace accelerant::detail::layout {

inline std::string model_file(size_t i) { return str("model_", i, ".pt"); }
/// Model `i`'s weights as safetensors, in place of model_file(i) when the model was sharded
/// (ZeRO stage 3): streamed one gathered block at a time, never whole in one process.
inline std::string model_weights_file(size_t i) { return str("model_", i, ".safetensors"); }
inline std::string optimizer_file(size_t i) { return str("optimizer_", i, ".pt"); }
inline std::string custom_file(size_t i) { return str("custom_", i, ".pt"); }
/// Optimizer `i`'s state as rank `rank` holds it under ZeRO: its shard (in place of
/// optimizer_file(i), which a sharded run does not write).
inline std::string optimizer_shard_file(int rank, size_t i) {
  return str("rank_", rank, "/optimizer_", i, ".pt");
}
inline std::string rng_file(int rank) { return str("rank_", rank, "/rng.pt"); }
/// A rank's accumulated gradients, present only when it saved in the middle of gradient
/// accumulation (each rank's differ until the synchronising micro-step averages them).
inline std::string gradients_file(int rank) { return str("rank_", rank, "/gradients.pt"); }
/// A rank's position in prepared stream loader `i` (checkpoint/stream_positions.h).
inline std::string stream_file(int rank, size_t i) {
  return str("rank_", rank, "/stream_", i, ".json");
}
/// Whether `path` is one of rank `rank`'s stream_file(rank, i).
inline bool is_stream_file(const std::string& path, int rank) {
  const std::string head = str("rank_", rank, "/stream_"), tail = ".json";
  if (path.size() <= head.size() + tail.size() || path.compare(0, head.size(), head) != 0 ||
      path.compare(path.size() - tail.size(), tail.size(), tail) != 0) {
    return false;
  }
  for (size_t k = head.size(); k < path.size() - tail.size(); ++k) {
    if (path[k] < '0' || path[k] > '9') return false;
  }
  return true;
}
inline const char* const kStateFile = "state.json";
inline const char* const kScalerFile = "scaler.pt";
inline const char* const kManifestFile = "manifest.json";

/// The largest manifest.json, state.json or model.safetensors.index.json read (docs/checkpoints.md
/// "Limits"): a manifest lists ~100 bytes per file, so 64 MiB is room for over 500,000 files.
constexpr uint64_t kMaxJsonBytes = 64ull << 20;

}  // namespace accelerant::detail::layout
