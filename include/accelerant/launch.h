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
// LaunchError naming the first failed rank, its exit code or signal and the tail of its stderr.
//
// One binary under every launcher: when `accelerant launch`, torchrun, srun or mpirun started
// this process, launch forks nothing and runs `fn` here as this process's rank, so
// `srun -n 2 ./train` is one 2-rank job, never two nested ones.
#pragma once

#include <torch/arg.h>
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

namespace accelerant {

/// Options of launch() and launch_program(), set with chained setters
/// (`LaunchOptions().processes_per_node(4)`): the size and shape of the group, its rendezvous,
/// restarts, the settings passed to the workers, and what becomes of their output. Invalid values
/// make launch throw LaunchError before anything is forked.
struct LaunchOptions {
  /// Worker processes on this machine (torchrun: nproc_per_node; each worker sees it as
  /// LOCAL_WORLD_SIZE). Not Config::num_processes, which counts across machines. Default: 1.
  TORCH_ARG(int, processes_per_node) = 1;
  /// Address of the machine with node_rank 0, where the job's store listens. Default: 127.0.0.1.
  TORCH_ARG(std::string, master_addr) = "127.0.0.1";
  /// Port of the job's store. 0 = a free port chosen by the operating system (one machine only;
  /// with num_nodes > 1 every node must be told the same port). Default: 0.
  TORCH_ARG(int, master_port) = 0;
  /// This machine's index among num_nodes. Default: 0.
  TORCH_ARG(int, node_rank) = 0;
  /// Machines in the job, each running its own launch with the same processes_per_node. Default: 1.
  TORCH_ARG(int, num_nodes) = 1;
  /// How often the whole group is restarted after a worker fails. Default: 0.
  TORCH_ARG(int, max_restarts) = 0;
  /// How often the agent checks its workers. Default: 100 ms.
  TORCH_ARG(std::chrono::milliseconds, monitor_interval) = std::chrono::milliseconds(100);
  /// Passed to workers as ACCELERANT_MIXED_PRECISION: no, fp16 or bf16 (parse_mixed_precision).
  /// Default: "no".
  TORCH_ARG(std::string, mixed_precision) = "no";
  /// Passed to workers as ACCELERANT_DOWNCAST_BF16: the Accelerator keeps bf16 weights.
  /// Default: unset (each worker resolves it: its environment, its config file, false).
  TORCH_ARG(std::optional<bool>, downcast_bf16) = std::nullopt;
  /// Passed to workers as ACCELERANT_USE_CPU: the Accelerator trains on the CPU even when CUDA is
  /// available. Default: unset (each worker resolves it: its environment, its config file, false).
  TORCH_ARG(std::optional<bool>, use_cpu) = std::nullopt;
  /// Passed to workers as ACCELERANT_GRADIENT_ACCUMULATION_STEPS: micro-batches per optimizer
  /// step, 1 or more. Default: unset (each worker resolves it: its environment, its config file,
  /// 1).
  TORCH_ARG(std::optional<int64_t>, gradient_accumulation_steps) = std::nullopt;
  /// Intra-op threads per worker. 0 = cores / processes_per_node (at least 1). When this process
  /// has already started threads (LibTorch's OpenMP pool, OpenBLAS), forked workers cannot use
  /// thread pools safely, so they run single-threaded and launch says so. Default: 0.
  TORCH_ARG(int, threads_per_process) = 0;
  /// Debug mode: a dry fork first, then cross-rank shape checks before every collective.
  /// Default: ACCELERANT_DEBUG_MODE, else off.
  TORCH_ARG(std::optional<bool>, debug) = std::nullopt;
  /// With num_nodes > 1: how long the launchers wait for every machine to arrive (and, after a
  /// restart, to be ready again) before giving up, naming the machines that did not come.
  /// Default: 10 minutes (torchrun's join_timeout).
  TORCH_ARG(std::chrono::milliseconds, join_timeout) = std::chrono::minutes(10);
  /// Rendezvous and collective timeout inside the workers (passed as ACCELERANT_TIMEOUT_MS): a
  /// collective that does not complete within it fails, naming the ranks it waited for.
  /// Default: unset = this process's ACCELERANT_TIMEOUT_MS when the user set it, else 30 minutes.
  TORCH_ARG(std::optional<std::chrono::milliseconds>, timeout) = std::nullopt;
  /// Time between SIGTERM and SIGKILL when the group is stopped. Default: 5 s.
  TORCH_ARG(std::chrono::milliseconds, stop_grace_period) = std::chrono::seconds(5);
  /// Prefix every line a worker prints with "[rank r/N] " (rank_prefix). Default: false.
  TORCH_ARG(bool, prefix_output) = false;
  /// Directory for per-rank logs: `attempt_<n>/rank_<r>.stdout` and `.stderr` (one directory per
  /// restart attempt). Empty = no log files. Default: empty.
  TORCH_ARG(std::string, log_dir) = "";
  /// With log_dir: also show the workers' output on the console (without log_dir it always is).
  /// Default: false.
  TORCH_ARG(bool, tee) = false;
  /// Lines of a failed worker's stderr kept for the error report. Default: 20.
  TORCH_ARG(int, stderr_tail_lines) = 20;
  /// Print the "Launching training on N CPUs." banner and restart notices. Default: true.
  TORCH_ARG(bool, verbose) = true;
};

/// What a forked worker runs: the job's function for the worker with global rank `index`, its
/// result serialised (empty for none).
using WorkerBody = std::function<std::vector<char>(int index)>;

/// The agent behind launch() and launch_program(): forks options.processes_per_node workers that
/// each run `body`, watches them, restarts the group after a failure up to max_restarts, relays
/// their output and reports the first failure. Returns each local worker's bytes in local rank
/// order. Throws LaunchError when the group fails after max_restarts restarts. launch() is this
/// with the result serialised for you; call this one to move your own bytes.
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
/// result: test read_launch_contract().rank == 0 to report once. LaunchOptions, when
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

/// Runs `command` (a program and its arguments; no shell) as options.processes_per_node workers on
/// this machine: the agent of launch() (rendezvous variables, watching, restarts, output relay,
/// failure report) with each worker exec'ing the program. Returns once every worker exited 0.
/// Throws Error when the program cannot be run, and LaunchError when the group fails after
/// max_restarts restarts. This is `accelerant launch`.
void launch_program(const std::vector<std::string>& command, const LaunchOptions& options);

}  // namespace accelerant
