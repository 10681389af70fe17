#include "human_bytes.h"

#include <cstdio>

namespace accelerant::cli {

std::string human_bytes(uint64_t bytes, int decimals) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  constexpr int kLast = 5;
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024 && unit < kLast) {
    value /= 1024;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof text, "%.*f %s", unit ? decimals : 0, value, units[unit]);
  return text;
}

}  // namespace accelerant::cli
