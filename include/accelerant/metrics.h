// What graph mode did, in the spirit of PyTorch/XLA's metrics report: per compiled step, how
// many input-shape signatures were captured (each one a compile), how many steps were replayed
// from the cache, how long captures took and how long steps take; and the host <-> device
// transfers Accelerant made for you (prefetching loaders, moves to the device).
//
//   std::cout << accelerant::metrics_report();
//   ACCELERANT_METRICS=1 ./train     # prints the report to stderr when the process exits
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace accelerant {

struct GraphStepMetrics {
  std::string name;
  /// How the step runs: "CUDA graphs" or "eager" (CPU, or graphs turned off).
  std::string mode;
  /// Steps run.
  int64_t steps = 0;
  /// New input signatures: the first one, then every recompile.
  int64_t captures = 0;
  /// Steps whose signature was already captured.
  int64_t cache_hits = 0;
  /// Steps run by replaying a captured graph (CUDA); on the CPU, eager steps of a known signature.
  int64_t replays = 0;
  /// Seconds spent in the first step of each signature (capture, and on the CPU the eager run).
  double capture_seconds = 0;
  /// Step time percentiles over the recorded steps (seconds), and how many were recorded.
  double step_p50 = 0, step_p90 = 0, step_p99 = 0;
  int64_t timed_steps = 0;
  /// The signatures seen, in order ("Float[64, 128]; Long[64]").
  std::vector<std::string> signatures;
};

struct TransferMetrics {
  int64_t host_to_device = 0, host_to_device_bytes = 0;
  int64_t device_to_host = 0, device_to_host_bytes = 0;
};

struct MetricsSnapshot {
  std::vector<GraphStepMetrics> steps;  // in the order the steps were first run
  TransferMetrics transfers;
};

/// The metrics of this process so far.
MetricsSnapshot metrics();
/// metrics() as text, one block per compiled step, ready to print.
std::string metrics_report();
/// Forgets everything recorded so far (e.g. after warm-up).
void reset_metrics();

namespace detail {
void record_capture(const std::string& step, const std::string& mode, const std::string& signature, double seconds);
void record_step(const std::string& step, bool cache_hit, bool replayed, double seconds);
void record_transfer(bool to_device, int64_t bytes);
/// Prints the report to stderr when ACCELERANT_METRICS is true (parse_bool), once per process (the exit paths call it).
void print_metrics_if_requested();
}  // namespace detail

}  // namespace accelerant
