#include "accelerant/metrics.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <sstream>

#include "accelerant/environment.h"
#include "base/exit_hooks.h"
#include "base/step_timing.h"
#include "base/text.h"
#include "graph/metrics_recording.h"

namespace accelerant {

namespace {

// Step times kept per step for the percentiles; older ones are overwritten in a ring.
constexpr size_t kKeptStepTimes = 1 << 16;

struct StepRecord {
  GraphStepMetrics counts;
  std::vector<double> times;
  size_t next_time = 0;
};

struct Registry {
  std::mutex mutex;
  std::vector<StepRecord> steps;
  TransferMetrics transfers;
  StepRecord& step(const std::string& name) {
    for (auto& s : steps) {
      if (s.counts.name == name) return s;
    }
    steps.emplace_back();
    steps.back().counts.name = name;
    return steps.back();
  }
};

Registry& registry() {
  static Registry* r = new Registry();  // never destroyed: the exit report may run late
  return *r;
}

std::atomic<bool> exit_hook_installed{false};

bool metrics_requested() { return environment_flag("ACCELERANT_METRICS").value_or(false); }

void install_exit_hook() {
  if (!exit_hook_installed.exchange(true) && metrics_requested()) {
    detail::add_exit_hook([] { detail::print_metrics_if_requested(); });
  }
}

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  const size_t k = std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())));
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
  return v[k];
}

std::string bytes_text(int64_t bytes) {
  if (bytes >= (1 << 20)) return detail::str(bytes / (1 << 20), " MiB");
  if (bytes >= (1 << 10)) return detail::str(bytes / (1 << 10), " KiB");
  return detail::str(bytes, " B");
}

StepTimeMetrics step_time_metrics(const detail::StepTime& t) {
  using detail::StepPhase;
  auto phase = [&](StepPhase p) { return t.phase[static_cast<int>(p)]; };
  StepTimeMetrics m;
  m.data = phase(StepPhase::data);
  m.forward_backward = phase(StepPhase::forward_backward);
  m.all_reduce = phase(StepPhase::all_reduce);
  m.optimizer = phase(StepPhase::optimizer);
  m.other = phase(StepPhase::other);
  m.step = t.step;
  return m;
}

std::string step_time_text(const StepTimeMetrics& t) {
  char line[256];
  std::snprintf(line, sizeof line,
                "step %.2f ms: data %.2f, forward+backward %.2f, all-reduce wait %.2f, optimizer "
                "%.2f, other %.2f",
                t.step * 1e3, t.data * 1e3, t.forward_backward * 1e3, t.all_reduce * 1e3,
                t.optimizer * 1e3, t.other * 1e3);
  return line;
}

}  // namespace

MetricsSnapshot metrics() {
  // The step-time breakdown has its own lock (base/step_timing.h); read it first.
  const std::vector<detail::StepTime> recent = detail::recent_step_times();
  const detail::RankStepTimes ranks = detail::rank_step_times();
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  MetricsSnapshot snapshot;
  snapshot.transfers = r.transfers;
  snapshot.step_time = step_time_metrics(detail::median_step_time(recent));
  snapshot.timed_optimizer_steps = static_cast<int64_t>(recent.size());
  for (const auto& rank : ranks.ranks)
    snapshot.step_time_by_rank.push_back(step_time_metrics(rank));
  snapshot.step_time_by_rank_at = ranks.at_step;
  snapshot.straggler = ranks.straggler;
  for (const auto& s : r.steps) {
    GraphStepMetrics m = s.counts;
    m.timed_steps = static_cast<int64_t>(s.times.size());
    m.step_p50 = percentile(s.times, 0.50);
    m.step_p90 = percentile(s.times, 0.90);
    m.step_p99 = percentile(s.times, 0.99);
    snapshot.steps.push_back(std::move(m));
  }
  return snapshot;
}

std::string metrics_report() {
  const MetricsSnapshot m = metrics();
  std::ostringstream out;
  out << "Accelerant metrics report\n";
  if (m.steps.empty()) out << "  no compiled steps ran\n";
  for (const auto& s : m.steps) {
    out << "  step '" << s.name << "' (" << s.mode << "): " << s.steps << " steps, " << s.captures
        << " captures (" << std::max<int64_t>(0, s.captures - 1) << " recompiles), " << s.cache_hits
        << " cache hits, " << s.replays << " replays\n";
    char line[256];
    std::snprintf(line, sizeof line,
                  "    capture time %.3f s in all; step time p50 %.3f ms, p90 %.3f ms, p99 %.3f ms "
                  "(%lld steps)\n",
                  s.capture_seconds, s.step_p50 * 1e3, s.step_p90 * 1e3, s.step_p99 * 1e3,
                  static_cast<long long>(s.timed_steps));
    out << line;
    const size_t shown = std::min<size_t>(s.signatures.size(), 8);
    for (size_t i = 0; i < shown; ++i)
      out << "    signature " << i + 1 << ": " << s.signatures[i] << "\n";
    if (s.signatures.size() > shown)
      out << "    ... " << s.signatures.size() - shown << " more signatures\n";
  }
  out << "  transfers: host->device " << m.transfers.host_to_device << " ("
      << bytes_text(m.transfers.host_to_device_bytes) << "), device->host "
      << m.transfers.device_to_host << " (" << bytes_text(m.transfers.device_to_host_bytes)
      << ")\n";
  if (m.timed_optimizer_steps > 0) {
    out << "  step time, median of the last " << m.timed_optimizer_steps
        << " optimizer steps: " << step_time_text(m.step_time) << "\n";
  }
  if (!m.step_time_by_rank.empty()) {
    out << "  step time by rank, exchanged at optimizer step " << m.step_time_by_rank_at << ":\n";
    for (size_t r = 0; r < m.step_time_by_rank.size(); ++r) {
      out << "    rank " << r << ": " << step_time_text(m.step_time_by_rank[r])
          << (static_cast<int>(r) == m.straggler ? "  <- straggler" : "") << "\n";
    }
  }
  return out.str();
}

void reset_metrics() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.steps.clear();
  r.transfers = {};
  detail::reset_step_times();
}

namespace detail {

void record_capture(const std::string& step, const std::string& mode, const std::string& signature,
                    double seconds) {
  install_exit_hook();
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  GraphStepMetrics& m = r.step(step).counts;
  m.mode = mode;
  ++m.captures;
  m.capture_seconds += seconds;
  m.signatures.push_back(signature);
}

void record_step(const std::string& step, bool cache_hit, bool replayed, double seconds) {
  install_exit_hook();
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  StepRecord& s = r.step(step);
  ++s.counts.steps;
  if (cache_hit) ++s.counts.cache_hits;
  if (replayed) ++s.counts.replays;
  if (s.times.size() < kKeptStepTimes) {
    s.times.push_back(seconds);
  } else {
    s.times[s.next_time] = seconds;
    s.next_time = (s.next_time + 1) % kKeptStepTimes;
  }
}

void record_transfer(bool to_device, int64_t bytes) {
  install_exit_hook();
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  if (to_device) {
    ++r.transfers.host_to_device;
    r.transfers.host_to_device_bytes += bytes;
  } else {
    ++r.transfers.device_to_host;
    r.transfers.device_to_host_bytes += bytes;
  }
}

void arm_metrics_report() { install_exit_hook(); }

void print_metrics_if_requested() {
  static std::atomic<bool> printed{false};
  if (!metrics_requested() || printed.exchange(true)) return;
  const std::string report = metrics_report();
  std::fflush(stdout);  // the program's own last lines first
  std::fprintf(stderr, "%s", report.c_str());
  std::fflush(stderr);
}

}  // namespace detail

}  // namespace accelerant
