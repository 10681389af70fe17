// LibTorch's operators in a profiler trace: LibTorch's own profiler (the C++ API behind
// torch.profiler) records them, and this turns its events into Chrome trace events on the trace
// clock of trace_events.h (docs/observability.md "Profiler traces").
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>

namespace accelerant::detail {

/// What LibTorch's profiler is asked to record.
struct TorchOpTraceOptions {
  bool record_shapes = true;
  bool record_memory = false;
  bool cuda = false;  // also CUDA kernels (only a LibTorch built with Kineto and CUPTI has them)
};

/// Starts LibTorch's profiler on the calling thread (and the threads that inherit its state, such
/// as autograd's); the same thread must call stop_torch_op_trace. Throws Error when LibTorch's
/// profiler is already running (e.g. the user's own).
void start_torch_op_trace(const TorchOpTraceOptions& options);

/// Stops LibTorch's profiler and returns its events as Chrome trace events ("ph":"X" for
/// operators, "ph":"i" for allocations) with `pid`, their ts on trace_now_us()'s clock.
nlohmann::json stop_torch_op_trace(int pid);

}  // namespace accelerant::detail
