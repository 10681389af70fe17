// Which process this is and how it talks to the others. Usable on its own, without an
// Accelerator: ProcessState::get() reads the environment once (see launch_contract.h), and when
// the world has more than one process it meets the others through c10d's TCPStore (hosted by
// rank 0, or by the launcher's agent) and opens a Gloo group (NCCL too in CUDA builds).
#pragma once

#include <torch/types.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "accelerant/communicator.h"
#include "accelerant/launch_contract.h"
#include "accelerant/options.h"

namespace accelerant {

/// Options of ProcessState::initialize: how long to wait for the other processes, whether to check
/// collectives across ranks, and whether to stay on the CPU. Each unset one falls back to the
/// variable the launcher set (ACCELERANT_TIMEOUT_MS, ACCELERANT_DEBUG_MODE), then its default.
struct ProcessStateOptions {
  /// Collective timeout: how long a collective every rank entered may take. The join at start-up
  /// has its own (ACCELERANT_JOIN_TIMEOUT_MS, else 10 minutes), and a hang in which no collective
  /// can complete is named in seconds by the watchdog (docs/collectives.md). Default:
  /// ACCELERANT_TIMEOUT_MS, else 30 minutes.
  ACCELERANT_OPTION(std::optional<std::chrono::milliseconds>, collective_timeout) = std::nullopt;
  /// Cross-rank shape checks before every collective. Default: ACCELERANT_DEBUG_MODE, else off.
  ACCELERANT_OPTION(std::optional<bool>, debug) = std::nullopt;
  /// Stay on the CPU even when a GPU is visible. Default: false.
  ACCELERANT_OPTION(bool, cpu) = false;
};

/// This process's place in the job, its device and its Communicator to the other processes: one
/// per process, shared by the Accelerator and by code that uses it directly. get() or initialize()
/// creates it (with a rendezvous when the job has more than one process) and shutdown() ends it.
/// Not copyable.
class ProcessState {
 public:
  /// The process state, initialised from the environment with default options on first use.
  static ProcessState& get();
  /// Initialises with `options`. Throws if already initialised (call it before anything else).
  static ProcessState& initialize(const ProcessStateOptions& options = {});
  /// True once get() or initialize() has created the state and shutdown() has not since ended it.
  /// Creates nothing itself.
  static bool initialized();
  /// Waits (through the store, up to the timeout) until every rank has called shutdown, then
  /// closes the group. Safe to call when not initialised. Launchers call it after the worker's
  /// function returns, so that no rank exits while another still reads from it.
  static void shutdown();

  /// The launcher's description of this process that the state was built from, as read once by
  /// read_launch_contract() (launch_contract.h).
  const LaunchContract& env() const;
  /// This process's global rank, 0 to world_size() - 1 (RANK, or the Slurm and Open MPI
  /// equivalents); 0 when the program was not launched as several processes.
  int rank() const;
  /// Processes in the whole job, across every machine (WORLD_SIZE); 1 when not launched.
  int world_size() const;
  /// This process's index among the processes on its machine, 0 to local_world_size() - 1
  /// (LOCAL_RANK); it picks the GPU.
  int local_rank() const;
  /// Processes on this machine (LOCAL_WORLD_SIZE).
  int local_world_size() const;
  /// Accelerate's name for rank() (docs/names.md), kept so that a port of a Python script
  /// compiles; deprecated: the warning names the one name.
  [[deprecated("Accelerant's name is rank()")]] int process_index() const { return rank(); }
  /// Accelerate's name for world_size(); deprecated.
  [[deprecated("Accelerant's name is world_size()")]] int num_processes() const {
    return world_size();
  }
  /// Accelerate's name for local_rank(); deprecated.
  [[deprecated("Accelerant's name is local_rank()")]] int local_process_index() const {
    return local_rank();
  }
  /// Accelerate's name for local_world_size(); deprecated.
  [[deprecated("Accelerant's name is local_world_size()")]] int num_local_processes() const {
    return local_world_size();
  }
  /// This machine's index among the job's machines, 0 to num_nodes() - 1 (GROUP_RANK).
  int node_rank() const;
  /// Machines taking part in the job; 1 when not launched.
  int num_nodes() const;
  /// True on global rank 0 only: the one process of the job that should print a summary or write
  /// a shared file.
  bool is_main_process() const;
  /// True on local rank 0: one process per machine, e.g. to fill a machine-local cache.
  bool is_local_main_process() const;
  /// True when the job has more than one process, and so a rendezvous and a process group.
  bool distributed() const;
  /// How many times the group was formed again before this one, the generation: by a restart of
  /// the whole group, or by regroup() around a replacement (0 the first time).
  int restart_count() const;
  /// Forms the group again as its next generation, with the processes still alive and the ones
  /// the launcher started in place of failed ones (LaunchOptions::recovery,
  /// Recovery::kReplaceFailedWorker, which starts each with that generation): a collective of
  /// the new group, through the job's store. The communicator() stays the same object, its
  /// collectives numbered from 0 again; restart_count() becomes the new generation. Call it on
  /// every surviving process after a collective failed because a process died (CollectiveError),
  /// at the same point of the program. Throws Error, naming the processes that did not join,
  /// after the join timeout. Nothing to do with one process.
  void regroup();
  /// Whether collectives first check op, dtype and shape across ranks (communicator.h):
  /// ProcessStateOptions::debug, else ACCELERANT_DEBUG_MODE, else off.
  bool debug() const;
  /// The collective timeout in force: ProcessStateOptions::collective_timeout, else
  /// ACCELERANT_TIMEOUT_MS, else 30 minutes.
  std::chrono::milliseconds collective_timeout() const;
  /// `cuda:<local rank>` (modulo the visible GPUs) when a GPU is visible and `cpu` is off, else
  /// cpu.
  torch::Device device() const;
  /// "[rank r/N] " when distributed, "" otherwise: the prefix of every message about this rank.
  std::string rank_prefix() const;

  /// The collectives between this job's processes, set up at the rendezvous. With one process it
  /// is a communicator of one, whose collectives return (a copy of) their input.
  Communicator& communicator();

  /// Returns when every process has reached this call.
  void wait_for_everyone();

  /// Runs `fn` on the main process first, then on the others (e.g. to download or preprocess
  /// once and let the others read the cache).
  template <class Fn>
  void main_process_first(Fn&& fn);

  /// This process's contiguous share of `items`: the first (size % N) processes get one more.
  /// With `apply_padding`, every share has the same length, padded with the last item.
  template <class T>
  std::vector<T> split_between_processes(const std::vector<T>& items,
                                         bool apply_padding = false) const;

  ProcessState(const ProcessState&) = delete;
  ProcessState& operator=(const ProcessState&) = delete;
  ~ProcessState();

 private:
  struct Impl;  // src/comm/process_state.cpp: the contract, the settings, the rendezvous's store
  ProcessState(LaunchContract env, const ProcessStateOptions& options);  // get() and initialize()
  std::unique_ptr<Impl> impl_;
};

template <class Fn>
void ProcessState::main_process_first(Fn&& fn) {
  if (!is_main_process()) wait_for_everyone();
  fn();
  if (is_main_process()) wait_for_everyone();
}

template <class T>
std::vector<T> ProcessState::split_between_processes(const std::vector<T>& items,
                                                     bool apply_padding) const {
  const size_t n = static_cast<size_t>(world_size());
  const size_t r = static_cast<size_t>(rank());
  const size_t base = items.size() / n;
  const size_t extra = items.size() % n;
  const size_t begin = r * base + std::min(r, extra);
  const size_t count = base + (r < extra ? 1 : 0);
  std::vector<T> share(items.begin() + begin, items.begin() + begin + count);
  if (apply_padding && !items.empty()) {
    const size_t longest = base + (extra > 0 ? 1 : 0);
    while (share.size() < longest) share.push_back(share.empty() ? items.back() : share.back());
  }
  return share;
}

}  // namespace accelerant
