// `accelerant launch`, run as a real program: workers get the torchrun variables and join one
// group; a failing worker is named; a killed worker is restarted; SIGINT leaves no process;
// the config file is read and flags override it; the same program trains identically under
// torchrun and mpirun.
#include <accelerant/config.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "test_support.h"

using namespace accelerant::testing;

namespace {

int run(const std::vector<std::string>& args, std::string& output) {
  // No config file of the machine's own may leak in: the tests that want one pass --config_file.
  ::unsetenv("ACCELERANT_CONFIG_FILE");
  ::setenv("XDG_CACHE_HOME", "/nonexistent/accelerant-test-cache", 1);
  std::vector<std::string> argv{cli_path(), "launch"};
  argv.insert(argv.end(), args.begin(), args.end());
  auto program = start_program(argv);
  const int status = finish_program(program, output, std::chrono::seconds(60));
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

int count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

}  // namespace

class LaunchWorkers : public ::testing::TestWithParam<int> {};

TEST_P(LaunchWorkers, EveryWorkerJoinsOneGroup) {
  const int n = GetParam();
  std::string out;
  ASSERT_EQ(
      run({"--world_size", std::to_string(n), "--master_port", "0", launch_helper_path(), "worker"},
          out),
      0)
      << out;
  const std::string sum = "sum=" + std::to_string(n * (n + 1) / 2);
  for (int r = 0; r < n; ++r) {
    const std::string line = "worker rank=" + std::to_string(r) + " world=" + std::to_string(n) +
                             " local=" + std::to_string(r) + " " + sum;
    EXPECT_NE(out.find(line), std::string::npos) << "missing '" << line << "' in:\n" << out;
  }
}

INSTANTIATE_TEST_SUITE_P(TwoAndFour, LaunchWorkers, ::testing::Values(2, 4));

TEST(Launch, AWorkerExitingWithThreeIsNamedAndTheLauncherFails) {
  std::string out;
  EXPECT_NE(run({"-n", "2", "--main_process_port", "0", "/bin/sh", "-c",
                 "[ \"$RANK\" = 1 ] && exit 3; sleep 20"},
                out),
            0);
  EXPECT_NE(out.find("worker rank 1"), std::string::npos) << out;
  EXPECT_NE(out.find("exit code 3"), std::string::npos) << out;
}

TEST(Launch, AnUncaughtExceptionInAWorkerIsQuotedInTheReport) {
  std::string out;
  EXPECT_EQ(run({"-n", "2", "--main_process_port", "0", launch_helper_path(), "throw"}, out), 1);
  EXPECT_NE(out.find("worker rank 1"), std::string::npos) << out;
  EXPECT_NE(out.find("Its error:\n  | the data file shard-7 is corrupt"), std::string::npos) << out;
}

// In place (the program calls accelerant::launch, and `accelerant launch` started it), what fn
// throws ends that worker as it would a forked one: reported on its stderr and in the launcher's
// report, exit status 1; not std::terminate's "terminate called after throwing" and an abort.
TEST(Launch, AnExceptionFromLaunchInPlaceIsReportedAsAWorkersFailure) {
  std::string out;
  EXPECT_EQ(run({"-n", "2", "--main_process_port", "0", launch_helper_path(), "launch_throw"}, out),
            1)
      << out;
  EXPECT_TRUE(contains(out,
                       "[rank 1/2] worker failed with an uncaught exception: the data file "
                       "shard-7 is corrupt"))
      << out;
  EXPECT_TRUE(contains(out, "Its error:\n  | the data file shard-7 is corrupt")) << out;
  EXPECT_FALSE(contains(out, "terminate called")) << out;
  EXPECT_FALSE(contains(out, "launch returned on rank 1")) << out;
}

// Issue 22: ranks in different collectives end at the timeout with one table of every rank's last
// collective and a verdict naming both calls, read from the workers' flight record files.
TEST(Launch, RanksInDifferentCollectivesAreShownInOneTable) {
  ::setenv("ACCELERANT_TIMEOUT_MS", "3000", 1);
  std::string out;
  const int status =
      run({"-n", "2", "--main_process_port", "0", launch_helper_path(), "skip"}, out);
  ::unsetenv("ACCELERANT_TIMEOUT_MS");
  EXPECT_EQ(status, 1) << out;
  EXPECT_NE(out.find("Last collective of each rank (their flight records):"), std::string::npos)
      << out;
  EXPECT_NE(out.find("Verdict: rank 0 is in all_reduce #1 (reduce) while rank 1 is in barrier #1 "
                     "(wait_for_everyone): the ranks issue different collectives."),
            std::string::npos)
      << out;
}

TEST(Launch, AKilledWorkerIsRestartedAndTheRunCompletes) {
  std::string out;
  ASSERT_EQ(
      run({"-n", "2", "--main_process_port", "0", "--max_restarts", "1", "/bin/sh", "-c",
           "if [ \"$ACCELERANT_RESTART_COUNT\" = 0 ] && [ \"$RANK\" = 1 ]; then kill -9 $$; fi; "
           "echo \"done rank $RANK restart $ACCELERANT_RESTART_COUNT\""},
          out),
      0)
      << out;
  EXPECT_NE(out.find("done rank 0 restart 1"), std::string::npos) << out;
  EXPECT_NE(out.find("done rank 1 restart 1"), std::string::npos) << out;
  EXPECT_NE(out.find("signal 9"), std::string::npos) << "the restart should say why: " << out;
}

// --recovery replace_failed_worker: only the killed worker is started again, as generation 1,
// told that it joins a running group; the other one is not restarted, regroups with it, and what
// it prints after the replacement started still reaches the console.
TEST(Launch, RecoveryReplaceFailedWorkerStartsOnlyTheKilledWorkerAgain) {
  std::string out;
  ASSERT_EQ(run({"-n", "2", "--main_process_port", "0", "--max_restarts", "1", "--recovery",
                 "replace_failed_worker", launch_helper_path(), "replaced"},
                out),
            0)
      << out;
  EXPECT_NE(out.find("done rank 0 generation 1 in place 1 joins 0 sum 3"), std::string::npos)
      << out;
  EXPECT_NE(out.find("done rank 1 generation 1 in place 1 joins 1 sum 3"), std::string::npos)
      << out;
  EXPECT_NE(out.find("starting a replacement in its place"), std::string::npos) << out;
}

TEST(Launch, ARecoveryTheLauncherDoesNotKnowIsRefusedNamingTheChoices) {
  std::string out;
  EXPECT_NE(run({"-n", "2", "--recovery", "in_place", "/bin/true"}, out), 0);
  EXPECT_NE(out.find("restart_group or replace_failed_worker"), std::string::npos) << out;
}

TEST(Launch, SigintStopsEveryWorkerAndLeavesNoProcess) {
  ScratchDir dir;
  ::setenv("XDG_CACHE_HOME", "/nonexistent/accelerant-test-cache", 1);
  auto program =
      start_program({cli_path(), "launch", "-n", "2", "--main_process_port", "0", "/bin/sh", "-c",
                     "echo $$ > " + dir.path + "/pid.$RANK; exec sleep 60"});
  std::vector<pid_t> workers;
  for (int i = 0; i < 100 && workers.size() < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    workers = read_pid_files(dir.path);
  }
  ASSERT_EQ(workers.size(), 2u);
  ::kill(program.pid, SIGINT);
  std::string out;
  finish_program(program, out, std::chrono::seconds(20));
  EXPECT_TRUE(wait_until_dead(workers, std::chrono::seconds(10)).empty())
      << "orphaned workers; output:\n"
      << out;
}

TEST(Launch, TheConfigFileIsReadAndFlagsOverrideIt) {
  ScratchDir dir;
  const std::string config = dir.path + "/c.yaml";
  std::ofstream(config) << "world_size: 3\nmaster_port: 0\n";
  std::string out;
  ASSERT_EQ(
      run({"--config_file", config, "/bin/sh", "-c", "echo \"rank $RANK of $WORLD_SIZE\""}, out), 0)
      << out;
  EXPECT_EQ(count(out, "of 3"), 3) << out;
  ASSERT_EQ(run({"--config_file", config, "-n", "2", "/bin/sh", "-c",
                 "echo \"rank $RANK of $WORLD_SIZE\""},
                out),
            0)
      << out;
  EXPECT_EQ(count(out, "of 2"), 2) << out;
}

// The launcher hands the Accelerator settings to its workers through the launch contract: the
// worker reads no config file of its own here, so only the launcher can have told it.
TEST(Launch, AcceleratorSettingsFromTheConfigAndFlagsReachTheWorkers) {
  ScratchDir dir;
  const std::string config = dir.path + "/c.yaml";
  std::ofstream(config)
      << "num_processes: 2\nmain_process_port: 0\ngradient_accumulation_steps: 3\n"
         "mixed_precision: bf16\ndowncast_bf16: true\n";
  std::string out;
  ASSERT_EQ(run({"--config_file", config, launch_helper_path(), "settings"}, out), 0) << out;
  for (const char* rank : {"0", "1"}) {
    const std::string line = std::string("settings rank=") + rank +
                             " gradient_accumulation_steps=3 cpu=0 downcast_bf16=1";
    EXPECT_NE(out.find(line), std::string::npos) << "missing '" << line << "' in:\n" << out;
  }
  ASSERT_EQ(run({"--config_file", config, "--gradient_accumulation_steps", "5", "--cpu",
                 launch_helper_path(), "settings"},
                out),
            0)
      << out;
  EXPECT_EQ(count(out, "gradient_accumulation_steps=5 cpu=1 downcast_bf16=1"), 2) << out;
}

TEST(Launch, BadInputIsRefusedBeforeAnyWorkerStarts) {
  ScratchDir dir;
  std::string out;
  EXPECT_EQ(run({"-n", "2", dir.path + "/no_such_program"}, out), 1);
  EXPECT_NE(out.find("cannot run"), std::string::npos) << out;
  EXPECT_EQ(out.find("Launching"), std::string::npos) << "workers were started: " << out;
  const std::string config = dir.path + "/bad.yaml";
  std::ofstream(config) << "num_procesess: 2\n";
  EXPECT_EQ(run({"--config_file", config, "/bin/true"}, out), 1);
  EXPECT_NE(out.find("did you mean 'num_processes'"), std::string::npos) << out;
  EXPECT_EQ(run({"-n", "0", "/bin/true"}, out), 1);
  EXPECT_NE(out.find("world_size is 0"), std::string::npos) << out;
  // A script whose interpreter is missing: execve says ENOENT, which read "No such file" about a
  // script that is there (issue 38). The interpreter is named instead.
  const std::string script = dir.path + "/train.py";
  std::ofstream(script) << "#!/usr/bin/no-such-python3 -u\nprint('hi')\n";
  ASSERT_EQ(::chmod(script.c_str(), 0755), 0);
  EXPECT_EQ(run({"-n", "2", script}, out), 1);
  EXPECT_NE(out.find("its interpreter /usr/bin/no-such-python3 (its #! line) does not exist"),
            std::string::npos)
      << out;
  EXPECT_EQ(out.find("Launching"), std::string::npos) << "workers were started: " << out;
}

namespace {

// What a launch did, to compare two launches: the exit status, the workers' settings (one line
// each, sorted: the workers print in any order), and the whole output when it failed.
std::string launch_outcome(std::vector<std::string> args) {
  const std::string vars =
      "echo \"vars ws=$WORLD_SIZE lws=$LOCAL_WORLD_SIZE node=$GROUP_RANK addr=$MASTER_ADDR "
      "port=$MASTER_PORT cpu=$ACCELERANT_USE_CPU debug=$ACCELERANT_DEBUG_MODE\"";
  args.insert(args.end(), {"/bin/sh", "-c", vars});
  std::string out;
  const int rc = run(args, out);
  std::vector<std::string> lines;
  std::istringstream text(out);
  for (std::string line; std::getline(text, line);)
    if (line.find("vars ") != std::string::npos) lines.push_back(line.substr(line.find("vars ")));
  std::sort(lines.begin(), lines.end());
  std::string outcome = "rc=" + std::to_string(rc) + "\n";
  for (const auto& line : lines) outcome += line + "\n";
  return rc == 0 ? outcome : outcome + out;
}

}  // namespace

// Every alias in the one table (docs/names.md) is a flag that launches exactly as its one name
// does, and the one name changes the launch (so that an alias that did nothing would show).
TEST(Launch, EveryFlagAliasLaunchesAsItsOneName) {
  const std::string port = std::to_string(free_port());
  struct Case {
    std::string value;               // "" for a flag without a value
    std::vector<std::string> extra;  // the rest of the command line
  };
  // A fixed port, so that two launches print the same MASTER_PORT. Where the value cannot show in
  // a worker's variables (one machine), it shows in the error that refuses it.
  const std::map<std::string, Case> cases = {
      {"world_size", {"3", {"--master_port", port}}},
      {"processes_per_node", {"2", {"--master_port", port}}},
      {"num_nodes", {"3", {"-n", "2"}}},  // refused: 2 processes over 3 machines
      {"node_rank", {"1", {"-n", "2"}}},  // refused: outside one machine
      {"master_addr", {"no-such-host.invalid", {"-n", "1"}}},  // refused: does not resolve
      {"master_port", {port, {"-n", "2"}}},
      {"cpu", {"", {"-n", "2", "--master_port", port}}},
      {"debug", {"", {"-n", "2", "--master_port", port}}},
  };
  for (const auto& a : accelerant::key_aliases()) {
    const auto found = cases.find(a.name);
    ASSERT_NE(found, cases.end()) << "add a case for " << a.name << " (alias " << a.alias << ")";
    const Case& c = found->second;
    auto with = [&](const std::string& flag) {
      std::vector<std::string> args{flag};
      if (!c.value.empty()) args.push_back(c.value);
      args.insert(args.end(), c.extra.begin(), c.extra.end());
      return launch_outcome(args);
    };
    const std::string by_name = with(std::string("--") + a.name);
    EXPECT_NE(by_name, launch_outcome(c.extra)) << "--" << a.name << " changed nothing";
    if (a.name == std::string("master_port")) {
      EXPECT_NE(by_name.find("port=" + port), std::string::npos) << by_name;
    }
    EXPECT_EQ(with(std::string("--") + a.alias), by_name) << "--" << a.alias;
  }
}

namespace {

// The losses the progress bar printed ("<step>:<loss>") at every tenth of an epoch, and the final
// accuracy: what identical training runs share exactly. Other steps are left out: the bar also
// prints on time (a line every 30 s, a redraw every 0.1 s on a terminal, as under mpirun), which
// varies from run to run. With `at_steps`, only those steps are kept.
std::vector<std::string> training_trace(const std::string& output,
                                        const std::set<std::string>& at_steps = {}) {
  std::vector<std::string> trace;
  std::smatch m;
  const std::regex loss("([0-9]+)/([0-9]+)  [^\\r\\n]*loss ([0-9]+\\.[0-9]{4})");
  for (auto it = std::sregex_iterator(output.begin(), output.end(), loss);
       it != std::sregex_iterator(); ++it) {
    const int64_t done = std::stoll((*it)[1].str()), total = std::stoll((*it)[2].str());
    const int64_t tenth = std::max<int64_t>(1, std::llround(static_cast<double>(total) / 10));
    if (done % tenth != 0 && done != total) continue;
    const std::string step = (*it)[1].str(), entry = step + ":" + (*it)[3].str();
    const bool wanted = at_steps.empty() || at_steps.count(step) > 0;
    if (wanted && (trace.empty() || trace.back() != entry)) trace.push_back(entry);
  }
  const std::regex accuracy("test accuracy ([0-9]+\\.[0-9]+)%");
  if (std::regex_search(output, m, accuracy)) trace.push_back("accuracy " + m[1].str());
  return trace;
}

// The steps of a trace's loss entries.
std::set<std::string> steps_of(const std::vector<std::string>& trace) {
  std::set<std::string> steps;
  for (const auto& entry : trace) {
    if (entry.find(':') != std::string::npos) steps.insert(entry.substr(0, entry.find(':')));
  }
  return steps;
}

}  // namespace

TEST(Launch, TheExampleTrainsIdenticallyUnderTorchrun) {
  std::string probe;
  auto check = start_program({"/usr/bin/python3", "-c", "import torch.distributed.run"});
  if (finish_program(check, probe, std::chrono::seconds(60)) != 0) {
    GTEST_SKIP() << "Debian's python3-torch is not importable by /usr/bin/python3: " << probe;
  }
  const std::string example = cli_path().substr(0, cli_path().rfind('/')) + "/fashion_mnist";
  std::string ours, theirs;
  ASSERT_EQ(run({"-n", "2", "--main_process_port", "0", example, "--epochs", "1"}, ours), 0)
      << ours;
  auto torchrun_command = torchrun_argv(2);
  for (const std::string arg : {example, std::string("--epochs"), std::string("1")}) {
    torchrun_command.push_back(arg);
  }
  auto torchrun = start_program(torchrun_command);
  ASSERT_EQ(finish_program(torchrun, theirs, std::chrono::seconds(120)), 0) << theirs;
  const auto expected = training_trace(ours);
  ASSERT_GE(expected.size(), 5u) << ours;
  EXPECT_EQ(training_trace(theirs), expected) << "accelerant launch:\n"
                                              << ours << "\ntorchrun:\n"
                                              << theirs;
}

// Open MPI's mpirun starts the same binary with only its OMPI_COMM_WORLD_* variables; on one
// machine the ranks meet on loopback without MASTER_ADDR (docs/process_state.md).
TEST(Launch, TheExampleTrainsIdenticallyUnderMpirun) {
  if (::access("/usr/bin/mpirun", X_OK) != 0) {
    GTEST_SKIP()
        << "Open MPI's mpirun is not installed (Debian's openmpi-bin, in scripts/install-deps)";
  }
  const std::string example = cli_path().substr(0, cli_path().rfind('/')) + "/fashion_mnist";
  std::string ours, theirs;
  ASSERT_EQ(run({"-n", "2", "--main_process_port", "0", example, "--epochs", "1"}, ours), 0)
      << ours;
  // --allow-run-as-root: CI may run as root, which mpirun refuses by default.
  auto mpirun =
      start_program({"/usr/bin/mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2", "-x",
                     "MASTER_PORT=" + std::to_string(free_port()), example, "--epochs", "1"});
  ASSERT_EQ(finish_program(mpirun, theirs, std::chrono::seconds(120)), 0) << theirs;
  const auto expected = training_trace(ours);
  ASSERT_GE(expected.size(), 5u) << ours;
  EXPECT_EQ(training_trace(theirs, steps_of(expected)), expected)
      << "accelerant launch:\n"
      << ours << "\nmpirun (last 3000 bytes):\n"
      << theirs.substr(theirs.size() - std::min<size_t>(theirs.size(), 3000));
}

// A log that stops taking writes (a full disk: /dev/full answers ENOSPC to every write) is said
// once per stream, and the output goes to the console instead of being lost (issue 38).
TEST(Launch, ALogDirThatFillsUpSaysSoAndTheOutputReachesTheConsole) {
  ScratchDir dir;
  ASSERT_EQ(::mkdir((dir.path + "/attempt_0").c_str(), 0755), 0);
  for (const char* rank : {"0", "1"}) {
    const std::string log = dir.path + "/attempt_0/rank_" + rank + ".stdout";
    ASSERT_EQ(::symlink("/dev/full", log.c_str()), 0);
  }
  std::string out;
  ASSERT_EQ(run({"-n", "2", "--log_dir", dir.path, "/bin/sh", "-c",
                 "for i in 1 2 3; do echo \"line $i of rank $RANK\"; done"},
                out),
            0)
      << out;
  for (const char* rank : {"0", "1"}) {
    EXPECT_EQ(count(out, std::string("cannot write rank ") + rank + "'s stdout to its log in"), 1)
        << out;
    for (const char* i : {"1", "2", "3"}) {
      EXPECT_EQ(count(out, std::string("line ") + i + " of rank " + rank), 1) << out;
    }
  }
  EXPECT_TRUE(contains(out, "No space left on device")) << out;
}

// --prefix_output adds each rank's prefix once: a line the worker already prefixed (as the
// library's messages are) is not prefixed again (issue 38).
TEST(Launch, PrefixOutputAddsTheRankPrefixOnce) {
  std::string out;
  ASSERT_EQ(run({"-n", "2", "--prefix_output", "/bin/sh", "-c",
                 "echo \"[rank $RANK/2] said by the worker\"; echo plain"},
                out),
            0)
      << out;
  EXPECT_EQ(count(out, "[rank 0/2] said by the worker"), 1) << out;
  EXPECT_EQ(count(out, "[rank 1/2] [rank 1/2]"), 0) << out;
  EXPECT_EQ(count(out, "[rank 1/2] plain"), 1) << out;
}

TEST(SelfTest, PassesEveryCheckOnTwoProcesses) {
  ::unsetenv("ACCELERANT_CONFIG_FILE");
  ::setenv("XDG_CACHE_HOME", "/nonexistent/accelerant-test-cache", 1);
  auto program = start_program({cli_path(), "test", "-n", "2"});
  std::string out;
  const int status = finish_program(program, out, std::chrono::seconds(60));
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << out;
  EXPECT_EQ(count(out, "] PASS "), 10) << out;  // five checks on each of the two ranks
  EXPECT_NE(out.find("[rank 0/2] all-reduce path: shared memory (2 ranks)"), std::string::npos)
      << out;
  EXPECT_EQ(count(out, "FAIL"), 0) << out;
  EXPECT_NE(out.find("accelerant test: all checks passed on 2 processes"), std::string::npos)
      << out;
}

TEST(Launch, LogDirKeepsEachRanksOutputPerAttemptAndTeeAlsoShowsIt) {
  ScratchDir dir;
  const std::string logs = dir.path + "/logs";
  std::string out;
  ASSERT_EQ(run({"-n", "2", "--main_process_port", "0", "--max_restarts", "1", "--log_dir", logs,
                 "/bin/sh", "-c",
                 "echo \"out $RANK\"; echo \"err $RANK\" >&2; "
                 "[ \"$ACCELERANT_RESTART_COUNT\" = 0 ] && [ \"$RANK\" = 1 ] && exit 4; true"},
                out),
            0)
      << out;
  std::ifstream first(logs + "/attempt_0/rank_1.stderr"), second(logs + "/attempt_1/rank_0.stdout");
  std::string line;
  ASSERT_TRUE(std::getline(first, line));
  EXPECT_EQ(line, "err 1");
  ASSERT_TRUE(std::getline(second, line));
  EXPECT_EQ(line, "out 0");
  EXPECT_EQ(out.find("out 0"), std::string::npos)
      << "without --tee the console should not repeat the logs: " << out;
  EXPECT_NE(out.find("err 1"), std::string::npos)
      << "the failure report keeps the stderr tail: " << out;
  ASSERT_EQ(run({"-n", "2", "--main_process_port", "0", "--log_dir", logs, "--tee", "/bin/sh", "-c",
                 "echo \"tee $RANK\""},
                out),
            0);
  EXPECT_NE(out.find("tee 1"), std::string::npos) << out;
}

// The collective timeout reaches the workers: the user's ACCELERANT_TIMEOUT_MS (it used to be
// overwritten by the launcher's 30-minute default), --collective_timeout over it, and the config
// file's collective_timeout under both.
TEST(Launch, TheUsersTimeoutReachesTheWorkersAndTheFlagWinsOverIt) {
  ScratchDir dir;
  const std::string config = dir.path + "/config.yaml";
  std::ofstream(config) << "collective_timeout: 42\n";
  const std::vector<std::string> echo = {"/bin/sh", "-c", "echo timeout=$ACCELERANT_TIMEOUT_MS"};
  auto with = [&](std::vector<std::string> flags) {
    flags.insert(flags.end(), echo.begin(), echo.end());
    std::string out;
    EXPECT_EQ(run(flags, out), 0) << out;
    return out;
  };
  EXPECT_EQ(count(with({"-n", "2"}), "timeout=1800000"), 2);
  EXPECT_EQ(count(with({"-n", "2", "--config_file", config}), "timeout=42000"), 2);
  ::setenv("ACCELERANT_TIMEOUT_MS", "5000", 1);
  EXPECT_EQ(count(with({"-n", "2", "--config_file", config}), "timeout=5000"), 2);
  EXPECT_EQ(count(with({"-n", "2", "--collective_timeout", "7"}), "timeout=7000"), 2);
  ::unsetenv("ACCELERANT_TIMEOUT_MS");
}

// A stopped rank (SIGSTOP) cannot say anything: the other rank's collective times out after the
// user's 3 s, the launcher ends the group (SIGCONT with its SIGTERM, so the stopped one goes too)
// and names the failure, well within 10 s instead of the default 30 minutes.
TEST(Launch, AStoppedRankFailsTheJobWithinTheUsersTimeout) {
  ::setenv("ACCELERANT_TIMEOUT_MS", "3000", 1);
  const auto start = std::chrono::steady_clock::now();
  std::string out;
  const int code = run({"-n", "2", launch_helper_path(), "stop"}, out);
  const auto took = std::chrono::steady_clock::now() - start;
  ::unsetenv("ACCELERANT_TIMEOUT_MS");
  EXPECT_EQ(code, 1) << out;
  EXPECT_LT(took, std::chrono::seconds(10)) << out;
  EXPECT_TRUE(contains(out, "worker rank 0")) << out;
  EXPECT_TRUE(contains(out, "rank 1")) << out;  // the rank it waited for
}

// torchrun's @record contract: the C++ exception's text reaches torchrun's failure summary through
// TORCHELASTIC_ERROR_FILE (instead of "To enable traceback see: ...").
TEST(Launch, TorchrunsFailureSummaryQuotesTheWorkersException) {
  std::string probe;
  auto check = start_program({"/usr/bin/python3", "-c", "import torch.distributed.run"});
  if (finish_program(check, probe, std::chrono::seconds(60)) != 0) {
    GTEST_SKIP() << "Debian's python3-torch is not importable by /usr/bin/python3: " << probe;
  }
  auto torchrun_command = torchrun_argv(2);
  torchrun_command.push_back(launch_helper_path());
  torchrun_command.push_back("throw");
  auto torchrun = start_program(torchrun_command);
  std::string out;
  EXPECT_NE(finish_program(torchrun, out, std::chrono::seconds(120)), 0) << out;
  EXPECT_TRUE(std::regex_search(out, std::regex("traceback *: the data file shard-7 is corrupt")))
      << out;
}
