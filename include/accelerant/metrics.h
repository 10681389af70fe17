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

/// What one compiled step (one GraphStep, by its name) has done in this process so far.
struct GraphStepMetrics {
  /// The step's GraphStepOptions::name; steps that share a name share one record.
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
  /// Median step time over the timed steps (seconds), captures included.
  double step_p50 = 0;
  /// 90th percentile of the step time (seconds).
  double step_p90 = 0;
  /// 99th percentile of the step time (seconds).
  double step_p99 = 0;
  /// Steps the percentiles are taken over: every step, up to the last 65536.
  int64_t timed_steps = 0;
  /// The signatures seen, in order ("Float[64, 128]; Long[64]").
  std::vector<std::string> signatures;
};

/// Copies between host and device that Accelerant made on the program's behalf (today: the
/// prepared data loaders' batches moved to an accelerator). The program's own `.to()` calls are
/// not counted.
struct TransferMetrics {
  /// Tensors copied from host to device.
  int64_t host_to_device = 0;
  /// Bytes copied from host to device.
  int64_t host_to_device_bytes = 0;
  /// Tensors copied from device to host.
  int64_t device_to_host = 0;
  /// Bytes copied from device to host.
  int64_t device_to_host_bytes = 0;
};

/// Everything metrics() reports: a copy, unaffected by steps run after it was taken.
struct MetricsSnapshot {
  /// One entry per compiled step, in the order the steps were first run.
  std::vector<GraphStepMetrics> steps;
  /// Host <-> device copies made by Accelerant.
  TransferMetrics transfers;
};

/// The metrics of this process so far.
MetricsSnapshot metrics();
/// metrics() as text, one block per compiled step, ready to print.
std::string metrics_report();
/// Forgets everything recorded so far (e.g. after warm-up).
void reset_metrics();

}  // namespace accelerant
