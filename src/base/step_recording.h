// What a captured step must do on the host each time it is replayed.
//
// A CUDA graph replay repeats the device work that was recorded, not the C++ that queued it.
// Library code that keeps host-side state in step with the device (the optimizer's step counter,
// the scheduler, step closures added inside the step) therefore declares that work here instead
// of doing it inline:
//
//   detail::host_effect(fn)     runs fn now in an eager step; while a step is being recorded it
//                               is kept instead, and GraphStep runs it after every replay of
//                               that recording (the first replay follows the capture), in order.
//   detail::before_replay(fn)   kept while recording; GraphStep runs it before every replay
//                               (to copy host values the graph reads, e.g. a scheduled lr, into
//                               the device tensors the graph was captured with).
//   detail::recording_step()    true while a step is being captured or (CPU emulation) replayed:
//                               code that would read the device on the host, or that computes
//                               values on the host that a replay would freeze, refuses then.
//
// GraphStep opens the scopes: a RecordingScope around the capture, a ReplayScope around the CPU
// emulation's re-run of the step (GraphStepOptions::emulate_replays), in which host effects are
// neither run nor kept: the recorded ones run after the step, as they would on a GPU (except
// those on step values, see host_effect_on_step_values).
#pragma once
#include <functional>
#include <vector>

namespace accelerant::detail {

struct StepRecording {
  struct Effect {
    std::function<void()> run;
    bool reads_step_values = false;  // see host_effect_on_step_values
  };
  std::vector<Effect> after_replay;
  std::vector<std::function<void()>> before_replay;

  void run_before() const;
  /// `emulated`: after the CPU emulation's re-run, which ran its effects on step values itself.
  void run_after(bool emulated = false) const;
};

bool recording_step();
/// While a step is recorded: whether its device work runs as it is queued (the CPU emulation)
/// rather than at the first replay (a CUDA capture). Code that must set up device values before
/// a recorded step reads them does so now only when this is true, else before the replay.
bool recorded_work_runs_now();
void host_effect(std::function<void()> effect);
/// A host effect that holds tensors the step computes (a step closure reading the loss). On a
/// GPU the recorded one is right after a replay: its tensors are the graph's, rewritten by each
/// replay. The CPU emulation's re-run makes new tensors, so there the re-run's own copy runs
/// (at once) instead of the recorded one. Effects that keep state across steps must use
/// host_effect and hold only tensors that the step updates in place.
void host_effect_on_step_values(std::function<void()> effect);
void before_replay(std::function<void()> refresh);

// While alive (one thread, not nested), host effects and refreshers go into `recording`.
class RecordingScope {
 public:
  RecordingScope(StepRecording& recording, bool work_runs_now);
  ~RecordingScope();
  RecordingScope(const RecordingScope&) = delete;
  RecordingScope& operator=(const RecordingScope&) = delete;
};

// While alive, the step re-runs as a stand-in for a replay: host effects and refreshers are
// dropped (the recording's own run around it; effects on step values run at once),
// recording_step() is true.
class ReplayScope {
 public:
  ReplayScope();
  ~ReplayScope();
  ReplayScope(const ReplayScope&) = delete;
  ReplayScope& operator=(const ReplayScope&) = delete;
};

}  // namespace accelerant::detail
