// A one-line progress display for training loops: step, loss, rate and ETA. On a terminal it
// redraws one line; otherwise (logs, CI, pipes) it prints a plain line every tenth of the way,
// so that a log stays readable.
#pragma once
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

class Progress {
 public:
  Progress(std::string label, int64_t total, bool enabled)
      : label_(std::move(label)),
        total_(total),
        enabled_(enabled),
        tty_(isatty(STDOUT_FILENO) == 1),
        start_(std::chrono::steady_clock::now()) {}

  void update(int64_t done, double loss) {
    if (!enabled_ || total_ <= 0) return;
    const bool last = done == total_;
    const int64_t tenth = total_ / 10 > 0 ? total_ / 10 : 1;
    if (!tty_ && !last && done % tenth != 0) return;
    const double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    const double eta =
        done > 0 ? elapsed * static_cast<double>(total_ - done) / static_cast<double>(done) : 0.0;
    constexpr int kWidth = 24;
    const int filled = static_cast<int>(kWidth * done / total_);
    std::string bar(static_cast<size_t>(filled), '#');
    bar.append(static_cast<size_t>(kWidth - filled), '.');
    std::printf("%s%s [%s] %lld/%lld  loss %.4f  %.1f s  ETA %.1f s%s", tty_ ? "\r" : "",
                label_.c_str(), bar.c_str(), static_cast<long long>(done),
                static_cast<long long>(total_), loss, elapsed, eta, tty_ && !last ? "" : "\n");
    std::fflush(stdout);
  }

 private:
  std::string label_;
  int64_t total_;
  bool enabled_;
  bool tty_;
  std::chrono::steady_clock::time_point start_;
};
