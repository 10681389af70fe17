// The time left before a deadline, as the millisecond timeout that poll(2) takes.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>

namespace accelerant::detail {

// 0 once the deadline has passed; clamped so that a far deadline does not overflow an int.
inline int poll_timeout_ms(std::chrono::steady_clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - std::chrono::steady_clock::now());
  return static_cast<int>(std::clamp<int64_t>(left.count(), 0, int64_t{1} << 30));
}

}  // namespace accelerant::detail
