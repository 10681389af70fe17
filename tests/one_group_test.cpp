// One binary under every launcher: a program that calls accelerant::launch (notebook_style) and
// `accelerant test` form exactly ONE group of 2 ranks whether they are started by hand, by
// `accelerant launch -n 2`, by torchrun or by mpirun (srun: tests/slurm). Before, each rank under
// an outer launcher forked a group of its own: two result lines instead of one.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <regex>

#include "test_support.h"

using namespace accelerant::testing;

namespace {

std::string bin(const std::string& name) {
  return cli_path().substr(0, cli_path().rfind('/')) + "/" + name;
}

int count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

bool torchrun_available() {
  std::string probe;
  auto check = start_program({"/usr/bin/python3", "-c", "import torch.distributed.run"});
  return finish_program(check, probe, std::chrono::seconds(60)) == 0;
}

// The command line that starts `program` as 2 processes under `launcher`.
std::vector<std::string> under(const std::string& launcher, std::vector<std::string> program) {
  std::vector<std::string> argv;
  if (launcher == "accelerant launch") {
    argv = {cli_path(), "launch", "-n", "2"};
  } else if (launcher == "torchrun") {
    argv = torchrun_argv(2);
  } else if (launcher == "mpirun") {
    // --allow-run-as-root: CI may run as root, which mpirun refuses by default.
    argv = {"/usr/bin/mpirun",
            "--allow-run-as-root",
            "--oversubscribe",
            "-np",
            "2",
            "-x",
            "MASTER_PORT=" + std::to_string(free_port())};
  }
  argv.insert(argv.end(), program.begin(), program.end());
  return argv;
}

std::string run_under(const std::string& launcher, const std::vector<std::string>& program) {
  ::unsetenv("ACCELERANT_CONFIG_FILE");
  ::setenv("XDG_CACHE_HOME", "/nonexistent/accelerant-test-cache", 1);
  auto run = start_program(under(launcher, program));
  std::string out;
  const int status = finish_program(run, out, std::chrono::seconds(120));
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << launcher << " ended with status " << status << ":\n"
      << out;
  return out;
}

class EveryLauncher : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "torchrun" && !torchrun_available()) {
      GTEST_SKIP() << "Debian's python3-torch is not importable by /usr/bin/python3";
    }
    if (GetParam() == "mpirun" && ::access("/usr/bin/mpirun", X_OK) != 0) {
      GTEST_SKIP() << "Open MPI's mpirun is not installed (openmpi-bin, in scripts/install-deps)";
    }
  }
};

}  // namespace

TEST_P(EveryLauncher, NotebookStyleFormsOneGroupOfTwo) {
  const std::string out = run_under(GetParam(), {bin("notebook_style"), "--steps", "20"});
  // One summary line for the job, naming 2 workers: not one per rank, not 2 groups of 2.
  EXPECT_EQ(count(out, "final mean loss"), 1) << out;
  EXPECT_EQ(count(out, "on 2 workers"), 1) << out;
}

TEST_P(EveryLauncher, SelfTestFormsOneGroupOfTwo) {
  const std::string out = run_under(GetParam(), {cli_path(), "test"});
  EXPECT_EQ(count(out, "accelerant test: all checks passed on 2 processes"), 1) << out;
  // Five checks on each of ranks 0 and 1 of one 2-rank group.
  EXPECT_EQ(count(out, "[rank 0/2] PASS "), 5) << out;
  EXPECT_EQ(count(out, "[rank 1/2] PASS "), 5) << out;
  EXPECT_EQ(count(out, "FAIL"), 0) << out;
}

INSTANTIATE_TEST_SUITE_P(Launchers, EveryLauncher,
                         ::testing::Values("by hand", "accelerant launch", "torchrun", "mpirun"),
                         [](const auto& info) {
                           std::string name = info.param;
                           for (auto& c : name)
                             c = std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
                           return name;
                         });
