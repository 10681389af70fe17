#include "base/step_recording.h"

#include "accelerant/error.h"

namespace accelerant::detail {
namespace {

enum class Mode { kEager, kRecording, kReplaying };

// Per thread: a step is captured on the thread that calls GraphStep, and the loader's worker
// threads must not see its mode.
thread_local Mode mode = Mode::kEager;
thread_local StepRecording* active = nullptr;
thread_local bool work_runs_now = false;

}  // namespace

void StepRecording::run_before() const {
  for (const auto& refresh : before_replay) refresh();
}

void StepRecording::run_after(bool emulated) const {
  for (const auto& effect : after_replay) {
    if (!(emulated && effect.reads_step_values)) effect.run();
  }
}

bool recording_step() { return mode != Mode::kEager; }

bool recorded_work_runs_now() { return mode == Mode::kRecording && work_runs_now; }

void host_effect(std::function<void()> effect) {
  switch (mode) {
    case Mode::kEager:
      effect();
      return;
    case Mode::kRecording:
      active->after_replay.push_back({std::move(effect), false});
      return;
    case Mode::kReplaying:
      return;  // the recorded copy runs after the step
  }
}

void host_effect_on_step_values(std::function<void()> effect) {
  switch (mode) {
    case Mode::kEager:
      effect();
      return;
    case Mode::kRecording:
      active->after_replay.push_back({std::move(effect), true});
      return;
    case Mode::kReplaying:
      effect();
      return;  // this re-run's tensors, not the recording's
  }
}

void before_replay(std::function<void()> refresh) {
  if (mode == Mode::kRecording) active->before_replay.push_back(std::move(refresh));
}

namespace {

void enter(Mode next) {
  if (mode != Mode::kEager) {
    throw Error(
        "A graph step was started inside another graph step's function. Fix: call one GraphStep "
        "per training step, not one from within another.");
  }
  mode = next;
}

}  // namespace

RecordingScope::RecordingScope(StepRecording& recording, bool runs_now) {
  enter(Mode::kRecording);
  active = &recording;
  work_runs_now = runs_now;
}

RecordingScope::~RecordingScope() {
  mode = Mode::kEager;
  active = nullptr;
  work_runs_now = false;
}

ReplayScope::ReplayScope() { enter(Mode::kReplaying); }

ReplayScope::~ReplayScope() { mode = Mode::kEager; }

}  // namespace accelerant::detail
