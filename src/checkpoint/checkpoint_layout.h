// The names of the files inside a checkpoint directory (accelerant/checkpoint.h), shared by the
// save and the load so that they cannot drift apart.
#pragma once
#include <string>

#include "base/text.h"

namespace accelerant::detail::layout {

inline std::string model_file(size_t i) { return str("model_", i, ".pt"); }
inline std::string optimizer_file(size_t i) { return str("optimizer_", i, ".pt"); }
inline std::string custom_file(size_t i) { return str("custom_", i, ".pt"); }
inline std::string rng_file(int rank) { return str("rank_", rank, "/rng.pt"); }
/// A rank's accumulated gradients, present only when it saved in the middle of gradient
/// accumulation (each rank's differ until the synchronising micro-step averages them).
inline std::string gradients_file(int rank) { return str("rank_", rank, "/gradients.pt"); }
inline const char* const kStateFile = "state.json";
inline const char* const kScalerFile = "scaler.pt";
inline const char* const kManifestFile = "manifest.json";

}  // namespace accelerant::detail::layout
