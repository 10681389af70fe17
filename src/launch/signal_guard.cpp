#include "launch/signal_guard.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>

#include "accelerant/error.h"

namespace accelerant::detail {
namespace {

constexpr int kSignals[] = {SIGINT, SIGTERM, SIGHUP};
int g_pipe[2] = {-1, -1};
volatile sig_atomic_t g_caught = 0;
std::atomic<bool> g_active{false};

void on_signal(int sig) {
  const int saved = errno;
  if (g_caught == 0) g_caught = sig;
  const char byte = static_cast<char>(sig);
  (void)!::write(g_pipe[1], &byte, 1);
  errno = saved;
}

}  // namespace

SignalGuard::SignalGuard() {
  if (g_active.exchange(true)) {
    throw Error(
        "accelerant::launch was called while another launch is running in this process. Fix: "
        "run launches one after another, or start independent jobs as separate programs.");
  }
  if (::pipe2(g_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
    g_active = false;
    throw Error(
        "accelerant::launch could not create its signal pipe. Likely cause: this process is out of "
        "file descriptors. Fix: close unused files or raise `ulimit -n`.");
  }
  g_caught = 0;
  struct sigaction action {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  for (int sig : kSignals) {
    struct sigaction old {};
    ::sigaction(sig, &action, &old);
    previous_.push_back({sig, old});
  }
}

SignalGuard::~SignalGuard() { restore(); }

void SignalGuard::restore() {
  if (restored_) return;
  restored_ = true;
  for (auto& [sig, old] : previous_) ::sigaction(sig, &old, nullptr);
  ::close(g_pipe[0]);
  ::close(g_pipe[1]);
  g_pipe[0] = g_pipe[1] = -1;
  g_active = false;
}

int SignalGuard::wake_fd() const { return g_pipe[0]; }
int SignalGuard::caught() const { return g_caught; }

void SignalGuard::reraise() {
  const int sig = g_caught;
  restore();
  if (sig != 0) ::raise(sig);
}

void SignalGuard::reset_in_child() {
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  for (int sig : kSignals) ::sigaction(sig, &dfl, nullptr);
  ::signal(SIGPIPE, SIG_DFL);
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  if (g_pipe[0] >= 0) ::close(g_pipe[0]);
  if (g_pipe[1] >= 0) ::close(g_pipe[1]);
  g_pipe[0] = g_pipe[1] = -1;
  g_active = false;
}

}  // namespace accelerant::detail
