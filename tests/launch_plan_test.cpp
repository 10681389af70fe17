// prepare_launch: the plan it returns by hand and under torchrun's variables, and that it sets
// this process's threads to 1 only when launch will fork (docs/launching.md "Before launch").
// Own binary: the tests change this process's thread count and environment.
#include <accelerant/launch_plan.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <torch/torch.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

using namespace accelerant;

namespace {

// Every variable through which a launcher describes a process (launch_contract.h); a test starts
// with all of them unset, so that the environment CTest runs it in cannot decide the plan.
const char* const kLauncherVariables[] = {
    "RANK",         "WORLD_SIZE",           "LOCAL_RANK",          "LOCAL_WORLD_SIZE",
    "GROUP_RANK",   "MASTER_ADDR",          "MASTER_PORT",         "ACCELERANT_LAUNCHER",
    "SLURM_PROCID", "SLURM_NTASKS",         "SLURM_LOCALID",       "SLURM_NODEID",
    "SLURM_NNODES", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"};

// Sets a launcher's variables for one test (none = started by hand) and restores the
// environment afterwards.
class LauncherEnvironment {
 public:
  explicit LauncherEnvironment(std::vector<std::pair<std::string, std::string>> vars) {
    for (const char* name : kLauncherVariables) {
      const char* value = ::getenv(name);
      saved_.emplace_back(name, value ? std::optional<std::string>(value) : std::nullopt);
      ::unsetenv(name);
    }
    for (const auto& [name, value] : vars) ::setenv(name.c_str(), value.c_str(), 1);
  }
  ~LauncherEnvironment() {
    for (const auto& [name, value] : saved_) {
      if (value) {
        ::setenv(name.c_str(), value->c_str(), 1);
      } else {
        ::unsetenv(name.c_str());
      }
    }
  }

 private:
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

std::vector<std::pair<std::string, std::string>> torchrun_rank(int rank) {
  // Rank `rank` of 4 on two machines of 2 processes each, as torchrun sets it.
  return {{"RANK", std::to_string(rank)},
          {"WORLD_SIZE", "4"},
          {"LOCAL_RANK", std::to_string(rank % 2)},
          {"LOCAL_WORLD_SIZE", "2"},
          {"GROUP_RANK", std::to_string(rank / 2)},
          {"MASTER_ADDR", "127.0.0.1"},
          {"MASTER_PORT", "29500"}};
}

}  // namespace

TEST(LaunchPlan, ByHandItForksTheRequestedProcessesAndSetsOneThread) {
  LauncherEnvironment by_hand({});
  torch::set_num_threads(2);
  const LaunchPlan plan = prepare_launch(LaunchOptions().processes_per_node(3));
  EXPECT_TRUE(plan.forks_workers);
  EXPECT_EQ(plan.world_size, 3);
  EXPECT_TRUE(plan.is_main_process);
  EXPECT_EQ(torch::get_num_threads(), 1) << "the pools must stay unstarted until the fork";
}

TEST(LaunchPlan, ByHandOnSeveralMachinesOnlyNodeZeroReports) {
  LauncherEnvironment by_hand({});
  const LaunchPlan node0 =
      prepare_launch(LaunchOptions().processes_per_node(3).num_nodes(2).node_rank(0));
  const LaunchPlan node1 =
      prepare_launch(LaunchOptions().processes_per_node(3).num_nodes(2).node_rank(1));
  EXPECT_EQ(node0.world_size, 6);
  EXPECT_EQ(node1.world_size, 6);
  EXPECT_TRUE(node0.is_main_process);
  EXPECT_FALSE(node1.is_main_process);
  EXPECT_TRUE(node1.forks_workers);
}

TEST(LaunchPlan, UnderTorchrunTheOuterJobDecidesAndThreadsAreLeftAlone) {
  for (int rank : {0, 3}) {
    LauncherEnvironment torchrun(torchrun_rank(rank));
    torch::set_num_threads(2);
    // processes_per_node differs from torchrun's 2 per machine: the outer launcher wins.
    const LaunchPlan plan = prepare_launch(LaunchOptions().processes_per_node(3));
    EXPECT_FALSE(plan.forks_workers) << "rank " << rank;
    EXPECT_EQ(plan.world_size, 4) << "rank " << rank;
    EXPECT_EQ(plan.is_main_process, rank == 0) << "rank " << rank;
    EXPECT_EQ(torch::get_num_threads(), 2) << "rank " << rank << ": nothing forks here";
  }
}

TEST(LaunchPlan, InvalidLauncherVariablesAreRefused) {
  LauncherEnvironment broken({{"RANK", "4"}, {"WORLD_SIZE", "4"}});
  EXPECT_THROW(prepare_launch(LaunchOptions()), EnvironmentError);
}
