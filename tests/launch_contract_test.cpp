// Table tests for reading the distributed environment: every launcher's variable set, and every
// bad value, which must name the variable, its value and a fix.
#include <accelerant/error.h>
#include <accelerant/launch_contract.h>
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "test_support.h"

using namespace accelerant;

namespace {

LaunchContract parse(const std::map<std::string, std::string>& vars) {
  return parse_launch_contract(accelerant::testing::env_of(vars));
}

}  // namespace

TEST(LaunchContract, NoVariablesMeansOneProcess) {
  auto env = parse({});
  EXPECT_EQ(env.source, EnvSource::kNone);
  EXPECT_EQ(env.rank, 0);
  EXPECT_EQ(env.world_size, 1);
  EXPECT_FALSE(env.distributed());
}

struct LauncherCase {
  std::string name;
  std::map<std::string, std::string> vars;
  EnvSource source;
  int rank, world, local_rank, local_world, node, nodes;
};

TEST(LaunchContract, ReadsEachLauncher) {
  const std::vector<LauncherCase> cases = {
      {"torchrun",
       {{"RANK", "5"},
        {"WORLD_SIZE", "8"},
        {"LOCAL_RANK", "1"},
        {"LOCAL_WORLD_SIZE", "4"},
        {"GROUP_RANK", "1"},
        {"MASTER_ADDR", "10.0.0.1"},
        {"MASTER_PORT", "1234"}},
       EnvSource::kTorchrun,
       5,
       8,
       1,
       4,
       1,
       2},
      {"accelerant",
       {{"RANK", "1"},
        {"WORLD_SIZE", "2"},
        {"LOCAL_RANK", "1"},
        {"LOCAL_WORLD_SIZE", "2"},
        {"MASTER_ADDR", "127.0.0.1"},
        {"ACCELERANT_LAUNCHER", "1"}},
       EnvSource::kAccelerant,
       1,
       2,
       1,
       2,
       0,
       1},
      {"slurm",
       {{"SLURM_PROCID", "3"},
        {"SLURM_NTASKS", "4"},
        {"SLURM_LOCALID", "1"},
        {"SLURM_NODEID", "1"},
        {"SLURM_NNODES", "2"},
        {"MASTER_ADDR", "node1"}},
       EnvSource::kSlurm,
       3,
       4,
       1,
       2,
       1,
       2},
      {"openmpi",
       {{"OMPI_COMM_WORLD_RANK", "2"},
        {"OMPI_COMM_WORLD_SIZE", "4"},
        {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
        {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
        {"MASTER_ADDR", "node0"}},
       EnvSource::kOpenMpi,
       2,
       4,
       0,
       2,
       1,
       2},
      {"torchrun wins over slurm",
       {{"RANK", "0"},
        {"WORLD_SIZE", "2"},
        {"SLURM_PROCID", "1"},
        {"SLURM_NTASKS", "2"},
        {"MASTER_ADDR", "127.0.0.1"}},
       EnvSource::kTorchrun,
       0,
       2,
       0,
       2,
       0,
       1},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    auto env = parse(c.vars);
    EXPECT_EQ(env.source, c.source);
    EXPECT_EQ(env.rank, c.rank);
    EXPECT_EQ(env.world_size, c.world);
    EXPECT_EQ(env.local_rank, c.local_rank);
    EXPECT_EQ(env.local_world_size, c.local_world);
    EXPECT_EQ(env.node_rank, c.node);
    EXPECT_EQ(env.num_nodes, c.nodes);
  }
}

TEST(LaunchContract, DefaultsAndExtras) {
  auto env = parse({{"RANK", "0"},
                    {"WORLD_SIZE", "2"},
                    {"MASTER_ADDR", "h"},
                    {"TORCHELASTIC_USE_AGENT_STORE", "True"},
                    {"TORCHELASTIC_RESTART_COUNT", "2"},
                    {"ACCELERANT_DEBUG_MODE", "1"},
                    {"ACCELERANT_TIMEOUT_MS", "1500"},
                    {"ACCELERANT_MIXED_PRECISION", "BF16"}});
  EXPECT_EQ(env.master_port, 29500);
  EXPECT_TRUE(env.agent_hosts_store);
  EXPECT_EQ(env.restart_count, 2);
  EXPECT_EQ(env.debug, std::optional<bool>(true));
  ASSERT_TRUE(env.collective_timeout.has_value());
  EXPECT_EQ(env.collective_timeout->count(), 1500);
  EXPECT_EQ(env.mixed_precision, MixedPrecision::kBf16);
}

// `mpirun -np 2 ./train` on one machine needs no MASTER_ADDR; across machines it still must be set.
TEST(LaunchContract, MpirunOnOneMachineMeetsOnLoopbackWithoutMasterAddr) {
  auto one_machine = parse({{"OMPI_COMM_WORLD_RANK", "1"},
                            {"OMPI_COMM_WORLD_SIZE", "2"},
                            {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                            {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}});
  EXPECT_EQ(one_machine.master_addr, "127.0.0.1");
  EXPECT_EQ(one_machine.num_nodes, 1);
  try {
    parse({{"OMPI_COMM_WORLD_RANK", "1"},
           {"OMPI_COMM_WORLD_SIZE", "4"},
           {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
           {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}});
    FAIL() << "two machines without MASTER_ADDR were accepted";
  } catch (const EnvironmentError& e) {
    EXPECT_EQ(e.variable(), "MASTER_ADDR");
  }
}

TEST(LaunchContract, RoundTripsThroughLauncherVariables) {
  LaunchContract in;
  in.rank = 3;
  in.world_size = 4;
  in.local_rank = 1;
  in.local_world_size = 2;
  in.node_rank = 1;
  in.master_addr = "127.0.0.1";
  in.master_port = 4242;
  in.agent_hosts_store = true;
  in.restart_count = 1;
  in.debug = true;
  in.collective_timeout = std::chrono::milliseconds(777);
  in.mixed_precision = MixedPrecision::kBf16;
  in.threads_per_process = 2;
  in.downcast_bf16 = true;
  in.cpu = false;
  in.gradient_accumulation_steps = 4;
  auto vars = to_environment(in);
  auto out = parse(vars);
  EXPECT_EQ(out.source, EnvSource::kAccelerant);
  EXPECT_EQ(out.rank, 3);
  EXPECT_EQ(out.world_size, 4);
  EXPECT_EQ(out.local_rank, 1);
  EXPECT_EQ(out.node_rank, 1);
  EXPECT_EQ(out.num_nodes, 2);
  EXPECT_EQ(out.master_port, 4242);
  EXPECT_TRUE(out.agent_hosts_store);
  EXPECT_EQ(out.restart_count, 1);
  EXPECT_EQ(out.debug, std::optional<bool>(true));
  EXPECT_EQ(out.collective_timeout->count(), 777);
  EXPECT_EQ(out.mixed_precision, MixedPrecision::kBf16);
  EXPECT_EQ(out.threads_per_process, 2);
  EXPECT_EQ(vars.at("OMP_NUM_THREADS"), "2");
  EXPECT_EQ(out.downcast_bf16, std::optional<bool>(true));
  EXPECT_EQ(out.cpu, std::optional<bool>(false));
  EXPECT_EQ(out.gradient_accumulation_steps, std::optional<int64_t>(4));
}

// The launcher passes an Accelerator setting only when it chose one: unset stays unset, so the
// worker's own environment and config file still decide.
TEST(LaunchContract, UnchosenAcceleratorSettingsAreNotPassed) {
  LaunchContract in;
  in.master_addr = "127.0.0.1";
  auto vars = to_environment(in);
  EXPECT_EQ(vars.count("ACCELERANT_DOWNCAST_BF16"), 0u);
  EXPECT_EQ(vars.count("ACCELERANT_USE_CPU"), 0u);
  EXPECT_EQ(vars.count("ACCELERANT_GRADIENT_ACCUMULATION_STEPS"), 0u);
  auto out = parse(vars);
  EXPECT_FALSE(out.downcast_bf16.has_value());
  EXPECT_FALSE(out.cpu.has_value());
  EXPECT_FALSE(out.gradient_accumulation_steps.has_value());
}

struct BadLauncherCase {
  std::map<std::string, std::string> vars;
  std::string variable;  // must be named, with its value
  std::string value;
  std::string phrase;  // part of the explanation
};

TEST(LaunchContract, RejectsBadValuesNamingVariableValueAndFix) {
  const std::map<std::string, std::string> ok = {{"MASTER_ADDR", "127.0.0.1"}};
  auto with = [&](std::map<std::string, std::string> extra) {
    extra.insert(ok.begin(), ok.end());
    return extra;
  };
  const std::vector<BadLauncherCase> cases = {
      {with({{"RANK", "4"}, {"WORLD_SIZE", "4"}}), "RANK", "4", "not less than the world size 4"},
      {with({{"RANK", "abc"}, {"WORLD_SIZE", "4"}}), "RANK", "abc", "not an integer"},
      {with({{"RANK", "1"}, {"WORLD_SIZE", "2x"}}), "WORLD_SIZE", "2x", "not an integer"},
      {with({{"RANK", "0"}, {"WORLD_SIZE", "0"}}), "WORLD_SIZE", "0", "out of range"},
      {with({{"RANK", "-1"}, {"WORLD_SIZE", "2"}}), "RANK", "-1", "out of range"},
      {{{"RANK", "0"}, {"WORLD_SIZE", "2"}}, "MASTER_ADDR", "", "is missing"},
      {with({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "70000"}}), "MASTER_PORT", "70000",
       "out of range"},
      {with({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "0"}}), "MASTER_PORT", "0",
       "out of range"},
      {with({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "http"}}), "MASTER_PORT", "http",
       "not an integer"},
      {with({{"RANK", "0"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "2"}, {"LOCAL_WORLD_SIZE", "2"}}),
       "LOCAL_RANK", "2", "not less than the local world size 2"},
      {with({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_WORLD_SIZE", "4"}}), "LOCAL_WORLD_SIZE",
       "4", "larger than the world size"},
      {with({{"RANK", "0"}, {"WORLD_SIZE", "4"}, {"LOCAL_WORLD_SIZE", "2"}, {"GROUP_RANK", "5"}}),
       "GROUP_RANK", "5", "not less than the number of machines 2"},
      {with({{"SLURM_PROCID", "2"}, {"SLURM_NTASKS", "2"}}), "SLURM_PROCID", "2", "not less than"},
      {{{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}},
       "MASTER_ADDR",
       "",
       "scontrol show hostnames"},
      {with({{"OMPI_COMM_WORLD_RANK", "x"}, {"OMPI_COMM_WORLD_SIZE", "2"}}), "OMPI_COMM_WORLD_RANK",
       "x", "not an integer"},
      {{{"ACCELERANT_DEBUG_MODE", "maybe"}}, "ACCELERANT_DEBUG_MODE", "maybe", "not a boolean"},
      {{{"ACCELERANT_MIXED_PRECISION", "fp8"}},
       "ACCELERANT_MIXED_PRECISION",
       "fp8",
       "use no, fp16 or bf16"},
      {{{"ACCELERANT_TIMEOUT_MS", "-5"}}, "ACCELERANT_TIMEOUT_MS", "-5", "out of range"},
      {{{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_STEP_NODELIST", "n[2-1]"}},
       "SLURM_STEP_NODELIST",
       "n[2-1]",
       "start is above its end"},
      {{{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_JOB_NODELIST", "n[1-"}},
       "SLURM_JOB_NODELIST",
       "n[1-",
       "never closed"},
      {with({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_JOB_ID", "12x"}}),
       "SLURM_JOB_ID", "12x", "not an integer"},
      {with({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_CPUS_PER_TASK", "0"}}),
       "SLURM_CPUS_PER_TASK", "0", "out of range"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.variable + "=" + c.value);
    try {
      parse(c.vars);
      ADD_FAILURE() << "no error for " << c.variable << "=" << c.value;
    } catch (const EnvironmentError& e) {
      const std::string message = e.what();
      EXPECT_EQ(e.variable(), c.variable);
      EXPECT_EQ(e.value(), c.value);
      EXPECT_NE(message.find(c.variable), std::string::npos) << message;
      EXPECT_NE(message.find(c.phrase), std::string::npos) << message;
      EXPECT_NE(message.find("Fix:"), std::string::npos) << message;
      if (!c.value.empty()) EXPECT_NE(message.find("=" + c.value), std::string::npos) << message;
    }
  }
}

// srun sets neither MASTER_ADDR nor MASTER_PORT: `srun -n 2 ./train` must still meet, on the first
// machine of the step, at a port derived from the job and step ids (docs/launching.md "Slurm").
namespace {

std::map<std::string, std::string> srun_task(std::map<std::string, std::string> extra) {
  extra.insert({{"SLURM_PROCID", "1"},
                {"SLURM_NTASKS", "4"},
                {"SLURM_LOCALID", "1"},
                {"SLURM_NODEID", "0"},
                {"SLURM_NNODES", "2"}});
  return extra;
}

}  // namespace

TEST(LaunchContract, SrunWithoutMasterAddrMeetsOnTheFirstMachineOfTheStep) {
  struct Case {
    std::string name;
    std::map<std::string, std::string> vars;
    std::string master_addr;
  };
  const std::vector<Case> cases = {
      {"step list first",
       srun_task({{"SLURM_STEP_NODELIST", "gpu[07-08]"},
                  {"SLURM_JOB_NODELIST", "gpu[01-08]"},
                  {"SLURM_NODELIST", "gpu[01-08]"}}),
       "gpu07"},
      {"job list without a step list (a program in the batch script itself)",
       srun_task({{"SLURM_JOB_NODELIST", "rack[2-3]n[01-04]"}, {"SLURM_NODELIST", "x1"}}),
       "rack2n01"},
      {"older name last", srun_task({{"SLURM_NODELIST", "n[008-010],m1"}}), "n008"},
      {"an empty variable counts as unset",
       srun_task({{"SLURM_STEP_NODELIST", ""}, {"SLURM_JOB_NODELIST", "a,b"}}), "a"},
      {"MASTER_ADDR wins",
       srun_task({{"MASTER_ADDR", "10.1.2.3"}, {"SLURM_STEP_NODELIST", "gpu[07-08]"}}), "10.1.2.3"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    auto env = parse(c.vars);
    EXPECT_EQ(env.source, EnvSource::kSlurm);
    EXPECT_EQ(env.master_addr, c.master_addr);
  }
}

TEST(LaunchContract, OnlySrunTasksReadTheNodeList) {
  // torchrun's variables win over Slurm's; torchrun sets MASTER_ADDR itself, so a missing one is
  // an error there even inside a Slurm allocation.
  try {
    parse({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"SLURM_STEP_NODELIST", "gpu[07-08]"}});
    FAIL() << "torchrun's contract took MASTER_ADDR from Slurm's node list";
  } catch (const EnvironmentError& e) {
    EXPECT_EQ(e.variable(), "MASTER_ADDR");
  }
  // One task needs no meeting place: a broken node list is not even read.
  auto one =
      parse({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}, {"SLURM_STEP_NODELIST", "n[2-1"}});
  EXPECT_FALSE(one.distributed());
}

TEST(LaunchContract, SrunWithoutMasterPortDerivesItFromTheJobAndStep) {
  auto port = [](std::map<std::string, std::string> vars) {
    vars["SLURM_STEP_NODELIST"] = "n[1-2]";
    return parse(srun_task(vars)).master_port;
  };
  // 15000 + (SLURM_JOB_ID mod 1000) * 10 + (SLURM_STEP_ID mod 10)
  EXPECT_EQ(port({{"SLURM_JOB_ID", "123456"}, {"SLURM_STEP_ID", "3"}}), 19563);
  EXPECT_EQ(port({{"SLURM_JOB_ID", "7"}}), 15070);  // no step id: step 0
  EXPECT_EQ(port({{"SLURM_JOB_ID", "999"}, {"SLURM_STEP_ID", "9"}}), 24999);
  EXPECT_EQ(port({{"SLURM_JOB_ID", "1000"}, {"SLURM_STEP_ID", "0"}}), 15000);
  // Slurm's batch step has the id 4294967294.
  EXPECT_EQ(port({{"SLURM_JOB_ID", "42"}, {"SLURM_STEP_ID", "4294967294"}}), 15424);
  EXPECT_EQ(port({{"SLURM_JOB_ID", "42"}, {"MASTER_PORT", "29600"}}), 29600);  // MASTER_PORT wins
  EXPECT_EQ(port({}), 29500);  // nothing to derive it from: torchrun's default
  // Two steps of one job running at once, and jobs whose ids are less than 1000 apart, never
  // share a port; every port lies in 15000..24999, below the ephemeral range and away from 29500.
  std::set<int> seen;
  for (int job = 5000; job < 6000; ++job) {
    for (int step = 0; step < 10; ++step) {
      const int p =
          port({{"SLURM_JOB_ID", std::to_string(job)}, {"SLURM_STEP_ID", std::to_string(step)}});
      EXPECT_TRUE(p >= 15000 && p <= 24999) << p;
      EXPECT_TRUE(seen.insert(p).second) << "job " << job << " step " << step << " repeats " << p;
    }
  }
}

TEST(LaunchContract, SrunCpusPerTask) {
  EXPECT_EQ(parse(srun_task({{"MASTER_ADDR", "h"}})).cpus_per_process, 0);
  EXPECT_EQ(parse(srun_task({{"MASTER_ADDR", "h"}, {"SLURM_CPUS_PER_TASK", "6"}})).cpus_per_process,
            6);
}
