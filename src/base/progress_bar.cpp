#include "accelerant/progress_bar.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "accelerant/environment.h"
#include "accelerant/error.h"
#include "base/text.h"

namespace accelerant {
namespace {

using Seconds = std::chrono::duration<double>;

// "m:ss", or "h:mm:ss" from an hour on.
std::string clock_text(double seconds) {
  const auto total = static_cast<int64_t>(std::max(0.0, seconds));
  const int64_t h = total / 3600, m = total / 60 % 60, s = total % 60;
  char buffer[48];
  if (h > 0) {
    std::snprintf(buffer, sizeof buffer, "%lld:%02lld:%02lld", static_cast<long long>(h),
                  static_cast<long long>(m), static_cast<long long>(s));
  } else {
    std::snprintf(buffer, sizeof buffer, "%lld:%02lld", static_cast<long long>(m),
                  static_cast<long long>(s));
  }
  return buffer;
}

// ACCELERANT_CONSOLE_TERMINAL names the worker streams that the launcher relays to a terminal.
// A worker's stream is a pipe to the launcher, so isatty() says no even when the user watches a
// terminal; only the launcher knows, and it says so in this variable.
bool launcher_relays_to_terminal(int fd) {
  if (fd != STDOUT_FILENO && fd != STDERR_FILENO) return false;
  struct stat info {};
  // A stream the program redirected itself (to a file) is no longer the launcher's pipe.
  if (::fstat(fd, &info) != 0 || !S_ISFIFO(info.st_mode)) return false;
  const auto value = environment_value("ACCELERANT_CONSOLE_TERMINAL");
  if (!value || value->empty() || *value == "none") return false;
  if (*value == "both") return true;
  if (*value == "stdout") return fd == STDOUT_FILENO;
  if (*value == "stderr") return fd == STDERR_FILENO;
  throw EnvironmentError("ACCELERANT_CONSOLE_TERMINAL", *value,
                         detail::str("ACCELERANT_CONSOLE_TERMINAL=", *value,
                                     " is not one of none, stdout, stderr, both. Likely cause: it "
                                     "was set by hand; accelerant launch sets it for its workers. "
                                     "Fix: unset it or give one of those values."));
}

bool is_terminal(std::FILE* stream) {
  const int fd = ::fileno(stream);
  if (fd < 0) return false;
  return ::isatty(fd) == 1 || launcher_relays_to_terminal(fd);
}

void check(bool ok, const std::string& what) {
  if (!ok) {
    throw Error(detail::str("accelerant::ProgressBar: ", what,
                            ". Fix: pass the value described in ProgressBarOptions "
                            "(accelerant/progress_bar.h)."));
  }
}

}  // namespace

ProgressBar::ProgressBar(ProgressBarOptions options) : options_(std::move(options)) {
  // Checked on every process, enabled or not, so that a bad value fails the same way on all ranks.
  const auto& o = options_;
  check(o.total() >= 0, detail::str("total is ", o.total(), ", below 0 (0 means unknown)"));
  check(o.initial() >= 0, detail::str("initial is ", o.initial(), ", below 0"));
  check(o.total() == 0 || o.initial() <= o.total(),
        detail::str("initial is ", o.initial(), ", above the total of ", o.total()));
  check(o.redraw_interval().count() >= 0,
        detail::str("redraw_interval is ", o.redraw_interval().count(), " s, below 0"));
  check(o.line_interval().count() >= 0,
        detail::str("line_interval is ", o.line_interval().count(), " s, below 0"));
  check(o.line_fraction() >= 0 && o.line_fraction() <= 1,
        detail::str("line_fraction is ", o.line_fraction(), ", outside 0..1"));
  check(o.width() >= 0 && o.width() <= 1000, detail::str("width is ", o.width(), ", not 0..1000"));
  check(o.stream() != nullptr || !o.enabled(), "stream is null");
  if (!o.enabled()) return;  // nothing else to do: a disabled bar must cost nothing
  terminal_ = o.terminal().has_value() ? *o.terminal() : is_terminal(o.stream());
  start_ = last_draw_ = std::chrono::steady_clock::now();
  advance_line_mark(o.initial());
}

ProgressBar::~ProgressBar() {
  try {
    close();
  } catch (...) {  // a destructor must not throw; a failed write of a progress line loses little
  }
}

void ProgressBar::advance_line_mark(int64_t done) {
  if (options_.total() == 0 || options_.line_fraction() == 0) {
    next_line_at_ = -1;  // no lines by fraction
    return;
  }
  const auto step = std::max<int64_t>(
      1, std::llround(options_.line_fraction() * static_cast<double>(options_.total())));
  next_line_at_ = (done / step + 1) * step;
}

void ProgressBar::update(int64_t done, const std::string& postfix) {
  if (!options_.enabled() || closed_) return;
  check(done >= 0, detail::str("update(", done, "): a count below 0"));
  check(options_.total() == 0 || done <= options_.total(),
        detail::str("update(", done, ") is above the total of ", options_.total()));
  latest_done_ = done;
  latest_postfix_ = postfix;
  const auto now = std::chrono::steady_clock::now();
  if (due(done, now)) draw(done, postfix, now);
}

bool ProgressBar::due(int64_t done, std::chrono::steady_clock::time_point now) const {
  const bool last = options_.total() > 0 && done == options_.total();
  const Seconds since = now - last_draw_;
  const bool milestone = next_line_at_ >= 0 && done >= next_line_at_;
  if (terminal_) {
    // The steps that earn a line off a terminal are drawn on one too, so that a captured
    // terminal (mpirun's pseudo-terminal, a `script` transcript) shows the same steps as a log.
    return !drawn_ || (done != last_done_ && (last || milestone)) ||
           since >= options_.redraw_interval();
  }
  if (done == last_done_) return false;  // a plain line says something new or nothing
  if (last || milestone) return true;
  return options_.line_interval().count() > 0 && since >= options_.line_interval();
}

void ProgressBar::draw(int64_t done, const std::string& postfix,
                       std::chrono::steady_clock::time_point now) {
  std::string line = format(done, now - start_, postfix);
  std::string out;
  if (terminal_) {
    // Blanks cover what a longer previous redraw left. The '\r' comes after the text, not
    // before: a relay that forwards output a segment at a time (accelerant launch's) then
    // forwards each redraw as it is drawn, not when the next one begins; and the cursor waits at
    // the line's start, so the next redraw, or close()'s '\n', leaves this text whole.
    const size_t width = line.size();
    if (width < drawn_width_) line.append(drawn_width_ - width, ' ');
    drawn_width_ = width;
    // The run is complete: end the line, so that what is printed next starts on its own.
    line_ended_ = options_.total() > 0 && done == options_.total();
    out = line + (line_ended_ ? '\n' : '\r');
  } else {
    out = line + "\n";
  }
  advance_line_mark(done);
  std::fwrite(out.data(), 1, out.size(), options_.stream());
  std::fflush(options_.stream());  // a progress line that waits in a buffer is no progress line
  drawn_ = true;
  last_done_ = done;
  last_draw_ = now;
}

void ProgressBar::close() {
  if (!options_.enabled() || closed_) {
    closed_ = true;
    return;
  }
  closed_ = true;
  if (latest_done_ >= 0 && latest_done_ != last_done_) {
    draw(latest_done_, latest_postfix_, std::chrono::steady_clock::now());
  }
  if (terminal_ && drawn_ && !line_ended_) {
    std::fputc('\n', options_.stream());
    std::fflush(options_.stream());
  }
}

std::string ProgressBar::format(int64_t done, std::chrono::duration<double> elapsed,
                                const std::string& postfix) const {
  const auto& o = options_;
  std::string out = o.label().empty() ? "" : o.label() + ": ";
  char buffer[160];
  if (o.total() > 0) {
    const int64_t percent = done * 100 / o.total();
    const auto filled = static_cast<size_t>(done * o.width() / o.total());
    std::snprintf(buffer, sizeof buffer, "%3lld%% [", static_cast<long long>(percent));
    out += buffer;
    out.append(filled, '#');
    out.append(static_cast<size_t>(o.width()) - filled, '.');
    std::snprintf(buffer, sizeof buffer, "] %lld/%lld", static_cast<long long>(done),
                  static_cast<long long>(o.total()));
  } else {
    std::snprintf(buffer, sizeof buffer, "%lld steps", static_cast<long long>(done));
  }
  out += buffer;
  // The rate counts this run's steps only: resumed steps (initial) took no time here.
  const double steps = static_cast<double>(done - o.initial());
  const double seconds = elapsed.count();
  const double rate = steps > 0 && seconds > 0 ? steps / seconds : 0.0;
  if (rate == 0) {
    out += "  ? it/s";
  } else if (rate >= 1) {
    std::snprintf(buffer, sizeof buffer, "  %.2f it/s", rate);
    out += buffer;
  } else {  // slow steps read better as seconds per step
    std::snprintf(buffer, sizeof buffer, "  %.2f s/it", 1 / rate);
    out += buffer;
  }
  out += "  " + clock_text(seconds) + " elapsed";
  if (o.total() > 0) {
    out += "  ETA ";
    out += rate > 0 ? clock_text(static_cast<double>(o.total() - done) / rate) : "?";
  }
  if (!postfix.empty()) out += "  " + postfix;
  return out;
}

}  // namespace accelerant
