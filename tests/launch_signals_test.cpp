// No orphans: SIGINT or SIGTERM to a launching program stops every worker before it ends, and
// workers whose launcher is SIGKILLed exit by themselves.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <csignal>
#include <thread>

#include "test_support.h"

using namespace accelerant::testing;

namespace {

// Starts the helper in "sleepy" mode and waits until both workers have written their pids.
std::vector<pid_t> start_sleepy(ProgramRun& run, const std::string& dir) {
  run = start_program({launch_helper_path(), "sleepy", dir});
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::chrono::steady_clock::now() < deadline) {
    auto pids = read_pid_files(dir);
    if (pids.size() == 2) return pids;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return {};
}

}  // namespace

class StopSignal : public ::testing::TestWithParam<int> {};

TEST_P(StopSignal, StopsEveryWorkerThenTakesEffect) {
  const int sig = GetParam();
  const std::string dir = make_temp_dir();
  ProgramRun run;
  auto workers = start_sleepy(run, dir);
  ASSERT_EQ(workers.size(), 2u);
  ::kill(run.pid, sig);
  std::string output;
  const int status = finish_program(run, output, std::chrono::seconds(20));
  ASSERT_NE(status, -1) << "launcher did not stop within 20 s: " << output;
  EXPECT_TRUE(WIFSIGNALED(status)) << output;
  EXPECT_EQ(WTERMSIG(status), sig) << output;
  EXPECT_TRUE(wait_until_dead(workers, std::chrono::milliseconds(0)).empty()) << "orphan workers";
  remove_tree(dir);
}

INSTANTIATE_TEST_SUITE_P(IntAndTerm, StopSignal, ::testing::Values(SIGINT, SIGTERM));

TEST(ParentDeath, WorkersExitWhenTheirLauncherIsKilled) {
  const std::string dir = make_temp_dir();
  ProgramRun run;
  auto workers = start_sleepy(run, dir);
  ASSERT_EQ(workers.size(), 2u);
  ::kill(run.pid, SIGKILL);
  std::string output;
  finish_program(run, output, std::chrono::seconds(10));
  EXPECT_TRUE(wait_until_dead(workers, std::chrono::seconds(10)).empty()) << "orphan workers";
  remove_tree(dir);
}
