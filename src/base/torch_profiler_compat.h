// The LibTorch profiler's differences between 1.13 and 2.x, defined in torch_compat.cpp with the
// other version differences. A header of its own so that only the profiler's code depends on it.
#pragma once
#include <cstdint>

namespace torch::autograd::profiler {
struct KinetoEvent;
}

namespace accelerant::detail {

/// A LibTorch profiler event's start and duration in microseconds of LibTorch's profiler clock
/// (1.13 and 2.0 report microseconds, 2.1+ nanoseconds).
int64_t profiler_event_start_us(const torch::autograd::profiler::KinetoEvent& event);
int64_t profiler_event_duration_us(const torch::autograd::profiler::KinetoEvent& event);

}  // namespace accelerant::detail
