// The accelerant command line, run as a real program.
#include <accelerant/version.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include "test_support.h"

using namespace accelerant::testing;

namespace {

int run_cli(const std::vector<std::string>& args, std::string& output) {
  std::vector<std::string> argv{cli_path()};
  argv.insert(argv.end(), args.begin(), args.end());
  auto run = start_program(argv);
  const int status = finish_program(run, output, std::chrono::seconds(30));
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace

TEST(Cli, VersionNamesAccelerantAndLibTorch) {
  std::string out;
  EXPECT_EQ(run_cli({"--version"}, out), 0);
  EXPECT_NE(out.find(std::string("accelerant ") + accelerant::kVersion), std::string::npos) << out;
  EXPECT_NE(out.find("LibTorch "), std::string::npos) << out;
}

TEST(Cli, HelpShowsExamples) {
  std::string out;
  EXPECT_EQ(run_cli({"--help"}, out), 0);
  EXPECT_NE(out.find("Examples:"), std::string::npos) << out;
  EXPECT_NE(out.find("--version"), std::string::npos) << out;
}

TEST(Cli, UnknownOptionIsAnErrorWithNonZeroExit) {
  std::string out;
  EXPECT_NE(run_cli({"--no-such-flag"}, out), 0);
  EXPECT_NE(out.find("--no-such-flag"), std::string::npos) << out;
}
