// Where each optimizer step's time goes, measured by the library as it runs the step
// (docs/observability.md "Step-time breakdown").
//
// A step runs from the end of the previous optimizer step to the end of this one. The library
// times three phases where it does the work itself, and derives the other two:
//   data              the training loop waiting for a prepared loader's next batch (its
//                     workers build batches meanwhile, so only the exposed wait counts);
//   all_reduce        the end of backward waiting for the gradient all-reduces that computation
//                     did not hide (the reducer's exposed wait);
//   optimizer         PreparedOptimizer::step (the GradScaler's check included);
//   other             the user's code between the end of a step and the next batch's request
//                     (logging, evaluation, checkpoints): 0 when no prepared loader is used;
//   forward_backward  the rest: the model's forward, the loss, backward's own computation.
// On a GPU, phases are host time: the library does not wait for the device to measure them.
//
// Cheap enough to leave on: two clock reads per timed phase and a few relaxed atomics; with
// set_step_timing(false) a timer reads one flag. The step's end also tells the profiler
// (trace_step_ended), whether or not timing is on.
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <vector>

namespace accelerant::detail {

enum class StepPhase : int { data = 0, forward_backward, all_reduce, optimizer, other };
constexpr int kStepPhases = 5;
/// "data", "forward_backward", "all_reduce", "optimizer", "other".
const char* step_phase_name(StepPhase phase);

/// One optimizer step's time, in seconds: each phase (indexed by StepPhase) and the whole step.
struct StepTime {
  std::array<double, kStepPhases> phase{};
  double step = 0;
  /// The step minus the wait for other ranks' gradients: the time this rank was busy.
  double busy() const { return step - phase[static_cast<int>(StepPhase::all_reduce)]; }
};

/// Turns the timers on or off for the process (AcceleratorOptions::step_breakdown_every).
void set_step_timing(bool on);
bool step_timing();

/// Times one of the measured phases (data, all_reduce, optimizer) from construction to
/// destruction, and adds a span named `trace_name` to a profiler trace when one is recorded.
class PhaseTimer {
 public:
  PhaseTimer(StepPhase phase, const char* trace_name);
  ~PhaseTimer();
  PhaseTimer(const PhaseTimer&) = delete;
  PhaseTimer& operator=(const PhaseTimer&) = delete;

 private:
  StepPhase phase_;
  const char* trace_name_;
  int64_t start_ns_;  // -1: not timing
};

/// Ends a timed step: called by the optimizer that `owner` names at the end of its step, with
/// the optimizer step count. Only the first optimizer that calls it after start_timed_training
/// ends steps (with several optimizers, the others' time goes into the next step's optimizer
/// phase).
void end_timed_step(const void* owner, int64_t optimizer_step);

/// A new training starts (an Accelerator is made): the next optimizer to step ends the steps,
/// and the first step after this has no known start.
void start_timed_training();

/// Called on the thread that ends each timed step, with its time; one listener per process (the
/// Accelerator's cross-rank exchange), replaced by the next call. `holder` names who set it:
/// remove_step_time_listener removes it only for the same holder, so that an older Accelerator
/// going away leaves a newer one's listener in place.
using StepTimeListener = std::function<void(const StepTime&)>;
void set_step_time_listener(const void* holder, StepTimeListener listener);
void remove_step_time_listener(const void* holder);

/// A StepTime's numbers by index: 0 to kStepPhases - 1 the phases, kStepPhases the step.
constexpr int kStepTimeFields = kStepPhases + 1;
double step_time_field(const StepTime& time, int field);
void set_step_time_field(StepTime& time, int field, double value);

/// Each phase's median over `steps` (and the step's), in seconds; zeros for none.
StepTime median_step_time(const std::vector<StepTime>& steps);
/// The median of `values` (the mean of the middle two for an even count); 0 for none.
double median_of(std::vector<double> values);

/// This process's most recent timed steps, oldest first (up to the last 4096).
std::vector<StepTime> recent_step_times();
/// Forgets the recorded steps (reset_metrics).
void reset_step_times();

/// Each rank's median step time over the last exchange window, as the Accelerator exchanged it
/// (every rank holds the same table); for metrics_report().
struct RankStepTimes {
  int64_t at_step = 0;          // the optimizer step of the exchange
  int64_t window = 0;           // steps the medians are taken over
  std::vector<StepTime> ranks;  // by rank
  int straggler = -1;           // the rank named slow in this window, or -1
};
void set_rank_step_times(RankStepTimes table);
RankStepTimes rank_step_times();

}  // namespace accelerant::detail
