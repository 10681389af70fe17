// accelerant::launch: start workers from inside a running program (the C++ counterpart of
// Accelerate's notebook_launcher and PyTorch/XLA's xmp.spawn).
//
//   auto model = build_model();                       // built once, before the fork
//   auto losses = accelerant::launch(
//       [](int index, Net& model) { ...; return loss; },  // index = the worker's global rank
//       std::ref(*model), accelerant::LaunchOptions().processes_per_node(4));
//
// Workers are fork()ed: objects built before launch are shared copy-on-write, so four workers
// reading one 200 MB model cost about 200 MB, not 800 (docs/launching.md measures it). Each worker
// sees the torchrun variables (RANK, WORLD_SIZE, ...), so ProcessState::get() inside `fn` joins the
// group. launch returns fn's results in local rank order once every worker has returned, and
// restarts the whole local group when a worker fails, up to max_restarts; after that it throws
// LaunchError naming the first failed rank, its exit code or signal and the tail of its stderr. A
// worker whose fn returned while others still run and then sit idle for 3 s (waiting in a
// collective it skipped) counts as failed too (docs/launching.md).
//
// One binary under every launcher: when `accelerant launch`, torchrun, srun or mpirun started
// this process, launch forks nothing and runs `fn` here as this process's rank, so
// `srun -n 2 ./train` is one 2-rank job, never two nested ones. This process then is the worker:
// if `fn` throws, launch reports it as a forked worker does ("[rank r/w] worker failed with an
// uncaught exception: ..." on stderr, and in the outer launcher's error file, which torchrun's
// failure summary quotes) and ends the process with exit status 1; it does not return.
#pragma once

#include <torch/serialize.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "accelerant/error.h"
#include "accelerant/launch_options.h"
#include "accelerant/launch_plan.h"

namespace accelerant {

/// The agent behind launch(): forks options.processes_per_node workers that each run `body`,
/// watches them, restarts the group after a failure up to max_restarts, relays their output and
/// reports the first failure (launch_program runs the same agent without LibTorch). Returns each
/// local worker's bytes in local rank order; empty on a machine that came to join an elastic job
/// (LaunchOptions::min_nodes) which finished before it could. Throws LaunchError when the group
/// fails after max_restarts restarts. launch() is this with the result serialised for you; call
/// this one to move your own bytes.
///
/// When a launcher already started this process (read_launch_contract().launched(): `accelerant
/// launch`, torchrun, srun, mpirun), nothing is forked: `body` runs here, once, as this process's
/// rank, and the result holds its bytes alone. Every process of the outer job does the same, so
/// the job is one group whichever launcher started it; the outer launcher owns restarts, and the
/// options that shape a group (processes_per_node, num_nodes, ports) do not apply.
std::vector<std::vector<char>> launch_serialized(const LaunchOptions& options,
                                                 const WorkerBody& body);

namespace detail {

template <class R>
std::vector<char> encode_result(const R& value) {
  if constexpr (std::is_integral_v<R> && !std::is_same_v<R, bool>) {
    return torch::pickle_save(c10::IValue(static_cast<int64_t>(value)));
  } else if constexpr (std::is_floating_point_v<R>) {
    return torch::pickle_save(c10::IValue(static_cast<double>(value)));
  } else {
    return torch::pickle_save(c10::IValue(value));
  }
}

template <class R>
R decode_result(const std::vector<char>& bytes) {
  c10::IValue value = torch::pickle_load(bytes);
  if constexpr (std::is_same_v<R, bool>) {
    return value.toBool();
  } else if constexpr (std::is_integral_v<R>) {
    return static_cast<R>(value.toInt());
  } else if constexpr (std::is_floating_point_v<R>) {
    return static_cast<R>(value.toDouble());
  } else if constexpr (std::is_same_v<R, std::string>) {
    return value.toStringRef();
  } else {
    return value.to<R>();
  }
}

// fn(index, args...) when fn takes the index first, else fn(args...).
template <class Fn, class Tuple, size_t... I>
decltype(auto) call_worker(Fn& fn, int index, Tuple& args, std::index_sequence<I...>) {
  if constexpr (std::is_invocable_v<Fn&, int, decltype(std::get<I>(args))...>) {
    return std::invoke(fn, index, std::get<I>(args)...);
  } else {
    static_assert(
        std::is_invocable_v<Fn&, decltype(std::get<I>(args))...>,
        "accelerant::launch: fn must be callable as fn(int index, args...) or fn(args...)");
    return std::invoke(fn, std::get<I>(args)...);
  }
}

template <class Fn, class Tuple, size_t N>
auto launch_with(const LaunchOptions& options, Fn& fn, Tuple& args) {
  auto run = [&](int index) -> decltype(auto) {
    return call_worker(fn, index, args, std::make_index_sequence<N>{});
  };
  using R = std::decay_t<decltype(run(0))>;
  if constexpr (std::is_void_v<R>) {
    launch_serialized(options, [&](int index) {
      run(index);
      return std::vector<char>{};
    });
  } else {
    auto raw = launch_serialized(options, [&](int index) { return encode_result<R>(run(index)); });
    std::vector<R> results;
    results.reserve(raw.size());
    for (const auto& bytes : raw) results.push_back(decode_result<R>(bytes));
    return results;
  }
}

}  // namespace detail

/// Forks options.processes_per_node workers that each run fn(index, args...) (or fn(args...)), and
/// returns their results in local rank order (nothing when fn returns void). Under an outer
/// launcher (launch_serialized) fn runs in this process as its rank and the vector holds that one
/// result: prepare_launch (launch_plan.h), called first, says which process reports for the job
/// and keeps the thread pools of a forking process unstarted. LaunchOptions, when
/// given, is the last argument. Results travel through torch::pickle_save, so fn may return
/// numbers, strings, tensors and lists of them. Arguments are the parent's own objects, shared
/// copy-on-write: pass large ones by reference (std::ref) to avoid a copy before the fork.
/// Throws LaunchError when the group fails after max_restarts restarts. SIGINT or SIGTERM to this
/// process stops every worker first, then takes its usual effect.
template <class Fn, class... Rest>
auto launch(Fn&& fn, Rest&&... rest) {
  constexpr size_t n = sizeof...(Rest);
  if constexpr (n > 0 &&
                std::is_same_v<std::decay_t<std::tuple_element_t<n - 1, std::tuple<Rest...>>>,
                               LaunchOptions>) {
    auto all = std::forward_as_tuple(std::forward<Rest>(rest)...);
    const LaunchOptions& options = std::get<n - 1>(all);
    return detail::launch_with<Fn, decltype(all), n - 1>(options, fn, all);
  } else {
    auto all = std::forward_as_tuple(std::forward<Rest>(rest)...);
    return detail::launch_with<Fn, decltype(all), n>(LaunchOptions(), fn, all);
  }
}

}  // namespace accelerant
