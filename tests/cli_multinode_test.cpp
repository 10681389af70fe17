// `accelerant launch` across machines. Two "machines" are two network namespaces joined by a veth
// pair (each with its own address and its own ports, so node 1 really reaches node 0 over a
// network and not over loopback); where namespaces cannot be made (not root, no iproute2) those
// tests are skipped with the reason. The launcher protocol itself (joining, restarts on every
// machine, a machine that never comes, mismatched shapes) is also tested with two launchers on
// loopback, which needs no privileges.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <csignal>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <thread>

#include "test_support.h"

using namespace accelerant::testing;
using Clock = std::chrono::steady_clock;

namespace {

using accelerant::testing::contains;

// No config file of the machine's own may leak in.
void isolate_from_user_config() {
  ::unsetenv("ACCELERANT_CONFIG_FILE");
  ::setenv("XDG_CACHE_HOME", "/nonexistent/accelerant-test-cache", 1);
}

// `machines`: --num_machines's value, 2 or an elastic range such as 1:2.
std::vector<std::string> launch_args(int machine_rank, const std::string& ip, int port,
                                     const std::vector<std::string>& more,
                                     const std::string& machines = "2") {
  std::vector<std::string> args{cli_path(),
                                "launch",
                                "--num_machines",
                                machines,
                                "--machine_rank",
                                std::to_string(machine_rank),
                                "--main_process_ip",
                                ip,
                                "--main_process_port",
                                std::to_string(port)};
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

int exit_code(int status) { return WIFEXITED(status) ? WEXITSTATUS(status) : -1; }

// `argv` run by a shell with its output into `log`, to follow the program while it runs.
std::vector<std::string> logged_to(const std::vector<std::string>& argv, const std::string& log) {
  std::string command;
  for (const auto& arg : argv) command += "'" + arg + "' ";
  return {"/bin/sh", "-c", command + "> " + log + " 2>&1"};
}

// Waits (up to 60 s) until the file `path` holds `what`; whether it did.
bool file_says(const std::string& path, const std::string& what) {
  for (int i = 0; i < 600; ++i) {
    if (contains(slurp(path), what)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
}

// Waits (up to 60 s) until every one of `names` exists in `dir` (the workers' marks).
void wait_for_files(const std::string& dir, const std::vector<std::string>& names) {
  const auto all_there = [&] {
    for (const auto& name : names)
      if (::access((dir + "/" + name).c_str(), F_OK) != 0) return false;
    return true;
  };
  for (int i = 0; i < 600 && !all_there(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
}

// Two network namespaces, "machine 0" at 10.99.0.1 and "machine 1" at 10.99.0.2, joined by veth.
class TwoMachines : public ::testing::Test {
 protected:
  void SetUp() override {
    isolate_from_user_config();
    const std::string id = std::to_string(::getpid());
    ns_ = {"acc" + id + "m0", "acc" + id + "m1"};
    const std::string veth0 = "av" + id + "a", veth1 = "av" + id + "b";
    if (::geteuid() != 0)
      GTEST_SKIP() << "network namespaces need root (CAP_SYS_ADMIN); run the suite as root";
    ip_ = ::access("/usr/sbin/ip", X_OK) == 0 ? "/usr/sbin/ip" : "/sbin/ip";
    if (::access(ip_.c_str(), X_OK) != 0)
      GTEST_SKIP() << "iproute2's ip is not installed (scripts/install-deps)";
    const std::vector<std::vector<std::string>> setup = {
        {"netns", "add", ns_[0]},
        {"netns", "add", ns_[1]},
        {"link", "add", veth0, "type", "veth", "peer", "name", veth1},
        {"link", "set", veth0, "netns", ns_[0]},
        {"link", "set", veth1, "netns", ns_[1]},
        {"-n", ns_[0], "addr", "add", "10.99.0.1/24", "dev", veth0},
        {"-n", ns_[1], "addr", "add", "10.99.0.2/24", "dev", veth1},
        {"-n", ns_[0], "link", "set", veth0, "up"},
        {"-n", ns_[1], "link", "set", veth1, "up"},
        {"-n", ns_[0], "link", "set", "lo", "up"},
        {"-n", ns_[1], "link", "set", "lo", "up"},
    };
    for (const auto& step : setup) {
      std::string out;
      std::vector<std::string> argv{ip_};
      argv.insert(argv.end(), step.begin(), step.end());
      auto program = start_program(argv);
      const int status = finish_program(program, out, std::chrono::seconds(10));
      if (exit_code(status) != 0) {
        GTEST_SKIP() << "cannot make the test's network namespaces (`ip " << step[0] << " "
                     << step[1] << " ...` said: " << out << "); this sandbox does not allow them";
      }
    }
  }

  void TearDown() override {
    for (const auto& ns : ns_) {  // deleting a namespace also deletes its end of the veth pair
      std::string out;
      auto program = start_program({ip_, "netns", "del", ns});
      finish_program(program, out, std::chrono::seconds(10));
    }
  }

  // accelerant launch as machine `m`, inside its namespace.
  ProgramRun start_machine(int m, const std::vector<std::string>& more,
                           const std::string& machines = "2") {
    std::vector<std::string> argv{ip_, "netns", "exec", ns_[m]};
    // Each namespace has its own ports.
    auto args = launch_args(m, "10.99.0.1", 29500, more, machines);
    argv.insert(argv.end(), args.begin(), args.end());
    return start_program(argv);
  }

  std::string ip_;
  std::vector<std::string> ns_;
};

TEST_F(TwoMachines, FourWorkersOnTwoMachinesFormOneWorldAndAllReduce) {
  auto m0 = start_machine(0, {"-n", "4", launch_helper_path(), "worker"});
  auto m1 = start_machine(1, {"-n", "4", launch_helper_path(), "worker"});
  std::string out0, out1;
  const int status0 = finish_program(m0, out0, std::chrono::seconds(90));
  const int status1 = finish_program(m1, out1, std::chrono::seconds(90));
  ASSERT_EQ(exit_code(status0), 0) << out0 << "\n--- machine 1:\n" << out1;
  ASSERT_EQ(exit_code(status1), 0) << out1 << "\n--- machine 0:\n" << out0;
  // 1 + 2 + 3 + 4: every rank's contribution, from both machines.
  EXPECT_TRUE(contains(out0, "worker rank=0 world=4 local=0 sum=10")) << out0;
  EXPECT_TRUE(contains(out0, "worker rank=1 world=4 local=1 sum=10")) << out0;
  EXPECT_TRUE(contains(out1, "worker rank=2 world=4 local=0 sum=10")) << out1;
  EXPECT_TRUE(contains(out1, "worker rank=3 world=4 local=1 sum=10")) << out1;
  EXPECT_TRUE(contains(out0, "node 0 of 2, 4 processes in all")) << out0;
  // Two ranks per machine: each machine's segment, Gloo between the machines' first ranks.
  EXPECT_TRUE(contains(out1, "path=hierarchical: shared memory in each of 2 nodes (2+2 ranks)"))
      << out1;
}

// Killing one machine's launcher (SIGKILL: no chance to say goodbye) while every worker idles in
// a joined group: the other machine notices the broken link, not a collective timeout, stops its
// workers and names the machine; no worker is left on either machine.
class KillOneMachine : public TwoMachines, public ::testing::WithParamInterface<int> {};

TEST_P(KillOneMachine, TheOtherFailsFastNamingItAndNoWorkerIsLeft) {
  const int victim = GetParam(), survivor = 1 - victim;
  ScratchDir dir;
  ProgramRun runs[2] = {start_machine(0, {"-n", "4", launch_helper_path(), "park", dir.path}),
                        start_machine(1, {"-n", "4", launch_helper_path(), "park", dir.path})};
  std::vector<pid_t> workers;
  for (int i = 0; i < 600 && workers.size() < 4; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    workers = read_pid_files(dir.path);
  }
  ASSERT_EQ(workers.size(), 4u) << "the group did not form";
  const auto killed_at = Clock::now();
  ::kill(runs[victim].pid, SIGKILL);
  std::string out, victim_out;
  const int status = finish_program(runs[survivor], out, std::chrono::seconds(60));
  const auto noticed_after = Clock::now() - killed_at;
  finish_program(runs[victim], victim_out, std::chrono::seconds(10));

  EXPECT_EQ(exit_code(status), 1) << out;
  // Far below every timeout that would otherwise end it (join 600 s, collectives 30 min).
  EXPECT_LT(noticed_after, std::chrono::seconds(20)) << out;
  if (victim == 1) {
    EXPECT_TRUE(contains(out, "machine 1's launcher disconnected without a word")) << out;
  } else {
    // Two watchers race to notice: the link to machine 0's launcher, or this launcher's
    // connection to the job's store there. Either must name machine 0 and its address.
    EXPECT_TRUE(contains(out, "the connection to machine 0's launcher (10.99.0.1) broke") ||
                contains(out, "lost the job's store on machine 0 (10.99.0.1:"))
        << out;
  }
  EXPECT_TRUE(wait_until_dead(workers, std::chrono::seconds(10)).empty())
      << "workers left behind:\n"
      << out;
}

INSTANTIATE_TEST_SUITE_P(EitherMachine, KillOneMachine, ::testing::Values(1, 0),
                         [](const auto& info) {
                           return info.param == 0 ? "MainMachine" : "OtherMachine";
                         });

// In-place recovery across machines (issue 37): a worker SIGKILLed in its backward (while the
// others all-reduce), before it, or as the others save, on either machine, is replaced alone by
// its machine's launcher; the other three workers, on both machines, are not restarted (they end
// in generation 1 though they started in generation 0), and every process ends with the
// parameters of the run without the failure, bit for bit.
struct Victim {
  int rank;
  const char* where;  // launch_helper train's WHERE
};

using StartMachine = std::function<ProgramRun(int machine, const std::vector<std::string>& more)>;

// Both machines' output of `launch_helper train` under in-place recovery, started by `start`.
std::string train_on_two_machines(const StartMachine& start, int victim, const char* where) {
  ScratchDir dir;
  const std::vector<std::string> more{"-n",
                                      "4",
                                      "--recovery",
                                      "replace_failed_worker",
                                      "--max_restarts",
                                      "1",
                                      "--collective_timeout",
                                      "10",
                                      launch_helper_path(),
                                      "train",
                                      std::to_string(victim),
                                      where,
                                      dir.path};
  auto m0 = start(0, more);
  auto m1 = start(1, more);
  std::string out0, out1;
  const int status0 = finish_program(m0, out0, std::chrono::seconds(120));
  const int status1 = finish_program(m1, out1, std::chrono::seconds(120));
  EXPECT_EQ(exit_code(status0), 0) << out0 << "\n--- machine 1:\n" << out1;
  EXPECT_EQ(exit_code(status1), 0) << out1 << "\n--- machine 0:\n" << out0;
  return out0 + "\n--- machine 1:\n" + out1;
}

// Rank `victim` dies `where`; every other process is the one started in generation 0, and all
// end bit for bit as without the death.
void replaced_in_place_on_two_machines(const StartMachine& start, int victim, const char* where) {
  const std::string clean = train_on_two_machines(start, -1, where);
  if (::testing::Test::HasFailure()) return;  // the uninterrupted run must work first
  const std::string marker = "trained rank=0 started_in_generation=0 generation=0 steps=9 digest=";
  const size_t at = clean.find(marker);
  ASSERT_NE(at, std::string::npos) << clean;
  const std::string digest =
      clean.substr(at + marker.size(), clean.find('\n', at) - at - marker.size());
  const std::string recovered = train_on_two_machines(start, victim, where);
  for (int r = 0; r < 4; ++r) {
    const std::string rank = "trained rank=" + std::to_string(r);
    EXPECT_TRUE(
        contains(clean, rank + " started_in_generation=0 generation=0 steps=9 digest=" + digest))
        << clean;
    // A survivor started in generation 0 and is still the same process in generation 1.
    const std::string started = r == victim ? "1" : "0";
    EXPECT_TRUE(contains(recovered, rank + " started_in_generation=" + started +
                                        " generation=1 steps=9 digest=" + digest))
        << recovered;
  }
  EXPECT_TRUE(contains(recovered, "starting a replacement in its place")) << recovered;
  EXPECT_FALSE(contains(recovered, "Restarting the group")) << recovered;
}

class ReplaceInPlaceOnTwoMachines : public TwoMachines,
                                    public ::testing::WithParamInterface<Victim> {};

TEST_P(ReplaceInPlaceOnTwoMachines, OnlyTheKilledWorkerRestartsAndTheRunEndsBitForBit) {
  replaced_in_place_on_two_machines(
      [this](int machine, const std::vector<std::string>& more) {
        return start_machine(machine, more);
      },
      GetParam().rank, GetParam().where);
}

// The same with two launchers on loopback, which needs no privileges: where network namespaces
// cannot be made, the launchers' generation claims are still tested.
TEST(MultiMachineLaunch, AWorkerOnTheOtherMachineIsReplacedInPlace) {
  isolate_from_user_config();
  const int port = free_port();
  replaced_in_place_on_two_machines(
      [port](int machine, const std::vector<std::string>& more) {
        return start_program(launch_args(machine, "127.0.0.1", port, more));
      },
      3, "backward");
}

// Ranks 2 and 3 live on machine 1, whose launcher reaches the job's store on machine 0; ranks 0
// (the main process) and 1 on machine 0, with the store.
INSTANTIATE_TEST_SUITE_P(EitherMachine, ReplaceInPlaceOnTwoMachines,
                         ::testing::Values(Victim{3, "backward"}, Victim{1, "backward"},
                                           Victim{2, "before"}, Victim{0, "save"}),
                         [](const auto& info) {
                           const std::string where = info.param.where;
                           return "Rank" + std::to_string(info.param.rank) +
                                  (info.param.rank < 2 ? "OnTheMainMachine" : "OnTheOtherMachine") +
                                  (where == "backward" ? "InBackward"
                                   : where == "before" ? "BeforeBackward"
                                                       : "AsTheOthersSave");
                         });

// A machine lost (its launcher SIGKILLed, its workers with it) under in-place recovery: machine 0
// waits for a launcher with its node_rank, which starts its workers as replacements in the running
// group; machine 0's workers recover their step and are not restarted, and every process ends
// with the parameters of the run without the loss, bit for bit.
TEST_F(TwoMachines, ALostMachinesWorkersAreReplacedInPlaceWhenItsLauncherComesBack) {
  std::string clean_out;
  {
    ScratchDir clean;
    // The same recovery: it reseeds the generators at each batch (dropout).
    const std::vector<std::string> more{
        "-n", "4",        "--recovery", "replace_failed_worker", launch_helper_path(), "train",
        "-1", "backward", clean.path};
    auto m0 = start_machine(0, more);
    auto m1 = start_machine(1, more);
    std::string out1;
    EXPECT_EQ(exit_code(finish_program(m0, clean_out, std::chrono::seconds(120))), 0) << clean_out;
    EXPECT_EQ(exit_code(finish_program(m1, out1, std::chrono::seconds(120))), 0) << out1;
  }
  const std::string marker = "trained rank=0 started_in_generation=0 generation=0 steps=9 digest=";
  const size_t at = clean_out.find(marker);
  ASSERT_NE(at, std::string::npos) << clean_out;
  const std::string digest =
      clean_out.substr(at + marker.size(), clean_out.find('\n', at) - at - marker.size());

  ScratchDir dir;
  const std::vector<std::string> more{"-n",
                                      "4",
                                      "--recovery",
                                      "replace_failed_worker",
                                      "--max_restarts",
                                      "1",
                                      "--rejoin_timeout",
                                      "60",
                                      "--collective_timeout",
                                      "10",
                                      launch_helper_path(),
                                      "train",
                                      "-1",
                                      "pause",
                                      dir.path};
  // Machine 0's output in a file, to follow it while it runs.
  const std::string log = dir.path + "/m0.log";
  std::vector<std::string> argv{ip_, "netns", "exec", ns_[0]};
  for (const auto& arg : logged_to(launch_args(0, "10.99.0.1", 29500, more), log))
    argv.push_back(arg);
  auto m0 = start_program(argv);
  auto m1 = start_machine(1, more);
  wait_for_files(dir.path, {"paused"});
  ::kill(m1.pid, SIGKILL);  // its workers die with it
  std::string lost_out;
  finish_program(m1, lost_out, std::chrono::seconds(10));
  const bool awaited = file_says(log, "Its workers are replaced in place (generation 1)");
  auto again = start_machine(1, more);
  const bool back = file_says(log, "machine 1's launcher is back");
  std::ofstream(dir.path + "/go") << "go\n";
  std::string ignored, out1;
  const int status0 = finish_program(m0, ignored, std::chrono::seconds(120));
  const int status1 = finish_program(again, out1, std::chrono::seconds(60));
  const std::string out0 = slurp(log);
  ASSERT_TRUE(awaited && back) << out0;
  ASSERT_EQ(exit_code(status0), 0) << out0 << "\n--- machine 1 again:\n" << out1;
  ASSERT_EQ(exit_code(status1), 0) << out1 << "\n--- machine 0:\n" << out0;
  EXPECT_TRUE(contains(out0, "machine 1's launcher disconnected without a word")) << out0;
  EXPECT_TRUE(contains(out1,
                       "this machine's workers join the running group (attempt 1, "
                       "generation 1) in place of the lost ones"))
      << out1;
  // Machine 0's workers started in generation 0 and are the same processes in generation 1.
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(
        contains(out0, "trained rank=" + std::to_string(r) +
                           " started_in_generation=0 generation=1 steps=9 digest=" + digest))
        << out0;
  }
  for (int r = 2; r < 4; ++r) {
    EXPECT_TRUE(
        contains(out1, "trained rank=" + std::to_string(r) +
                           " started_in_generation=1 generation=1 steps=9 digest=" + digest))
        << out1;
  }
  EXPECT_FALSE(contains(out0, "Restarting the group")) << out0;
}

// The rest runs two launchers on loopback: what the launchers tell each other does not depend on
// the network between them.

TEST(MultiMachineLaunch, AFailureOnOneMachineRestartsTheGroupOnEveryMachine) {
  isolate_from_user_config();
  const int port = free_port();
  const std::string worker =
      "if [ \"$ACCELERANT_RESTART_COUNT\" = 0 ] && [ \"$RANK\" = 3 ]; then exit 3; fi; exec " +
      launch_helper_path() + " worker";
  const std::vector<std::string> more{"-n", "4", "--max_restarts", "1", "/bin/sh", "-c", worker};
  auto m0 = start_program(launch_args(0, "127.0.0.1", port, more));
  auto m1 = start_program(launch_args(1, "127.0.0.1", port, more));
  std::string out0, out1;
  const int status0 = finish_program(m0, out0, std::chrono::seconds(90));
  const int status1 = finish_program(m1, out1, std::chrono::seconds(90));
  ASSERT_EQ(exit_code(status0), 0) << out0 << "\n--- machine 1:\n" << out1;
  ASSERT_EQ(exit_code(status1), 0) << out1 << "\n--- machine 0:\n" << out0;
  // Machine 0's workers did not fail, yet its group restarted, because of machine 1's.
  EXPECT_TRUE(contains(out0, "machine 1 reported: worker rank 3")) << out0;
  EXPECT_TRUE(contains(out0, "exit code 3")) << out0;
  EXPECT_TRUE(contains(out0, "Restarting the group (restart 1 of 1)")) << out0;
  EXPECT_TRUE(contains(out1, "Restarting the group (restart 1 of 1)")) << out1;
  EXPECT_TRUE(contains(out0, "worker rank=0 world=4 local=0 sum=10")) << out0;
  EXPECT_TRUE(contains(out1, "worker rank=3 world=4 local=1 sum=10")) << out1;
}

TEST(MultiMachineLaunch, WithoutRestartsAFailureElsewhereEndsEveryMachineWithItsReport) {
  isolate_from_user_config();
  const int port = free_port();
  const std::vector<std::string> more{"-n", "4", "/bin/sh", "-c",
                                      "[ \"$RANK\" = 2 ] && exit 7; exec sleep 60"};
  auto m0 = start_program(launch_args(0, "127.0.0.1", port, more));
  auto m1 = start_program(launch_args(1, "127.0.0.1", port, more));
  std::string out0, out1;
  const int status0 = finish_program(m0, out0, std::chrono::seconds(60));
  const int status1 = finish_program(m1, out1, std::chrono::seconds(60));
  EXPECT_EQ(exit_code(status0), 1) << out0;
  EXPECT_EQ(exit_code(status1), 1) << out1;
  EXPECT_TRUE(contains(out0, "machine 1 reported: worker rank 2")) << out0;
  EXPECT_TRUE(contains(out0, "exit code 7")) << out0;
  EXPECT_TRUE(contains(out1, "worker rank 2 (local rank 0 on node 1")) << out1;
}

// Elastic membership (--num_nodes MIN:MAX, issue 37), with two launchers on loopback: a job of
// 1:2 machines goes on with one when the other is lost or never comes. Its result is held
// against the uninterrupted run of 4 processes on one machine: the data re-sharded over 2
// processes with 2 micro-batches per step sums the same samples per step (in another order, so
// equal up to rounding).

std::vector<std::string> elastic_args(int machine_rank, int port,
                                      const std::vector<std::string>& more) {
  std::vector<std::string> args{"--rejoin_timeout", "1", "-n", "4"};
  args.insert(args.end(), more.begin(), more.end());
  return launch_args(machine_rank, "127.0.0.1", port, args, "1:2");
}

// The checksum `launch_helper elastic` printed on the line that starts with `line`; NaN if none.
double checksum_after(const std::string& out, const std::string& line) {
  const size_t at = out.find(line + " checksum=");
  if (at == std::string::npos) return std::nan("");
  return std::stod(out.substr(at + line.size() + 10));
}

// The checksum on the line of `out` that starts with `line` is `want`, up to rounding (the same
// samples per step, summed in another order).
void expect_uninterrupted_checksum(const std::string& out, const std::string& line, double want) {
  const double got = checksum_after(out, line);
  ASSERT_FALSE(std::isnan(got)) << out;
  EXPECT_NEAR(got, want, 5e-6 * std::max(1.0, std::abs(want))) << out;
}

// Rank 0's checksum of the uninterrupted run: 4 processes on one machine.
double uninterrupted_checksum() {
  ScratchDir dir;
  auto run = start_program({cli_path(), "launch", "-n", "4", "--main_process_port", "0",
                            launch_helper_path(), "elastic", dir.path, "0"});
  std::string out;
  EXPECT_EQ(exit_code(finish_program(run, out, std::chrono::seconds(90))), 0) << out;
  const double sum =
      checksum_after(out, "elastic rank=0 world=4 accumulation=1 generation=0 steps=9");
  EXPECT_FALSE(std::isnan(sum)) << out;
  return sum;
}

// Machines 0 and 1 of a 1:2 job started by `start` (with these flags after the job's shape);
// machine 1 lost (SIGKILL) after step 4: machine 0 goes on alone from the checkpoint of step 3.
// `zero_stage`: the run's ZeRO stage, whose checkpoint is then re-sharded for fewer processes.
void goes_on_with_fewer(const StartMachine& start, const std::string& zero_stage = "0") {
  const double want = uninterrupted_checksum();
  ScratchDir dir;
  const std::vector<std::string> more{
      "--rejoin_timeout",   "1",       "-n",     "4", "--max_restarts", "1",
      launch_helper_path(), "elastic", dir.path, "1", zero_stage};
  auto m0 = start(0, more);
  auto m1 = start(1, more);
  // Every worker waits after step 4, past the checkpoint of step 3: machine 1 is lost then.
  wait_for_files(dir.path, {"paused"});
  ::kill(m1.pid, SIGKILL);
  std::string out0, out1;
  const int status0 = finish_program(m0, out0, std::chrono::seconds(120));
  finish_program(m1, out1, std::chrono::seconds(10));
  ASSERT_EQ(exit_code(status0), 0) << out0;
  EXPECT_TRUE(contains(out0, "machine 1's launcher disconnected without a word")) << out0;
  EXPECT_TRUE(contains(out0, "Under elastic membership (1:2 machines) the job goes on")) << out0;
  EXPECT_TRUE(contains(out0,
                       "attempt 2 runs on machine(s) 0 of 2 (2 processes); "
                       "gradient_accumulation_steps 1 -> 2 keeps the global batch of 2 "
                       "machines"))
      << out0;
  EXPECT_TRUE(contains(out0, "was saved by 4 process(es), this run has 2")) << out0;
  expect_uninterrupted_checksum(out0, "elastic rank=0 world=2 accumulation=2 generation=1 steps=9",
                                want);
}

TEST(ElasticMembership, AMachineLostUnderMinMaxLeavesTheOtherGoingOnWithFewerProcesses) {
  isolate_from_user_config();
  const int port = free_port();
  goes_on_with_fewer([port](int machine, const std::vector<std::string>& more) {
    return start_program(launch_args(machine, "127.0.0.1", port, more, "1:2"));
  });
}

// The same under ZeRO stage 2: each process's shard of the optimizer state in the checkpoint of 4
// processes is re-sharded for 2.
TEST(ElasticMembership, AZeroRunGoesOnWithFewerProcessesFromItsReshardedCheckpoint) {
  isolate_from_user_config();
  const int port = free_port();
  goes_on_with_fewer(
      [port](int machine, const std::vector<std::string>& more) {
        return start_program(launch_args(machine, "127.0.0.1", port, more, "1:2"));
      },
      "2");
}

// The same on two network namespaces: the machines reach each other over a network.
TEST_F(TwoMachines, AMachineLostUnderMinMaxLeavesTheOtherGoingOnWithFewerProcesses) {
  goes_on_with_fewer([this](int machine, const std::vector<std::string>& more) {
    return start_machine(machine, more, "1:2");
  });
}

// Three machines of a 1:3 job, the middle one lost: the two left are numbered 0 and 1 among
// themselves (machine 2's workers become ranks 2 and 3), and 3 micro-batches per step do not
// divide among 2 machines, which machine 0 says.
TEST(ElasticMembership, TheMachinesLeftAreNumberedAmongThemselves) {
  isolate_from_user_config();
  ScratchDir dir;
  const int port = free_port();
  const std::vector<std::string> more{
      "--rejoin_timeout",   "1",       "-n",     "6", "--max_restarts", "1",
      launch_helper_path(), "elastic", dir.path, "1"};
  ProgramRun runs[3] = {start_program(launch_args(0, "127.0.0.1", port, more, "1:3")),
                        start_program(launch_args(1, "127.0.0.1", port, more, "1:3")),
                        start_program(launch_args(2, "127.0.0.1", port, more, "1:3"))};
  wait_for_files(dir.path, {"paused"});
  ::kill(runs[1].pid, SIGKILL);
  std::string out[3];
  const int status0 = finish_program(runs[0], out[0], std::chrono::seconds(120));
  const int status2 = finish_program(runs[2], out[2], std::chrono::seconds(120));
  finish_program(runs[1], out[1], std::chrono::seconds(10));
  ASSERT_EQ(exit_code(status0), 0) << out[0] << "\n--- machine 2:\n" << out[2];
  ASSERT_EQ(exit_code(status2), 0) << out[2] << "\n--- machine 0:\n" << out[0];
  EXPECT_TRUE(contains(out[0],
                       "attempt 2 runs on machine(s) 0, 2 of 3 (4 processes); the global "
                       "batch is 2/3 of the full job's: its 3 micro-batches per step do "
                       "not divide among 2 machines"))
      << out[0];
  EXPECT_TRUE(contains(out[0], "elastic rank=0 world=4 accumulation=1 generation=1")) << out[0];
  EXPECT_TRUE(contains(out[2], "elastic rank=2 world=4 accumulation=1 generation=1")) << out[2];
  EXPECT_TRUE(contains(out[2], "elastic rank=3 world=4 accumulation=1 generation=1")) << out[2];
}

TEST(ElasticMembership, AMachineThatNeverComesIsGoneOnWithoutAfterTheRejoinTimeout) {
  isolate_from_user_config();
  const double want = uninterrupted_checksum();
  ScratchDir dir;
  auto m0 =
      start_program(elastic_args(0, free_port(), {launch_helper_path(), "elastic", dir.path, "0"}));
  std::string out;
  ASSERT_EQ(exit_code(finish_program(m0, out, std::chrono::seconds(90))), 0) << out;
  EXPECT_TRUE(contains(out,
                       "machine(s) 1 of 2 did not join within the rejoin timeout of 1 s; "
                       "the job starts with the 1 there (at least 1)"))
      << out;
  expect_uninterrupted_checksum(out, "elastic rank=0 world=2 accumulation=2 generation=0 steps=9",
                                want);
}

// A machine that arrives while the group runs on fewer joins at the next step boundary: every
// worker stops after the same step with a checkpoint, and the group restarts with the new machine
// from there (max_restarts 0: a membership change is not a restart).
TEST(ElasticMembership, AMachineThatArrivesJoinsAtTheNextStepBoundary) {
  isolate_from_user_config();
  const double want = uninterrupted_checksum();
  ScratchDir dir;
  const int port = free_port();
  const std::vector<std::string> more{"--max_restarts", "0",      launch_helper_path(),
                                      "elastic",        dir.path, "2"};
  // Machine 0 alone first, its output in a file to follow it while it runs.
  const std::string log = dir.path + "/m0.log";
  auto m0 = start_program(logged_to(elastic_args(0, port, more), log));
  // Its workers wait after step 4 until machine 1 was taken in: both have looked for news at the
  // batch after step 4 then, so they agree to stop after step 6.
  wait_for_files(dir.path, {"paused.0", "paused.1"});
  auto m1 = start_program(elastic_args(1, port, more));
  const bool taken_in = file_says(log, "machine(s) 1 arrived");
  std::ofstream(dir.path + "/go") << "go\n";
  std::string ignored, out1;
  const int status0 = finish_program(m0, ignored, std::chrono::seconds(120));
  const int status1 = finish_program(m1, out1, std::chrono::seconds(30));
  const std::string out0 = slurp(log);
  ASSERT_TRUE(taken_in) << out0;
  ASSERT_EQ(exit_code(status0), 0) << out0 << "\n--- machine 1:\n" << out1;
  ASSERT_EQ(exit_code(status1), 0) << out1 << "\n--- machine 0:\n" << out0;
  EXPECT_TRUE(contains(out0, "attempt 1 runs on machine(s) 0 of 2 (2 processes)")) << out0;
  EXPECT_TRUE(contains(out0, "every process stopped after step 6 with the checkpoint")) << out0;
  EXPECT_TRUE(contains(out0, "(not counted as a restart)")) << out0;
  EXPECT_TRUE(contains(out0, "attempt 2 runs on machine(s) 0, 1 of 2 (4 processes)")) << out0;
  EXPECT_TRUE(contains(out0, "was saved by 2 process(es), this run has 4")) << out0;
  EXPECT_TRUE(contains(out1, "elastic rank=2 world=4 accumulation=1 generation=1 steps=9")) << out1;
  expect_uninterrupted_checksum(out0, "elastic rank=0 world=4 accumulation=1 generation=1 steps=9",
                                want);
}

class MissingMachine : public ::testing::TestWithParam<int> {};

TEST_P(MissingMachine, TheLauncherThatCameGivesUpAfterTheJoinTimeoutNamingIt) {
  isolate_from_user_config();
  const int present = GetParam();
  const auto started = Clock::now();
  auto run = start_program(launch_args(present, "127.0.0.1", free_port(),
                                       {"-n", "4", "--join_timeout", "2", "/bin/true"}));
  std::string out;
  const int status = finish_program(run, out, std::chrono::seconds(60));
  EXPECT_EQ(exit_code(status), 1) << out;
  EXPECT_LT(Clock::now() - started, std::chrono::seconds(30)) << out;
  if (present == 0) {
    EXPECT_TRUE(contains(out, "machine(s) 1 of 2 did not join within the join timeout of 2 s"))
        << out;
  } else {
    EXPECT_TRUE(contains(out, "machine 0 (the main machine, at 127.0.0.1:")) << out;
    EXPECT_TRUE(contains(out, "did not answer within the join timeout of 2 s")) << out;
  }
  EXPECT_TRUE(contains(out, "--join_timeout")) << "the fix should be offered: " << out;
}

INSTANTIATE_TEST_SUITE_P(EitherMachine, MissingMachine, ::testing::Values(0, 1),
                         [](const auto& info) {
                           return info.param == 0 ? "OnlyTheMain" : "OnlyTheOther";
                         });

TEST(MultiMachineLaunch, MachinesStartedForDifferentJobShapesAreRefusedOnBoth) {
  isolate_from_user_config();
  const int port = free_port();
  auto m0 = start_program(
      launch_args(0, "127.0.0.1", port, {"-n", "4", "--join_timeout", "20", "/bin/true"}));
  auto m1 = start_program(
      launch_args(1, "127.0.0.1", port, {"-n", "6", "--join_timeout", "20", "/bin/true"}));
  std::string out0, out1;
  const int status0 = finish_program(m0, out0, std::chrono::seconds(60));
  const int status1 = finish_program(m1, out1, std::chrono::seconds(60));
  EXPECT_EQ(exit_code(status0), 1) << out0;
  EXPECT_EQ(exit_code(status1), 1) << out1;
  EXPECT_TRUE(
      contains(out0,
               "machine 1 was started for 2 machine(s) with 3 process(es) each, this machine "
               "for 2 machine(s) with 2 process(es) each"))
      << out0;
  EXPECT_TRUE(contains(out1, "machine 0 was started for 2 machine(s) with 2 process(es) each"))
      << out1;
}

// A launcher stopped on purpose (Ctrl-C, SIGTERM from a scheduler) tells the other machines why
// before it goes: they stop their workers too and say which machine stopped and how.
class StopOneMachine : public ::testing::TestWithParam<int> {};

TEST_P(StopOneMachine, TheOtherStopsTooSayingWhichMachineWasStoppedAndHow) {
  isolate_from_user_config();
  const int victim = GetParam(), survivor = 1 - victim;
  const int port = free_port();
  ScratchDir dir;
  const std::vector<std::string> more{"-n", "4", launch_helper_path(), "park", dir.path};
  ProgramRun runs[2] = {start_program(launch_args(0, "127.0.0.1", port, more)),
                        start_program(launch_args(1, "127.0.0.1", port, more))};
  std::vector<pid_t> workers;
  for (int i = 0; i < 600 && workers.size() < 4; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    workers = read_pid_files(dir.path);
  }
  ASSERT_EQ(workers.size(), 4u) << "the group did not form";
  ::kill(runs[victim].pid, SIGTERM);
  std::string out, victim_out;
  const int status = finish_program(runs[survivor], out, std::chrono::seconds(60));
  finish_program(runs[victim], victim_out, std::chrono::seconds(30));

  EXPECT_EQ(exit_code(status), 1) << out;
  const std::string who = victim == 0 ? "machine 0 ended the job: " : "machine 1 stopped: ";
  EXPECT_TRUE(contains(out, who + "its launcher was stopped by signal 15")) << out;
  EXPECT_TRUE(contains(out, "restart the job on every machine")) << out;
  EXPECT_TRUE(wait_until_dead(workers, std::chrono::seconds(10)).empty())
      << "workers left behind:\n"
      << out;
}

INSTANTIATE_TEST_SUITE_P(EitherMachine, StopOneMachine, ::testing::Values(1, 0),
                         [](const auto& info) {
                           return info.param == 0 ? "MainMachine" : "OtherMachine";
                         });

}  // namespace
