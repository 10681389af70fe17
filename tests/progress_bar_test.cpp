// ProgressBar: plain lines every tenth off a terminal, '\r' redraws on one (a pseudo-terminal
// here), redraws into the launcher's pipe when ACCELERANT_CONSOLE_TERMINAL says a terminal is at
// its end, nothing at all when disabled, and a clear error for impossible input.
#include <accelerant/error.h>
#include <accelerant/progress_bar.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <pty.h>
#include <termios.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace {

using accelerant::ProgressBar;
using accelerant::ProgressBarOptions;

// Everything written to `file` so far.
std::string contents(std::FILE* file) {
  std::fflush(file);
  std::rewind(file);
  std::string out;
  char buffer[4096];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof buffer, file)) > 0) out.append(buffer, n);
  return out;
}

// What is waiting to be read on `fd` (non-blocking).
std::string drain(int fd) {
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  std::string out;
  char buffer[4096];
  ssize_t n;
  while ((n = ::read(fd, buffer, sizeof buffer)) > 0) out.append(buffer, static_cast<size_t>(n));
  return out;
}

size_t count(const std::string& text, char c) {
  return static_cast<size_t>(std::count(text.begin(), text.end(), c));
}

}  // namespace

TEST(ProgressBar, OffATerminalPrintsAPlainLineEveryTenth) {
  std::FILE* file = std::tmpfile();
  ASSERT_NE(file, nullptr);
  {
    ProgressBar bar(ProgressBarOptions()
                        .total(100)
                        .label("epoch 1/2")
                        .stream(file)
                        .line_interval(std::chrono::duration<double>(
                            0)));  // lines by fraction only, whatever the clock
    for (int step = 1; step <= 100; ++step) bar.update(step, "loss 0.5");
  }
  const std::string out = contents(file);
  std::fclose(file);
  EXPECT_EQ(count(out, '\r'), 0u) << out;
  EXPECT_EQ(count(out, '\n'), 10u) << out;
  EXPECT_NE(out.find("epoch 1/2:  10% [##"), std::string::npos) << out;
  EXPECT_NE(out.find("] 10/100  "), std::string::npos) << out;
  EXPECT_NE(out.find("epoch 1/2: 100% [########################] 100/100  "), std::string::npos)
      << out;
  EXPECT_NE(out.find(" elapsed  ETA "), std::string::npos) << out;
  EXPECT_NE(out.find("  loss 0.5\n"), std::string::npos) << out;
}

// openpty gives a real terminal: isatty() says yes, as for a user's console.
TEST(ProgressBar, OnATerminalRedrawsOneLineWithCarriageReturns) {
  int master = -1, slave = -1;
  ASSERT_EQ(::openpty(&master, &slave, nullptr, nullptr, nullptr), 0);
  termios raw{};
  ::tcgetattr(slave, &raw);
  ::cfmakeraw(&raw);  // no "\n" -> "\r\n" translation, so the bytes read are the bytes written
  ::tcsetattr(slave, TCSANOW, &raw);
  std::FILE* terminal = ::fdopen(slave, "w");
  ASSERT_NE(terminal, nullptr);
  {
    ProgressBar bar(ProgressBarOptions().total(5).stream(terminal).redraw_interval(
        std::chrono::duration<double>(0)));
    for (int step = 1; step <= 5; ++step) bar.update(step, "loss 0.5");
  }
  std::fclose(terminal);
  const std::string out = drain(master);
  ::close(master);
  // Each redraw ends with '\r' (so that a relay can forward it whole); the line ends once, when
  // the run is complete.
  EXPECT_EQ(count(out, '\r'), 4u) << out;
  EXPECT_EQ(count(out, '\n'), 1u) << out;
  EXPECT_EQ(out.rfind(" 20% [", 0), 0u) << out;
  EXPECT_NE(out.find("loss 0.5\r 40% ["), std::string::npos) << out;
  EXPECT_NE(out.find("\r100% ["), std::string::npos) << out;
  EXPECT_EQ(out.back(), '\n') << out;
}

// A fast loop is drawn at most every redraw_interval; the last step always, and every tenth
// (line_fraction) so that a captured terminal shows the steps a log shows.
TEST(ProgressBar, OnATerminalRedrawsAreThrottledButTheLastStepAndEveryTenthAreDrawn) {
  for (const double fraction : {0.0, 0.1}) {
    std::FILE* file = std::tmpfile();
    ASSERT_NE(file, nullptr);
    {
      ProgressBar bar(ProgressBarOptions()
                          .total(100)
                          .stream(file)
                          .terminal(true)
                          .line_fraction(fraction)
                          .redraw_interval(std::chrono::duration<double>(3600)));
      for (int step = 1; step <= 100; ++step) bar.update(step);
    }
    const std::string out = contents(file);
    std::fclose(file);
    // The first update, then the last (or every tenth, the last among them), which ends the line.
    EXPECT_EQ(count(out, '\r'), fraction == 0 ? 1u : 10u) << out;
    EXPECT_EQ(count(out, '\n'), 1u) << out;
    EXPECT_NE(out.find("\r100% ["), std::string::npos) << out;
  }
}

// Under `accelerant launch` stderr is a pipe to the launcher; the launcher says whether a
// terminal is at its other end.
TEST(ProgressBar, RedrawsIntoTheLaunchersPipeWhenItRelaysToATerminal) {
  for (const char* relayed : {"stderr", "none"}) {
    int pipe_fds[2];
    ASSERT_EQ(::pipe(pipe_fds), 0);
    const int saved = ::dup(STDERR_FILENO);
    std::fflush(stderr);
    ::dup2(pipe_fds[1], STDERR_FILENO);
    ::setenv("ACCELERANT_CONSOLE_TERMINAL", relayed, 1);
    {
      ProgressBar bar(ProgressBarOptions().total(2).redraw_interval(
          std::chrono::duration<double>(0)));  // stream: stderr
      bar.update(1);
      bar.update(2);
    }
    ::unsetenv("ACCELERANT_CONSOLE_TERMINAL");
    std::fflush(stderr);
    ::dup2(saved, STDERR_FILENO);
    ::close(saved);
    ::close(pipe_fds[1]);
    const std::string out = drain(pipe_fds[0]);
    ::close(pipe_fds[0]);
    if (std::string(relayed) == "stderr") {
      EXPECT_EQ(count(out, '\r'), 1u) << out;
      EXPECT_EQ(count(out, '\n'), 1u) << out;
    } else {
      EXPECT_EQ(count(out, '\r'), 0u) << out;
      EXPECT_EQ(count(out, '\n'), 2u) << out;
    }
  }
}

TEST(ProgressBar, DisabledPrintsNothing) {
  std::FILE* file = std::tmpfile();
  ASSERT_NE(file, nullptr);
  {
    ProgressBar bar(ProgressBarOptions().total(10).stream(file).enabled(false).terminal(true));
    for (int step = 1; step <= 10; ++step) bar.update(step, "loss 0.5");
    bar.close();
  }
  EXPECT_EQ(contents(file), "");
  std::fclose(file);
}

TEST(ProgressBar, FormatShowsRateElapsedAndEta) {
  ProgressBar bar(ProgressBarOptions().total(100).label("epoch 1/3").width(10).enabled(false));
  EXPECT_EQ(bar.format(50, std::chrono::duration<double>(10), "loss 0.43"),
            "epoch 1/3:  50% [#####.....] 50/100  5.00 it/s  0:10 elapsed  ETA 0:10  loss 0.43");
  // Slow steps read as seconds per step; an unknown total has no bar and no ETA.
  ProgressBar open_ended(ProgressBarOptions().enabled(false));
  EXPECT_EQ(open_ended.format(2, std::chrono::duration<double>(5), ""),
            "2 steps  2.50 s/it  0:05 elapsed");
  // Resumed steps (initial) count in the position, not in the rate.
  ProgressBar resumed(ProgressBarOptions().total(100).initial(40).width(0).enabled(false));
  EXPECT_EQ(resumed.format(50, std::chrono::duration<double>(5), ""),
            " 50% [] 50/100  2.00 it/s  0:05 elapsed  ETA 0:25");
}

TEST(ProgressBar, ImpossibleInputIsRefusedNamingTheValue) {
  try {
    ProgressBar bar(ProgressBarOptions().total(-3));
    FAIL() << "a negative total was accepted";
  } catch (const accelerant::Error& e) {
    EXPECT_NE(std::string(e.what()).find("total is -3, below 0"), std::string::npos) << e.what();
  }
  std::FILE* file = std::tmpfile();
  ProgressBar bar(ProgressBarOptions().total(10).stream(file));
  EXPECT_THROW(bar.update(11), accelerant::Error);
  EXPECT_THROW(bar.update(-1), accelerant::Error);
  bar.close();
  std::fclose(file);
  EXPECT_THROW(ProgressBar(ProgressBarOptions().line_fraction(2)), accelerant::Error);
}
