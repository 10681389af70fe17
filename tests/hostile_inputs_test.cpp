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

#include "test_support.h"

using namespace accelerant::testing;

namespace {

// The CLI's exit status, or -1 when it had to be killed after `limit` (a hang).
int run_cli(const std::vector<std::string>& args, std::string& output,
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
  EXPECT_EQ(run_cli({"config", "validate", "--config_file", fifo}, out), 1) << out;
  EXPECT_TRUE(contains(out, "not a regular file")) << out;
}

TEST(HostileInputs, ANamedPipeAsACheckpointsManifestIsRefusedAtOnce) {
  ScratchDir dir;
  const std::string checkpoint = dir.path + "/checkpoint_0";
  ASSERT_EQ(::mkdir(checkpoint.c_str(), 0700), 0);
  ASSERT_EQ(::mkfifo((checkpoint + "/manifest.json").c_str(), 0600), 0);
  std::string out;
  EXPECT_EQ(run_cli({"checkpoint", "verify", checkpoint}, out), 1) << out;
  EXPECT_TRUE(contains(out, "manifest.json is not a regular file")) << out;
}

TEST(HostileInputs, InfiniteOrHugeTimeoutsAreRefusedNotWrapped) {
  for (const std::string value : {"inf", "1e20", "nan", "-1"}) {
    std::string out;
    EXPECT_EQ(run_cli({"launch", "-n", "1", "--collective_timeout", value, "/bin/true"}, out), 1)
        << value << ": " << out;
    EXPECT_TRUE(contains(out, "collective_timeout is")) << out;
    EXPECT_TRUE(contains(out, "0.001 to 2592000 seconds (30 days")) << out;
  }
  ScratchDir dir;
  const std::string file = dir.path + "/c.yaml";
  std::ofstream(file) << "join_timeout: .inf\n";
  std::string out;
  EXPECT_EQ(run_cli({"config", "validate", "--config_file", file}, out), 1) << out;
  EXPECT_TRUE(contains(out, "join_timeout is inf")) << out;
}

TEST(HostileInputs, AThreadCountTheWorkersWouldRefuseIsRefusedByTheLauncher) {
  std::string out;
  EXPECT_EQ(run_cli({"launch", "-n", "1", "--threads_per_process", "5000", "/bin/true"}, out), 1)
      << out;
  EXPECT_TRUE(contains(out, "threads_per_process is 5000")) << out;
  EXPECT_TRUE(contains(out, "to 4096")) << out;
}

TEST(HostileInputs, AnImpossibleRankCountForTraceMergeIsRefusedAndMissingRanksAreCounted) {
  ScratchDir dir;
  std::ofstream(dir.path + "/trace_rank0.json") << R"({"traceEvents":[]})";
  std::string out;
  EXPECT_EQ(run_cli({"trace", "merge", "-n", "2000000000", dir.path}, out), 1) << out;
  EXPECT_TRUE(contains(out, "2000000000 ranks expected; give 0")) << out;
  // 100,000 expected, one there: named up to a screenful, then counted, not 99,999 lines.
  EXPECT_EQ(run_cli({"trace", "merge", "-n", "100000", dir.path}, out), 1) << out;
  EXPECT_TRUE(contains(out, "and 99989 more ranks' files not found")) << out;
  EXPECT_LT(out.size(), 5000u) << out.substr(0, 2000);
}
