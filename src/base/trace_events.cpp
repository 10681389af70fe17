// The buffer behind Accelerant's trace spans (trace_events.h). Spans are few (a handful per step:
// buckets, data waits, the optimizer, checkpoints), so one mutex-guarded vector is cheap enough;
// the cost that matters is the one while no trace is recorded, which is one relaxed load of
// `recording` in tracing().
#include "base/trace_events.h"

#include <ATen/record_function.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>

namespace accelerant::detail {

namespace {

std::atomic<bool> recording{false};
std::atomic<bool> has_listener{false};

struct Buffer {
  std::mutex mutex;
  std::vector<TraceRecord> records;
  std::shared_ptr<std::function<void(int64_t)>> listener;
};

// Never destroyed: a span may end in a thread that outlives static destruction (a loader worker).
Buffer& buffer() {
  static auto* b = new Buffer;
  return *b;
}

// LibTorch's own number for this thread, so that its operators and our spans share a lane.
uint64_t this_thread_id() { return at::RecordFunction::currentThreadId(); }

void add(TraceRecord record) {
  Buffer& b = buffer();
  std::lock_guard<std::mutex> lock(b.mutex);
  // Checked again under the lock: a span that ends after stop_trace_recording belongs to no trace.
  if (!recording.load(std::memory_order_relaxed)) return;
  b.records.push_back(std::move(record));
}

}  // namespace

bool tracing() { return recording.load(std::memory_order_relaxed); }

int64_t trace_now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void add_trace_span(const char* name, const char* category, int64_t start_us, int64_t duration_us) {
  if (!tracing()) return;
  TraceRecord record;
  record.name = name;
  record.category = category;
  record.start_us = start_us;
  record.duration_us = duration_us;
  record.thread_id = this_thread_id();
  add(std::move(record));
}

void add_trace_span_on_lane(const std::string& lane, std::string name, const char* category,
                            int64_t start_us, int64_t duration_us,
                            std::vector<std::pair<std::string, int64_t>> args) {
  if (!tracing()) return;
  TraceRecord record;
  record.name = std::move(name);
  record.category = category;
  record.start_us = start_us;
  record.duration_us = duration_us;
  record.lane = lane;
  record.args = std::move(args);
  add(std::move(record));
}

void trace_step_ended(int64_t step) {
  if (tracing()) {
    TraceRecord record;
    record.kind = TraceRecord::Kind::kStepEnd;
    record.name = "step " + std::to_string(step) + " ended";
    record.category = "step";
    record.start_us = trace_now_us();
    record.thread_id = this_thread_id();
    record.step = step;
    add(std::move(record));
  }
  if (!has_listener.load(std::memory_order_relaxed)) return;
  std::shared_ptr<std::function<void(int64_t)>> listener;
  {
    Buffer& b = buffer();
    std::lock_guard<std::mutex> lock(b.mutex);
    listener = b.listener;
  }
  // Called without the lock: the listener starts and stops recording and may remove itself.
  if (listener) (*listener)(step);
}

void start_trace_recording() {
  Buffer& b = buffer();
  std::lock_guard<std::mutex> lock(b.mutex);
  b.records.clear();
  recording.store(true, std::memory_order_relaxed);
}

std::vector<TraceRecord> stop_trace_recording() {
  Buffer& b = buffer();
  std::lock_guard<std::mutex> lock(b.mutex);
  recording.store(false, std::memory_order_relaxed);
  std::vector<TraceRecord> records;
  records.swap(b.records);
  return records;
}

void set_trace_step_listener(std::function<void(int64_t)> listener) {
  Buffer& b = buffer();
  std::lock_guard<std::mutex> lock(b.mutex);
  b.listener =
      listener ? std::make_shared<std::function<void(int64_t)>>(std::move(listener)) : nullptr;
  has_listener.store(b.listener != nullptr, std::memory_order_relaxed);
}

}  // namespace accelerant::detail
