// Which process this is and how it talks to the others. Usable on its own, without an
// Accelerator: ProcessState::get() reads the environment once (see distributed_env.h), and when
// the world has more than one process it meets the others through c10d's TCPStore (hosted by
// rank 0, or by the launcher's agent) and opens a Gloo group (NCCL too in CUDA builds).
#pragma once

#include <torch/arg.h>
#include <torch/types.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "accelerant/communicator.h"
#include "accelerant/distributed_env.h"

namespace accelerant {

struct ProcessStateOptions {
  /// Rendezvous and collective timeout. Default: ACCELERANT_TIMEOUT_MS, else 30 minutes.
  TORCH_ARG(std::optional<std::chrono::milliseconds>, timeout) = std::nullopt;
  /// Cross-rank shape checks before every collective. Default: ACCELERANT_DEBUG_MODE, else off.
  TORCH_ARG(std::optional<bool>, debug_mode) = std::nullopt;
  /// Stay on the CPU even when a GPU is visible. Default: false.
  TORCH_ARG(bool, cpu) = false;
};

class ProcessState {
 public:
  /// The process state, initialised from the environment with default options on first use.
  static ProcessState& get();
  /// Initialises with `options`. Throws if already initialised (call it before anything else).
  static ProcessState& initialize(const ProcessStateOptions& options = {});
  static bool initialized();
  /// Waits (through the store, up to the timeout) until every rank has called shutdown, then
  /// closes the group. Safe to call when not initialised. Launchers call it after the worker's
  /// function returns, so that no rank exits while another still reads from it.
  static void shutdown();

  const DistributedEnv& env() const { return env_; }
  int process_index() const { return env_.rank; }
  int num_processes() const { return env_.world_size; }
  int local_process_index() const { return env_.local_rank; }
  int num_local_processes() const { return env_.local_world_size; }
  int node_index() const { return env_.node_rank; }
  int num_nodes() const { return env_.num_nodes; }
  bool is_main_process() const { return env_.rank == 0; }
  bool is_local_main_process() const { return env_.local_rank == 0; }
  bool distributed() const { return env_.world_size > 1; }
  /// How many times the launcher has restarted the group before this attempt (0 the first time).
  int restart_count() const { return env_.restart_count; }
  bool debug_mode() const { return debug_mode_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  /// cuda:<local rank> when a GPU is visible and `cpu` is off, else cpu.
  torch::Device device() const { return device_; }
  /// "[rank r/N] " when distributed, "" otherwise: the prefix of every message about this rank.
  std::string rank_prefix() const;

  Communicator& communicator() { return communicator_; }

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
  ProcessState(DistributedEnv env, const ProcessStateOptions& options);
  void rendezvous();

  DistributedEnv env_;
  std::chrono::milliseconds timeout_;
  bool debug_mode_;
  torch::Device device_;
  Communicator communicator_;
  struct Rendezvous;
  std::unique_ptr<Rendezvous> rendezvous_;
};

namespace detail {
/// In a freshly forked worker: drop (without destroying) the parent's state, whose threads and
/// sockets do not exist in the child, so that the worker reads its own environment.
void forget_process_state_after_fork();
}  // namespace detail

template <class Fn>
void ProcessState::main_process_first(Fn&& fn) {
  if (!is_main_process()) wait_for_everyone();
  fn();
  if (is_main_process()) wait_for_everyone();
}

template <class T>
std::vector<T> ProcessState::split_between_processes(const std::vector<T>& items,
                                                     bool apply_padding) const {
  const size_t n = static_cast<size_t>(num_processes());
  const size_t r = static_cast<size_t>(process_index());
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
