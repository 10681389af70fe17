// While a launch runs, SIGINT, SIGTERM and SIGHUP are caught and turned into a readable byte on a
// pipe, so the agent's poll loop can stop every worker before the signal takes its usual effect
// (re-raised once the workers are gone). Workers restore the default handlers right after fork.
#pragma once

#include <csignal>
#include <vector>

namespace accelerant::detail {

class SignalGuard {
 public:
  SignalGuard();   // throws Error when another launch in this process holds the guard
  ~SignalGuard();  // restores the previous handlers
  SignalGuard(const SignalGuard&) = delete;
  SignalGuard& operator=(const SignalGuard&) = delete;

  /// Readable when a signal arrived.
  int wake_fd() const;
  /// The first signal caught, 0 if none.
  int caught() const;
  /// Restores the previous handlers and raises the caught signal again.
  void reraise();

  /// In a forked child: default handlers, nothing blocked, the parent's pipe closed.
  static void reset_in_child();

 private:
  void restore();
  std::vector<std::pair<int, struct sigaction>> previous_;
  bool restored_ = false;
};

}  // namespace accelerant::detail
