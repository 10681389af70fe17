// What graph mode did, in the spirit of PyTorch/XLA's metrics report: per compiled step, how
// many input-shape signatures were captured (each one a compile), how many steps were replayed
// from the cache, how long captures took and how long steps take; and the host <-> device
// transfers Accelerant made for you (prefetching loaders, moves to the device).
//
//   std::cout << accelerant::metrics_report();
//   ACCELERANT_METRICS=1 ./train     # prints the report to stderr when the process exits
#pragma once
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace accelerant {

/// The straggler rule of the step-time breakdown (its warning, `straggler` below,
/// `step_time/straggler`) and of `accelerant report`: a rank whose busy time (its step minus its
/// all-reduce wait) is at least this share above the median of the other ranks' busy time...
inline constexpr double kStragglerThreshold = 0.20;
/// ...and at least this much longer per step: on steps of a millisecond or so the ratio is
/// scheduler jitter on shared cores, and the job loses less than this per step to it anyway.
inline constexpr std::chrono::duration<double, std::milli> kStragglerMinExcess{1.0};

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

/// Where optimizer steps spend their time (docs/observability.md "Step-time breakdown"): the
/// median of each phase over a window of steps, in seconds. The phases' medians need not add up
/// to the step's median exactly.
struct StepTimeMetrics {
  /// Waiting for a prepared loader's next batch.
  double data = 0;
  /// The rest of the step: the model's forward, the loss, backward's computation.
  double forward_backward = 0;
  /// Waiting at the end of backward for the gradient all-reduces computation did not hide.
  double all_reduce = 0;
  /// The prepared optimizer's step.
  double optimizer = 0;
  /// The program's own code between the end of a step and the next batch's request.
  double other = 0;
  /// The whole step, from the end of the previous optimizer step to the end of this one.
  double step = 0;
};

/// Everything metrics() reports: a copy, unaffected by steps run after it was taken.
struct MetricsSnapshot {
  /// One entry per compiled step, in the order the steps were first run.
  std::vector<GraphStepMetrics> steps;
  /// Host <-> device copies made by Accelerant.
  TransferMetrics transfers;
  /// This process's step-time breakdown over its last timed steps (up to 4096).
  StepTimeMetrics step_time;
  /// The optimizer steps step_time is taken over; 0 when none were timed.
  int64_t timed_optimizer_steps = 0;
  /// Every process's breakdown (by rank) from the last exchange between the processes
  /// (AcceleratorOptions::step_breakdown_every); empty before the first.
  std::vector<StepTimeMetrics> step_time_by_rank;
  /// The optimizer step at which step_time_by_rank was exchanged.
  int64_t step_time_by_rank_at = 0;
  /// The rank slow in that exchange (at least 20 % and 1 ms busier per step than the median of the
  /// other ranks), or -1. The warning waits for the same rank at two exchanges in a row.
  int straggler = -1;
};

/// The metrics of this process so far.
MetricsSnapshot metrics();
/// metrics() as text, one block per compiled step, ready to print.
std::string metrics_report();
/// Forgets everything recorded so far (e.g. after warm-up).
void reset_metrics();

}  // namespace accelerant
