// Communicator's private state, shared by communicator.cpp and process_state.cpp (which builds it
// after the rendezvous), and the one way in to it. Not installed.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "accelerant/communicator.h"
#include "base/torch_compat.h"
#include "comm/collective_watchdog.h"
#include "comm/flight_recorder.h"
#include "comm/shm_all_reduce.h"

namespace accelerant {

struct Communicator::Impl {
  c10::intrusive_ptr<c10d::Store> store;  // this attempt's store, for debug checks and diagnosis
  c10::intrusive_ptr<detail::CommBackend> gloo;  // CPU tensors
  c10::intrusive_ptr<detail::CommBackend> nccl;  // CUDA tensors (CUDA builds only), may be null
  // CPU all-reduces when every rank is on this machine (null otherwise, or when turned off)
  std::unique_ptr<detail::ShmAllReduce> shm;
  std::string all_reduce_path = "Gloo";  // in words, for logs and `accelerant env`
  int rank = 0;
  int size = 1;
  std::chrono::milliseconds timeout{std::chrono::minutes(30)};
  bool debug = false;
  std::string rank_prefix;  // "[rank r/N] "
  // Counts public collectives; equal on all ranks while they agree. Atomic: the watchdog reads it.
  std::atomic<int64_t> sequence{0};
  std::string broken_reason;
  std::string error_file;         // ACCELERANT_ERROR_FILE: its flight record is written next to it
  detail::FlightRecorder flight;  // the last collectives, for the failure report
  detail::BlockedIn blocked;      // the collective the caller waits in now, for the watchdog
  // Names hangs in seconds (null: one process, or a timeout short enough to name them itself).
  // Last, so that it stops before what it reads is destroyed.
  std::unique_ptr<detail::CollectiveWatchdog> watchdog;

  detail::CommBackend& backend_for(const torch::Tensor& t) const;
};

namespace detail {

// What only the library may do with a Communicator or a PendingCollective: build one around its
// private state. communicator.h befriends this struct instead of declaring constructors that take
// that state, so that user code sees neither the state nor a constructor it must not call.
struct CommunicatorAccess {
  using Impl = Communicator::Impl;
  using PendingState = PendingCollective::State;  // defined in communicator.cpp

  // The communicator over a group ProcessState opened at the rendezvous.
  static Communicator make(std::unique_ptr<Impl> impl) {
    Communicator made;
    made.impl_ = std::move(impl);
    return made;
  }
  // The store of the communicator's generation (null with one process): where the launcher reads
  // about the generation (agent.cpp). It outlives the group, for a last word to the launcher
  // after ProcessState::shutdown.
  static c10::intrusive_ptr<c10d::Store> store(Communicator& communicator) {
    return communicator.impl_ ? communicator.impl_->store : c10::intrusive_ptr<c10d::Store>();
  }
  // Writes `value` under `key` in that store; nothing with one process.
  static void publish(Communicator& communicator, const std::string& key,
                      const std::string& value) {
    if (auto s = store(communicator)) s->set(key, bytes_of(value));
  }
  // Whether `key` is in that store; false with one process.
  static bool has_key(Communicator& communicator, const std::string& key) {
    auto s = store(communicator);
    return s && s->check({key});
  }
  // Sets `key` to `desired` unless it holds a value other than `expected` ("" = absent); returns
  // the value it holds then (c10d's compareSet). With one process: `desired`.
  static std::string compare_set(Communicator& communicator, const std::string& key,
                                 const std::string& expected, const std::string& desired) {
    auto s = store(communicator);
    if (!s) return desired;
    const auto held = s->compareSet(key, bytes_of(expected), bytes_of(desired));
    return std::string(held.begin(), held.end());
  }
  static std::vector<uint8_t> bytes_of(const std::string& text) {
    return std::vector<uint8_t>(text.begin(), text.end());
  }
  // The handle of a collective a *_async_ call started.
  static PendingCollective pending(std::shared_ptr<PendingState> state) {
    PendingCollective made;
    made.state_ = std::move(state);
    return made;
  }
};

}  // namespace detail

}  // namespace accelerant
