// Placeholder until the profiler lands: nothing records a trace yet.
#include "base/trace_events.h"

#include <chrono>

namespace accelerant::detail {

bool tracing() { return false; }

int64_t trace_now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void add_trace_span(const char*, const char*, int64_t, int64_t) {}

void trace_step_ended(int64_t) {}

}  // namespace accelerant::detail
