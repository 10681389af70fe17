// Byte counts as people read them, in binary units (KiB, MiB, ...), as the allocators and
// nvidia-smi count memory: the commands that print sizes (checkpoint, report, estimate-memory)
// share this one spelling.
#pragma once
#include <cstdint>
#include <string>

namespace accelerant::cli {

/// "512 B", "1.5 KiB", "3.25 GiB" with `decimals` digits after the point above bytes.
std::string human_bytes(uint64_t bytes, int decimals = 1);

}  // namespace accelerant::cli
