#include "base/step_timing.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <deque>
#include <mutex>

#include "base/trace_events.h"

namespace accelerant::detail {
namespace {

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// One training loop per process: the phases accumulate here until the step ends. The measured
// phases may be timed on another thread than the loop's (autograd's end-of-backward callback),
// hence atomics; the step boundaries are the loop thread's alone.
struct Clock {
  std::atomic<bool> on{true};
  std::array<std::atomic<int64_t>, kStepPhases> phase_ns{};
  int64_t last_end_ns = -1;  // -1: no step has ended yet
  int64_t other_ns = 0;
  bool other_measured = false;
  const void* owner = nullptr;

  std::mutex mutex;  // guards what follows
  std::deque<StepTime> recent;
  StepTimeListener listener;
  const void* listener_holder = nullptr;
  RankStepTimes ranks;
};

Clock& clock() {
  static Clock* c = new Clock();  // never destroyed: timers may run during static destruction
  return *c;
}

constexpr size_t kRecentSteps = 4096;

}  // namespace

double step_time_field(const StepTime& t, int f) { return f < kStepPhases ? t.phase[f] : t.step; }
void set_step_time_field(StepTime& t, int f, double v) {
  (f < kStepPhases ? t.phase[f] : t.step) = v;
}

double median_of(std::vector<double> values) {
  if (values.empty()) return 0;
  const size_t mid = values.size() / 2;
  std::nth_element(values.begin(), values.begin() + mid, values.end());
  if (values.size() % 2 == 1) return values[mid];
  const double upper = values[mid];
  return (*std::max_element(values.begin(), values.begin() + mid) + upper) / 2;
}

StepTime median_step_time(const std::vector<StepTime>& steps) {
  StepTime m;
  for (int f = 0; f < kStepTimeFields; ++f) {
    std::vector<double> values;
    values.reserve(steps.size());
    for (const StepTime& t : steps) values.push_back(step_time_field(t, f));
    set_step_time_field(m, f, median_of(std::move(values)));
  }
  return m;
}

const char* step_phase_name(StepPhase phase) {
  switch (phase) {
    case StepPhase::data:
      return "data";
    case StepPhase::forward_backward:
      return "forward_backward";
    case StepPhase::all_reduce:
      return "all_reduce";
    case StepPhase::optimizer:
      return "optimizer";
    case StepPhase::other:
      return "other";
  }
  return "?";
}

void set_step_timing(bool on) { clock().on.store(on, std::memory_order_relaxed); }
bool step_timing() { return clock().on.load(std::memory_order_relaxed); }

PhaseTimer::PhaseTimer(StepPhase phase, const char* trace_name)
    : phase_(phase), trace_name_(trace_name), start_ns_(-1) {
  Clock& c = clock();
  if (!c.on.load(std::memory_order_relaxed) && !tracing()) return;
  start_ns_ = now_ns();
  // The first batch requested after a step ended closes that step's "other" time: the user's
  // code between steps. Later requests in the step (gradient accumulation) are data time only.
  if (phase == StepPhase::data && !c.other_measured && c.last_end_ns >= 0) {
    c.other_ns = start_ns_ - c.last_end_ns;
    c.other_measured = true;
  }
}

PhaseTimer::~PhaseTimer() {
  if (start_ns_ < 0) return;
  const int64_t end = now_ns();
  clock().phase_ns[static_cast<int>(phase_)].fetch_add(end - start_ns_, std::memory_order_relaxed);
  if (tracing()) add_trace_span(trace_name_, "step", start_ns_ / 1000, (end - start_ns_) / 1000);
}

void end_timed_step(const void* owner, int64_t optimizer_step) {
  Clock& c = clock();
  if (c.owner == nullptr) c.owner = owner;
  if (owner != c.owner) return;
  trace_step_ended(optimizer_step);
  if (!c.on.load(std::memory_order_relaxed)) {
    // Spans a trace timed meanwhile are dropped, and the step after timing comes back on
    // starts afresh.
    for (auto& p : c.phase_ns) p.store(0, std::memory_order_relaxed);
    c.other_measured = false;
    c.last_end_ns = -1;
    return;
  }
  const int64_t now = now_ns();
  int64_t taken[kStepPhases];
  for (int p = 0; p < kStepPhases; ++p)
    taken[p] = c.phase_ns[p].exchange(0, std::memory_order_relaxed);
  const int64_t other = c.other_measured ? c.other_ns : 0;
  c.other_measured = false;
  const int64_t began = c.last_end_ns;
  c.last_end_ns = now;
  if (began < 0) return;  // the first step has no known start: not recorded

  StepTime t;
  t.step = (now - began) * 1e-9;
  auto seconds = [&](StepPhase p) { return taken[static_cast<int>(p)] * 1e-9; };
  for (StepPhase p : {StepPhase::data, StepPhase::all_reduce, StepPhase::optimizer})
    t.phase[static_cast<int>(p)] = seconds(p);
  t.phase[static_cast<int>(StepPhase::other)] = other * 1e-9;
  double rest = t.step;
  for (StepPhase p :
       {StepPhase::data, StepPhase::all_reduce, StepPhase::optimizer, StepPhase::other})
    rest -= t.phase[static_cast<int>(p)];
  t.phase[static_cast<int>(StepPhase::forward_backward)] = rest > 0 ? rest : 0;

  StepTimeListener listener;
  {
    std::lock_guard<std::mutex> lock(c.mutex);
    c.recent.push_back(t);
    if (c.recent.size() > kRecentSteps) c.recent.pop_front();
    listener = c.listener;
  }
  if (listener) listener(t);
}

void start_timed_training() {
  Clock& c = clock();
  c.owner = nullptr;
  c.last_end_ns = -1;
  c.other_measured = false;
  for (auto& p : c.phase_ns) p.store(0, std::memory_order_relaxed);
}

void set_step_time_listener(const void* holder, StepTimeListener listener) {
  std::lock_guard<std::mutex> lock(clock().mutex);
  clock().listener = std::move(listener);
  clock().listener_holder = holder;
}

void remove_step_time_listener(const void* holder) {
  std::lock_guard<std::mutex> lock(clock().mutex);
  if (clock().listener_holder != holder) return;
  clock().listener = {};
  clock().listener_holder = nullptr;
}

std::vector<StepTime> recent_step_times() {
  std::lock_guard<std::mutex> lock(clock().mutex);
  return {clock().recent.begin(), clock().recent.end()};
}

void reset_step_times() {
  std::lock_guard<std::mutex> lock(clock().mutex);
  clock().recent.clear();
  clock().ranks = RankStepTimes();
}

void set_rank_step_times(RankStepTimes table) {
  std::lock_guard<std::mutex> lock(clock().mutex);
  clock().ranks = std::move(table);
}

RankStepTimes rank_step_times() {
  std::lock_guard<std::mutex> lock(clock().mutex);
  return clock().ranks;
}

}  // namespace accelerant::detail
