// Accelerant's own spans in a profiler trace (Accelerator::profile, docs/observability.md).
//
// Library code that does something worth seeing on a timeline (waiting for data, an all-reduce
// bucket, the optimizer, a checkpoint) adds a span here. While no trace is being recorded,
// tracing() is false and add_trace_span is never reached: the cost when off is one relaxed load.
// The profiler (Accelerator::profile) turns recording on, and at its end writes these spans next
// to LibTorch's operators in the rank's Chrome trace.
#pragma once
#include <cstdint>

namespace accelerant::detail {

/// Whether this process records a trace now.
bool tracing();
/// Microseconds on the trace clock (a steady clock; every span uses it).
int64_t trace_now_us();
/// Adds a complete span on the calling thread's lane. `name` and `category` must outlive the
/// trace (string literals).
void add_trace_span(const char* name, const char* category, int64_t start_us, int64_t duration_us);
/// Called once per optimizer step, when the step ends (`step` counts from 1): the profiler's
/// step ranges start and stop here, and a trace marks the step.
void trace_step_ended(int64_t step);

/// A span from construction to destruction, when tracing() is on at construction.
class TraceSpan {
 public:
  TraceSpan(const char* name, const char* category)
      : name_(name), category_(category), start_us_(tracing() ? trace_now_us() : -1) {}
  ~TraceSpan() {
    if (start_us_ >= 0) add_trace_span(name_, category_, start_us_, trace_now_us() - start_us_);
  }
  TraceSpan(const TraceSpan&) = delete;
  TraceSpan& operator=(const TraceSpan&) = delete;

 private:
  const char* name_;
  const char* category_;
  int64_t start_us_;
};

}  // namespace accelerant::detail
