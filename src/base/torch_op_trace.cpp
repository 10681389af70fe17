// LibTorch's profiler from C++ (torch/csrc/autograd/profiler_kineto.h): the API torch.profiler
// uses, which in Debian's LibTorch 1.13 runs without Kineto (no libkineto in libtorch_cpu.so):
// it records operators through RecordFunction on the CPU, but ProfilerResult::save throws, so the
// Chrome events are written here from ProfilerResult::events().
//
// Clocks: LibTorch stamps its events with the Unix time (1.13: microseconds; 2.1+: nanoseconds),
// our spans with a steady clock (trace_now_us). Right after starting, a marker scope is recorded
// between two readings of the steady clock; LibTorch's start of the marker minus the midpoint of
// the readings is the offset between the two clocks (error: half the readings' gap, a few
// microseconds), measured in LibTorch's own clock whatever it is.
#include "base/torch_op_trace.h"

#include <ATen/record_function.h>
#include <torch/csrc/autograd/profiler_kineto.h>

#include <chrono>
#include <memory>
#include <set>
#include <string>

#include "accelerant/error.h"
#include "base/torch_profiler_compat.h"
#include "base/trace_events.h"

namespace accelerant::detail {

namespace {

namespace profiler = torch::autograd::profiler;
using torch::profiler::impl::ActivityType;
using torch::profiler::impl::ProfilerConfig;
using torch::profiler::impl::ProfilerState;

// Device events go on lanes of their own, numbered far above LibTorch's thread numbers.
constexpr int64_t kDeviceLaneBase = 2000000;
constexpr const char* kClockMarker = "accelerant::trace_clock_marker";

// Steady-clock readings around the marker, taken at start.
int64_t marker_before_us = 0;
int64_t marker_after_us = 0;
bool record_memory = false;

int64_t unix_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

nlohmann::json shapes_of(const profiler::KinetoEvent& event) {
  nlohmann::json shapes = nlohmann::json::array();
  for (const auto& shape : event.shapes()) shapes.push_back(shape);
  return shapes;
}

nlohmann::json dtypes_of(const profiler::KinetoEvent& event) {
  nlohmann::json dtypes = nlohmann::json::array();
  for (const auto& dtype : event.dtypes()) dtypes.push_back(dtype);
  return dtypes;
}

}  // namespace

void start_torch_op_trace(const TorchOpTraceOptions& options) {
  if (torch::profiler::impl::profilerEnabled()) {
    throw Error(
        "profile(): LibTorch's profiler is already running in this thread (another profile() "
        "scope, or the program's own torch::autograd::profiler). Fix: stop that one first; "
        "LibTorch runs one profiler at a time.");
  }
  const ProfilerConfig config(ProfilerState::KINETO, options.record_shapes,
                              /*profile_memory=*/options.record_memory, /*with_stack=*/false,
                              /*with_flops=*/true, /*with_modules=*/false);
  std::set<ActivityType> activities{ActivityType::CPU};
  if (options.cuda) activities.insert(ActivityType::CUDA);
  profiler::prepareProfiler(config, activities);
  profiler::enableProfiler(config, activities);
  record_memory = options.record_memory;
  marker_before_us = trace_now_us();
  { RECORD_USER_SCOPE(kClockMarker); }
  marker_after_us = trace_now_us();
}

nlohmann::json stop_torch_op_trace(int pid) {
  // Fallback offset, should the marker be missing: the two clocks read one after the other.
  const int64_t fallback_offset = unix_us() - trace_now_us();
  std::unique_ptr<profiler::ProfilerResult> result = profiler::disableProfiler();
  nlohmann::json events = nlohmann::json::array();
  if (!result) return events;
  int64_t offset = fallback_offset;
  for (const auto& event : result->events()) {
    if (event.name() == kClockMarker) {
      offset = profiler_event_start_us(event) - (marker_before_us + marker_after_us) / 2;
      break;
    }
  }
  for (const auto& event : result->events()) {
    const std::string name = event.name();
    if (name == kClockMarker) continue;
    nlohmann::json e;
    e["name"] = name;
    e["pid"] = pid;
    e["tid"] = event.startThreadId();
    e["ts"] = profiler_event_start_us(event) - offset;
    nlohmann::json args = nlohmann::json::object();
    if (name == "[memory]") {
      if (!record_memory) continue;
      e["ph"] = "i";
      e["s"] = "t";
      e["cat"] = "memory";
      args["Bytes"] = event.nBytes();
    } else {
      e["ph"] = "X";
      e["dur"] = profiler_event_duration_us(event);
      const bool on_device = event.deviceType() != c10::DeviceType::CPU;
      e["cat"] = on_device ? "kernel" : "cpu_op";
      if (on_device) e["tid"] = kDeviceLaneBase + static_cast<int64_t>(event.deviceIndex());
      if (event.hasShapes() && !event.shapes().empty()) args["Input Dims"] = shapes_of(event);
      if (event.hasTypes() && !event.dtypes().empty()) args["Input type"] = dtypes_of(event);
      if (event.sequenceNr() >= 0) args["Sequence number"] = event.sequenceNr();
      if (event.flops() > 0) args["FLOPs"] = event.flops();
    }
    if (!args.empty()) e["args"] = std::move(args);
    events.push_back(std::move(e));
  }
  std::set<int64_t> device_lanes;
  for (const auto& e : events) {
    if (e["tid"].get<int64_t>() >= kDeviceLaneBase) device_lanes.insert(e["tid"].get<int64_t>());
  }
  for (int64_t lane : device_lanes) {
    events.push_back({{"ph", "M"},
                      {"name", "thread_name"},
                      {"pid", pid},
                      {"tid", lane},
                      {"args", {{"name", "device " + std::to_string(lane - kDeviceLaneBase)}}}});
  }
  return events;
}

}  // namespace accelerant::detail
