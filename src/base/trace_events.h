// Accelerant's own spans in a profiler trace (Accelerator::profile, docs/observability.md).
//
// Library code that does something worth seeing on a timeline (waiting for data, an all-reduce
// bucket, the optimizer, a checkpoint) adds a span here. While no trace is being recorded,
// tracing() is false and add_trace_span is never reached: the cost when off is one relaxed load.
// The profiler (Accelerator::profile) turns recording on, and at its end writes these spans next
// to LibTorch's operators in the rank's Chrome trace.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

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

/// A span on a lane of its own, named `lane`, instead of the calling thread's: for work that
/// overlaps that thread's other spans (an all-reduce in flight during backward), since a trace
/// viewer draws only properly nested spans on one lane. `args` are shown with the span (bytes).
void add_trace_span_on_lane(const std::string& lane, std::string name, const char* category,
                            int64_t start_us, int64_t duration_us,
                            std::vector<std::pair<std::string, int64_t>> args = {});

/// One thing recorded while tracing: a span, or the end of an optimizer step (a marker).
struct TraceRecord {
  enum class Kind { kSpan, kStepEnd };
  Kind kind = Kind::kSpan;
  std::string name;
  const char* category = "";
  int64_t start_us = 0;
  int64_t duration_us = 0;  // 0 for a step marker
  /// The recording thread, as LibTorch's profiler numbers threads (at::RecordFunction's
  /// currentThreadId), so that these spans share a lane with that thread's operators.
  uint64_t thread_id = 0;
  /// A lane of its own (add_trace_span_on_lane), or "" for the thread's lane.
  std::string lane;
  std::vector<std::pair<std::string, int64_t>> args;
  int64_t step = 0;  // kStepEnd: the step that ended
};

/// Starts recording (the profiler): tracing() turns true and the buffer starts empty.
void start_trace_recording();
/// Stops recording and hands over what was recorded, in the order it was added.
std::vector<TraceRecord> stop_trace_recording();

/// Called by trace_step_ended with the step, after the step's marker is recorded: the profiler's
/// step ranges start and stop here. An empty function removes it. One listener per process.
void set_trace_step_listener(std::function<void(int64_t)> listener);

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
