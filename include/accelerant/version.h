#pragma once

namespace accelerant {

/// Accelerant's version, "major.minor.patch".
inline constexpr const char* kVersion = "0.1.0";

/// The LibTorch version this build was compiled against, e.g. "1.13.0".
const char* torch_version();

}  // namespace accelerant
