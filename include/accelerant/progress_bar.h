// A one-line progress display for training loops: how far, how fast, how long still, and a short
// text of the caller's (the loss). On a terminal it redraws its line with '\r'; anywhere else (a
// log file, CI, a pipe) it prints a plain line now and then, so that a log stays readable. Under
// `accelerant launch` a worker's output is a pipe to the launcher, which says in
// ACCELERANT_CONSOLE_TERMINAL whether it relays that output to a terminal: then the bar redraws,
// and the launcher passes each redraw through at once (docs/observability.md "Progress bar").
//
//   accelerant::ProgressBar bar(accelerant::ProgressBarOptions()
//                                   .total(loader.size())
//                                   .label("epoch 1/3")
//                                   .enabled(acc.is_main_process()));
//   for (...) { ...; bar.update(++step, "loss 0.43"); }
//   bar.close();
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <utility>

#include "accelerant/options.h"

namespace accelerant {

/// Options of ProgressBar, set with chained setters (`ProgressBarOptions().total(100)`). The
/// ProgressBar constructor throws Error for a negative total, initial or interval, or an initial
/// above the total.
struct ProgressBarOptions {
  /// A C stream (stderr, stdout or one from fopen); a name of its own so that the setter's
  /// `const CStream&` keeps the pointer itself const, not the FILE.
  using CStream = std::FILE*;
  /// Steps in the whole run. 0: unknown (no percentage, bar or ETA, only the count and rate).
  /// Default: 0.
  ACCELERANT_OPTION(int64_t, total) = 0;
  /// Steps already done when the bar starts (a resumed epoch): shown in the count, left out of the
  /// rate. Default: 0.
  ACCELERANT_OPTION(int64_t, initial) = 0;
  /// Text before the bar, e.g. "epoch 1/3". Default: none.
  ACCELERANT_OPTION(std::string, label) = "";
  /// Whether anything is drawn at all; pass Accelerator::is_main_process() so that one process
  /// reports. A disabled bar prints nothing and costs a branch per update. Default: true.
  ACCELERANT_OPTION(bool, enabled) = true;
  /// Where the bar goes: stderr, so that a program's results on stdout stay clean. Default: stderr.
  ACCELERANT_OPTION(CStream, stream) = stderr;
  /// Redraw one line (true) or print plain lines (false). Default: unset, meaning redraw when
  /// `stream` is a terminal, or a pipe that the launcher relays to one
  /// (ACCELERANT_CONSOLE_TERMINAL).
  ACCELERANT_OPTION(std::optional<bool>, terminal) = std::nullopt;
  /// On a terminal, the least time between two redraws: a fast loop must not spend its time
  /// drawing, nor flood the launcher's relay. The last step is always drawn. Default: 0.1 s.
  ACCELERANT_OPTION(std::chrono::duration<double>,
                    redraw_interval) = std::chrono::duration<double>(0.1);
  /// Off a terminal, a line each time this fraction of the total is done (0: none by fraction).
  /// Default: 0.1 (a line every 10%).
  ACCELERANT_OPTION(double, line_fraction) = 0.1;
  /// Off a terminal, also a line when this much time passed since the last one, so that a slow or
  /// open-ended run still shows it is alive (0: none by time). Default: 30 s.
  ACCELERANT_OPTION(std::chrono::duration<double>,
                    line_interval) = std::chrono::duration<double>(30.0);
  /// Characters of the bar itself ([####....]). Default: 24.
  ACCELERANT_OPTION(int, width) = 24;
};

/// A progress display; see the file comment. Not thread-safe: one thread updates it.
class ProgressBar {
 public:
  /// Checks the options (throws Error naming the bad value) and starts the clock. Prints nothing
  /// yet.
  explicit ProgressBar(ProgressBarOptions options);
  /// Calls close().
  ~ProgressBar();
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  /// `done` steps are complete (a count, not an increment: resumed or skipped steps need no
  /// arithmetic); `postfix` is shown after the numbers, e.g. "loss 0.4312". Draws when the
  /// options say it is time. Throws Error for a negative `done` or one above a known total.
  void update(int64_t done, const std::string& postfix = "");
  /// Draws the final state once more if it was not drawn, and ends the line on a terminal. Later
  /// updates print nothing. Called by the destructor; calling it twice is harmless.
  void close();

  /// The line for `done` steps after `elapsed` (without the carriage return or newline): what the
  /// bar prints, exposed so that its format can be tested without a clock.
  std::string format(int64_t done, std::chrono::duration<double> elapsed,
                     const std::string& postfix) const;

 private:
  void draw(int64_t done, const std::string& postfix, std::chrono::steady_clock::time_point now);
  bool due(int64_t done, std::chrono::steady_clock::time_point now) const;
  void advance_line_mark(int64_t done);

  ProgressBarOptions options_;
  bool terminal_ = false;
  bool closed_ = false;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_draw_;
  bool drawn_ = false;        // something was printed
  bool line_ended_ = false;   // on a terminal: the last redraw ended its line (the run completed)
  int64_t last_done_ = -1;    // the count last printed
  int64_t latest_done_ = -1;  // the count last updated (printed or not), for close()
  std::string latest_postfix_;
  int64_t next_line_at_ = 0;  // off a terminal: the count that earns the next line (-1: none)
  size_t drawn_width_ = 0;    // on a terminal: characters of the last redraw, to blank leftovers
};

}  // namespace accelerant
