#include "accelerant/graph_step.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <exception>
#include <map>
#include <mutex>

#include "accelerant/environment.h"
#include "accelerant/error.h"
#include "accelerant/launch_contract.h"
#include "accelerant/metrics.h"
#include "base/step_recording.h"
#include "base/text.h"
#include "graph/metrics_recording.h"

#ifdef ACCELERANT_CUDA_GRAPHS
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace accelerant {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::mutex& closures_mutex() {
  static std::mutex m;
  return m;
}

std::deque<std::function<void()>>& pending_closures() {
  static std::deque<std::function<void()>> q;
  return q;
}

std::string shape_text(c10::IntArrayRef sizes) {
  std::string text = "[";
  for (size_t d = 0; d < sizes.size(); ++d) text += detail::str(d ? ", " : "", sizes[d]);
  return text + "]";
}

std::string one_signature(const torch::Tensor& t) {
  if (!t.defined()) return "undefined";
  return detail::str(c10::toString(t.scalar_type()), t.is_cpu() ? "" : detail::str("@", t.device()),
                     shape_text(t.sizes()));
}

// "input 0 [64, 49] -> [64, 57]" for each input whose signature differs from `before`'s.
std::string changes(const std::vector<std::string>& before, const std::vector<std::string>& now) {
  std::vector<std::string> out;
  for (size_t i = 0; i < now.size(); ++i) {
    const std::string was = i < before.size() ? before[i] : "absent";
    if (was == now[i]) continue;
    // The phase (Accelerator::compile's accumulation) comes last and names itself.
    const bool phase = now[i].rfind("phase ", 0) == 0 || was.rfind("phase ", 0) == 0;
    out.push_back(phase ? detail::str(was, " -> ", now[i])
                        : detail::str("input ", i, " ", was, " -> ", now[i]));
  }
  if (before.size() > now.size())
    out.push_back(detail::str(before.size() - now.size(), " input(s) fewer"));
  return out.empty() ? "nothing (same shapes)" : detail::join(out, ", ");
}

// From the launcher's variables (torchrun, Slurm, MPI) without joining the group: a warning must
// not start a rendezvous.
std::string rank_prefix() {
  try {
    const LaunchContract env = read_launch_contract();
    return env.world_size > 1 ? accelerant::rank_prefix(env.rank, env.world_size) : "";
  } catch (const Error&) {
    return "";  // malformed variables are ProcessState's to report
  }
}

}  // namespace

std::string shape_signature(const std::vector<torch::Tensor>& inputs) {
  std::vector<std::string> parts;
  for (const auto& t : inputs) parts.push_back(one_signature(t));
  return detail::join(parts, "; ");
}

bool GraphStepOptions::default_emulate_replays() {
  return environment_flag("ACCELERANT_EMULATE_REPLAYS").value_or(false);
}

void add_step_closure(std::function<void()> closure) {
  if (!closure) throw Error("add_step_closure: the closure is empty. Fix: pass a callable.");
  // Queued as a host effect: inside a captured step, re-queued after every replay.
  detail::host_effect_on_step_values([closure = std::move(closure)] {
    std::lock_guard<std::mutex> lock(closures_mutex());
    pending_closures().push_back(closure);
  });
}

void mark_step() {
  std::exception_ptr first_error;
  for (;;) {
    std::function<void()> next;
    {
      std::lock_guard<std::mutex> lock(closures_mutex());
      if (pending_closures().empty()) break;
      next = std::move(pending_closures().front());
      pending_closures().pop_front();
    }
    try {
      next();  // may add closures of its own: they run in this same pass, after the others
    } catch (...) {
      if (!first_error) first_error = std::current_exception();
    }
  }
  if (first_error) std::rethrow_exception(first_error);
}

struct GraphStep::Impl {
  struct Entry {
    std::vector<std::string>
        parts;  // per-input signatures (and the phase), for the recompile message
    int64_t eager_runs = 0;
    // The host work each replay repeats; `recorded` once the capture (or the CPU emulation's
    // first step) has filled it.
    detail::StepRecording recording;
    bool recorded = false;
#ifdef ACCELERANT_CUDA_GRAPHS
    std::unique_ptr<at::cuda::CUDAGraph> graph;
    Inputs static_inputs;
    Outputs static_outputs;
#endif
  };

  Function step;
  GraphStepOptions options;
  std::map<std::string, Entry> cache;
  std::vector<std::string> last_parts;
#ifdef ACCELERANT_CUDA_GRAPHS
  at::cuda::MempoolId_t pool = at::cuda::graph_pool_handle();  // one private pool for all captures
#endif

  void warn_recompile(const std::string& signature, const std::vector<std::string>& parts) const {
    std::fprintf(stderr,
                 "%saccelerant: graph step '%s' met its input signature number %zu (a recompile): "
                 "%s. Changed "
                 "since the previous step: %s. Each new shape is a new capture, slow on a GPU. "
                 "Fix: pad inputs "
                 "to a fixed length or a few bucket lengths (accelerant::pad_to_length / "
                 "pad_to_bucket) and keep "
                 "the batch size fixed (DataLoaderOptions::drop_last); or raise "
                 "GraphStepOptions::recompile_warning_after if these shapes are expected.\n",
                 rank_prefix().c_str(), options.name().c_str(), cache.size(), signature.c_str(),
                 changes(last_parts, parts).c_str());
  }

  // `names`: the inputs' names when they came as a Batch (they join the key), else empty.
  Outputs run(const Inputs& inputs, const std::vector<std::string>& names = {}) {
    if (!step)
      throw Error("GraphStep: no step function (moved from?). Fix: construct it with one.");
    GraphStepOptions::Phase phase;
    if (options.phase()) phase = options.phase()();  // its scope lives until this call returns
    std::vector<std::string> parts;
    for (size_t i = 0; i < inputs.size(); ++i) {
      parts.push_back(i < names.size() ? names[i] + " " + one_signature(inputs[i])
                                       : one_signature(inputs[i]));
    }
    if (!phase.key.empty()) parts.push_back("phase " + phase.key);
    const std::string signature = detail::join(parts, "; ");
    auto found = cache.find(signature);
    const bool hit = found != cache.end();
    if (!hit) {
      Entry entry;
      entry.parts = parts;
      found = cache.emplace(signature, std::move(entry)).first;
      if (static_cast<int64_t>(cache.size()) > options.recompile_warning_after())
        warn_recompile(signature, parts);
    }
    last_parts = parts;
    [[maybe_unused]] Entry& entry = found->second;  // what the CUDA path keeps
    const auto t0 = Clock::now();
    Outputs outputs;
    bool replayed = false;
#ifdef ACCELERANT_CUDA_GRAPHS
    if (options.cuda_graphs() && on_gpu(inputs)) {
      outputs = run_on_gpu(entry, signature, inputs, replayed);
      detail::record_step(options.name(), hit, replayed, seconds_since(t0));
      return outputs;
    }
#endif
    outputs = options.emulate_replays() ? run_emulating_replay(entry, inputs) : step(inputs);
    const double took = seconds_since(t0);
    if (!hit)
      detail::record_capture(options.name(),
                             options.emulate_replays() ? "eager, emulating replays" : "eager",
                             signature, took);
    // Eager: a known signature is what a replay would be on a GPU.
    replayed = hit;
    detail::record_step(options.name(), hit, replayed, took);
    return outputs;
  }

  // Runs `capture` (the step) with its host work going into the entry's recording; `runs_now`:
  // the device work runs as it is queued (the CPU emulation), not at a replay. A capture that
  // fails keeps nothing, so that the signature's next step records again.
  template <class Capture>
  static Outputs record(Entry& entry, bool runs_now, Capture&& capture) {
    try {
      detail::RecordingScope recording(entry.recording, runs_now);
      Outputs outputs = capture();
      entry.recorded = true;
      return outputs;
    } catch (...) {
      entry.recording = {};
      throw;
    }
  }

  // The CPU stand-in for capture and replay: the first step of a signature records the host
  // work it declares; each later one re-runs the step with that work dropped, then runs the
  // recorded work, which is what a GPU replay would do.
  Outputs run_emulating_replay(Entry& entry, const Inputs& inputs) {
    Outputs outputs;
    if (!entry.recorded) {
      outputs = record(entry, /*runs_now=*/true, [&] { return step(inputs); });
      entry.recording.run_after();
    } else {
      entry.recording.run_before();
      {
        detail::ReplayScope replaying;
        outputs = step(inputs);
      }
      entry.recording.run_after(/*emulated=*/true);
    }
    return outputs;
  }

#ifdef ACCELERANT_CUDA_GRAPHS
  static bool on_gpu(const Inputs& inputs) {
    bool any = false;
    for (const auto& t : inputs) {
      if (!t.defined()) continue;
      if (!t.is_cuda()) return false;
      any = true;
    }
    return any;
  }

  // `waiting` runs its later work only after what `done` has queued so far (an event: CUDAStream
  // has no wait() in LibTorch 1.13).
  static void wait_for(const c10::cuda::CUDAStream& waiting, const c10::cuda::CUDAStream& done) {
    at::cuda::CUDAEvent event;
    event.record(done);
    event.block(waiting);
  }

  Outputs run_on_gpu(Entry& entry, const std::string& signature, const Inputs& inputs,
                     bool& replayed) {
    if (entry.graph) {
      for (size_t i = 0; i < inputs.size(); ++i) {
        if (inputs[i].defined()) entry.static_inputs[i].copy_(inputs[i], /*non_blocking=*/true);
      }
      entry.recording.run_before();
      entry.graph->replay();
      entry.recording.run_after();
      replayed = true;
      return entry.static_outputs;
    }
    // Warm-up and capture run on a side stream (capture cannot use the default stream), ordered
    // after the work already queued and before the work that follows.
    auto current = c10::cuda::getCurrentCUDAStream();
    auto side = c10::cuda::getStreamFromPool();
    wait_for(side, current);
    Outputs outputs;
    {
      c10::cuda::CUDAStreamGuard guard(side);
      if (entry.eager_runs < options.warmup_steps()) {
        ++entry.eager_runs;
        outputs = step(inputs);
      } else {
        const auto t0 = Clock::now();
        entry.static_inputs.clear();
        for (const auto& t : inputs) entry.static_inputs.push_back(t.defined() ? t.clone() : t);
        auto graph = std::make_unique<at::cuda::CUDAGraph>();
        entry.static_outputs = record(entry, /*runs_now=*/false, [&] {
          graph->capture_begin(pool);
          try {
            Outputs captured = step(entry.static_inputs);
            graph->capture_end();
            return captured;
          } catch (...) {
            try {
              graph->capture_end();  // leave the stream out of capture mode; the graph is discarded
            } catch (...) {
            }
            throw;
          }
        });
        entry.graph = std::move(graph);
        detail::record_capture(options.name(), "CUDA graphs", signature, seconds_since(t0));
        entry.recording.run_before();
        entry.graph->replay();  // capturing recorded the step; this runs it
        replayed = true;
        outputs = entry.static_outputs;
      }
    }
    wait_for(current, side);
    if (replayed) entry.recording.run_after();  // after the replay, on the caller's stream
    return outputs;
  }
#endif
};

GraphStep::GraphStep(Function step, GraphStepOptions options) : impl_(std::make_unique<Impl>()) {
  if (!step)
    throw Error("GraphStep needs a step function; got an empty one. Fix: pass a callable.");
  if (options.recompile_warning_after() < 1 || options.warmup_steps() < 0) {
    throw Error(detail::str("GraphStepOptions: recompile_warning_after must be at least 1 (got ",
                            options.recompile_warning_after(),
                            ") and warmup_steps at least 0 (got ", options.warmup_steps(), ")."));
  }
  impl_->step = std::move(step);
  impl_->options = std::move(options);
}

GraphStep::~GraphStep() = default;
GraphStep::GraphStep(GraphStep&&) noexcept = default;
GraphStep& GraphStep::operator=(GraphStep&&) noexcept = default;

GraphStep::Outputs GraphStep::operator()(const Inputs& inputs) {
  if (!impl_)
    throw Error("GraphStep: used after being moved from. Fix: use the object it was moved to.");
  Outputs outputs = impl_->run(inputs);
  mark_step();
  return outputs;
}

GraphStep::Outputs GraphStep::run_batch(const Batch& batch) {
  if (!impl_)
    throw Error("GraphStep: used after being moved from. Fix: use the object it was moved to.");
  Inputs inputs;
  std::vector<std::string> names;
  for (auto& [name, tensor] : batch.items()) {
    names.push_back(name);
    inputs.push_back(std::move(tensor));
  }
  Outputs outputs = impl_->run(inputs, names);
  mark_step();
  return outputs;
}

int64_t GraphStep::signatures() const {
  return impl_ ? static_cast<int64_t>(impl_->cache.size()) : 0;
}

const GraphStepOptions& GraphStep::options() const { return impl_->options; }

}  // namespace accelerant
