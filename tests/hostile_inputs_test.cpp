// Hostile inputs of the second "never silent" pass (issue 38), each through the command a user
// runs: a clear error with the value and the fix, no hang (every run here is bounded), nothing
// started. A named pipe where a file belongs used to hang every reader in open(); an infinite or
// huge timeout became a 1 ms one through an unchecked conversion; a thread count the workers
// refuse was accepted by the launcher.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <chrono>
#include <fstream>
#include <thread>

#include "test_support.h"

using namespace accelerant::testing;

namespace {

// The CLI's exit status, or -1 when it had to be killed after `limit` (a hang).
int run_cli_within(const std::vector<std::string>& args, std::string& output,
                   std::chrono::seconds limit = std::chrono::seconds(20)) {
  std::vector<std::string> argv{cli_path()};
  argv.insert(argv.end(), args.begin(), args.end());
  auto run = start_program(argv);
  const int status = finish_program(run, output, limit);
  return status >= 0 && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace

TEST(HostileInputs, ANamedPipeAsTheConfigFileIsRefusedAtOnce) {
  ScratchDir dir;
  const std::string fifo = dir.path + "/config.yaml";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  std::string out;
  EXPECT_EQ(run_cli_within({"config", "validate", "--config_file", fifo}, out), 1) << out;
  EXPECT_TRUE(contains(out, "not a regular file")) << out;
}

TEST(HostileInputs, ANamedPipeAsACheckpointsManifestIsRefusedAtOnce) {
  ScratchDir dir;
  const std::string checkpoint = dir.path + "/checkpoint_0";
  ASSERT_EQ(::mkdir(checkpoint.c_str(), 0700), 0);
  ASSERT_EQ(::mkfifo((checkpoint + "/manifest.json").c_str(), 0600), 0);
  std::string out;
  EXPECT_EQ(run_cli_within({"checkpoint", "verify", checkpoint}, out), 1) << out;
  EXPECT_TRUE(contains(out, "manifest.json is not a regular file")) << out;
}

TEST(HostileInputs, InfiniteOrHugeTimeoutsAreRefusedNotWrapped) {
  for (const std::string value : {"inf", "1e20", "nan", "-1"}) {
    std::string out;
    EXPECT_EQ(
        run_cli_within({"launch", "-n", "1", "--collective_timeout", value, "/bin/true"}, out), 1)
        << value << ": " << out;
    EXPECT_TRUE(contains(out, "collective_timeout is")) << out;
    EXPECT_TRUE(contains(out, "0.001 to 2592000 seconds (30 days")) << out;
  }
  ScratchDir dir;
  const std::string file = dir.path + "/c.yaml";
  std::ofstream(file) << "join_timeout: .inf\n";
  std::string out;
  EXPECT_EQ(run_cli_within({"config", "validate", "--config_file", file}, out), 1) << out;
  EXPECT_TRUE(contains(out, "join_timeout is inf")) << out;
}

TEST(HostileInputs, AThreadCountTheWorkersWouldRefuseIsRefusedByTheLauncher) {
  std::string out;
  EXPECT_EQ(
      run_cli_within({"launch", "-n", "1", "--threads_per_process", "5000", "/bin/true"}, out), 1)
      << out;
  EXPECT_TRUE(contains(out, "threads_per_process is 5000")) << out;
  EXPECT_TRUE(contains(out, "to 4096")) << out;
}

TEST(HostileInputs, AnImpossibleRankCountForTraceMergeIsRefusedAndMissingRanksAreCounted) {
  ScratchDir dir;
  std::ofstream(dir.path + "/trace_rank0.json") << R"({"traceEvents":[]})";
  std::string out;
  EXPECT_EQ(run_cli_within({"trace", "merge", "-n", "2000000000", dir.path}, out), 1) << out;
  EXPECT_TRUE(contains(out, "2000000000 ranks expected; give 0")) << out;
  // 100,000 expected, one there: named up to a screenful, then counted, not 99,999 lines.
  EXPECT_EQ(run_cli_within({"trace", "merge", "-n", "100000", dir.path}, out), 1) << out;
  EXPECT_TRUE(contains(out, "and 99989 more ranks' files not found")) << out;
  EXPECT_LT(out.size(), 5000u) << out.substr(0, 2000);
}

// Two ranks started by hand, told different WORLD_SIZEs: the rank of the smaller world names the
// mismatch at once (it waited in Gloo for a rank that never joins and printed "Socket Timeout"
// and 19 frames); the other ends within its timeout; neither leaves Gloo's text (issue 38).
TEST(HostileInputs, RanksStartedWithDifferentWorldSizesAreToldSo) {
  const std::string port = std::to_string(free_port());
  auto rank = [&](int r, int world) {
    return start_program({"/usr/bin/env", "MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + port,
                          "RANK=" + std::to_string(r), "WORLD_SIZE=" + std::to_string(world),
                          "LOCAL_RANK=" + std::to_string(r),
                          "LOCAL_WORLD_SIZE=" + std::to_string(world),
                          "ACCELERANT_TIMEOUT_MS=120000", launch_helper_path(), "worker"});
  };
  auto small = rank(0, 2);
  auto large = rank(1, 3);
  const auto start = std::chrono::steady_clock::now();
  std::string small_out, large_out;
  const int small_status = finish_program(small, small_out, std::chrono::seconds(100));
  const auto small_took = std::chrono::steady_clock::now() - start;
  const int large_status = finish_program(large, large_out, std::chrono::seconds(100));
  EXPECT_TRUE(small_status >= 0 && !(WIFEXITED(small_status) && WEXITSTATUS(small_status) == 0))
      << small_out;
  EXPECT_TRUE(contains(small_out, "was started with WORLD_SIZE=")) << small_out;
  EXPECT_TRUE(contains(small_out, "Fix: start every rank with the same WORLD_SIZE")) << small_out;
  EXPECT_LT(small_took, std::chrono::seconds(60)) << "named at once, not at the 120 s timeout";
  EXPECT_TRUE(large_status >= 0 && !(WIFEXITED(large_status) && WEXITSTATUS(large_status) == 0))
      << large_out;
  EXPECT_TRUE(contains(large_out, "WORLD_SIZE")) << large_out;
  EXPECT_FALSE(contains(small_out + large_out, "Socket Timeout")) << small_out << large_out;
  EXPECT_FALSE(contains(large_out, "std::system_error")) << large_out;
}

// A second job started by hand on the port of a running one: its rank 1 reaches the first job's
// store and claimed rank 1 there, then failed inside Gloo ("pair.cc:799 ... Connection refused").
// Each rank's arrival is now claimed with its process's identity, so the second claimant is told
// that the rank has already joined, with the fix (issue 38).
TEST(HostileInputs, ARankOfASecondJobOnABusyPortIsToldSo) {
  const std::string port = std::to_string(free_port());
  auto rank = [&](int r) {
    return start_program({"/usr/bin/env", "MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + port,
                          "RANK=" + std::to_string(r), "WORLD_SIZE=3",
                          "LOCAL_RANK=" + std::to_string(r), "LOCAL_WORLD_SIZE=3",
                          "ACCELERANT_JOIN_TIMEOUT_MS=60000", launch_helper_path(), "worker"});
  };
  auto first_0 = rank(0);  // the first job: ranks 0 and 1 wait for a rank 2 that never comes
  auto first_1 = rank(1);
  std::this_thread::sleep_for(std::chrono::seconds(4));
  auto second_1 = rank(1);  // the second job's rank 1, on the same port
  std::string second_out, first_1_out, first_0_out;
  const int status = finish_program(second_1, second_out, std::chrono::seconds(30));
  finish_program(first_1, first_1_out, std::chrono::seconds(1));  // killed: it waits for rank 2
  finish_program(first_0, first_0_out, std::chrono::seconds(1));
  // Normally the second job's rank 1 is the one refused; on a machine so loaded that the first
  // job's rank 1 had not arrived within 4 s, it is the first job's.
  const std::string refused = contains(second_out, "has already joined") ? second_out : first_1_out;
  EXPECT_TRUE(contains(refused, "Rank 1 of the job whose store is at 127.0.0.1:" + port +
                                    " has already joined, from another process (pid "))
      << second_out << "\n---\n"
      << first_1_out;
  EXPECT_TRUE(contains(refused, "Fix: give each job its own MASTER_PORT")) << refused;
  EXPECT_FALSE(contains(second_out + first_1_out, "pair.cc")) << second_out << first_1_out;
  if (refused == second_out) {
    // It failed (the helper lets the error end it: exit status or SIGABRT), and did not hang.
    EXPECT_TRUE(status >= 0 && !(WIFEXITED(status) && WEXITSTATUS(status) == 0)) << second_out;
  }
}
