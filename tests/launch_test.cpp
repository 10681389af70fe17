// accelerant::launch: results come back, failures restart the group or are reported naming the
// rank, its exit code or signal and its error, and no worker outlives the launch.
#include <accelerant/accelerant.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <csignal>
#include <fstream>

#include "test_support.h"

using namespace accelerant;
using namespace accelerant::testing;

namespace {

LaunchOptions quiet(int n) {
  return LaunchOptions()
      .processes_per_node(n)
      .collective_timeout(std::chrono::seconds(30))
      .verbose(false);
}

using accelerant::testing::contains;

void record_pid(const std::string& dir, int index) {
  std::ofstream(dir + "/pid." + std::to_string(index) + "." + std::to_string(::getpid()))
      << ::getpid();
}

}  // namespace

TEST(Launch, FourWorkersReturnTheirResultsInRankOrder) {
  auto results = launch(
      [](int index, const std::string& greeting) {
        auto& state = ProcessState::get();
        return greeting + " " + std::to_string(index) + "/" + std::to_string(state.world_size()) +
               " local " + std::to_string(state.local_rank()) +
               (state.is_main_process() ? " main" : "");
      },
      std::string("hello"), quiet(4));
  ASSERT_EQ(results.size(), 4u);
  EXPECT_EQ(results[0], "hello 0/4 local 0 main");
  EXPECT_EQ(results[3], "hello 3/4 local 3");
}

TEST(Launch, FunctionWithoutIndexAndVoidResult) {
  int calls_in_parent = 0;
  launch([&calls_in_parent] { ++calls_in_parent; }, quiet(2));  // runs in the children only
  EXPECT_EQ(calls_in_parent, 0);
  // fn(int) with an int argument gets the argument; without arguments it gets the index.
  EXPECT_EQ(launch([](int x) { return 2 * x; }, 21, quiet(1)), std::vector<int>({42}));
  EXPECT_EQ(launch([](int x) { return 2 * x; }, quiet(2)), std::vector<int>({0, 2}));
  auto sums = launch([](const torch::Tensor& t) { return t.sum(); }, torch::ones({3}), quiet(2));
  EXPECT_EQ(sums[1].item<float>(), 3.0f);
}

TEST(Launch, WorkersSeeTheOptionsAndTheTorchrunContract) {
  auto results = launch(
      [](int) {
        auto& state = ProcessState::get();
        return std::string(std::getenv("RANK")) + "," + std::getenv("WORLD_SIZE") + "," +
               std::getenv("ACCELERANT_MIXED_PRECISION") + "," +
               to_string(state.env().mixed_precision.value_or(MixedPrecision::kNo)) + "," +
               (state.debug() ? "debug" : "nodebug") + "," + std::to_string(state.restart_count());
      },
      quiet(2).mixed_precision(MixedPrecision::kBf16).debug(true));
  EXPECT_EQ(results[1], "1,2,bf16,bf16,debug,0");
}

TEST(Launch, SigkilledWorkerRestartsTheGroupWhichThenFinishes) {
  const std::string dir = make_temp_dir();
  auto results = launch(
      [&dir](int index) {
        record_pid(dir, index);
        auto& state = ProcessState::get();
        if (state.restart_count() == 0 && index == 1) ::raise(SIGKILL);
        auto total = state.communicator().all_reduce(torch::ones({1}));
        return std::to_string(state.restart_count()) + ":" + std::to_string(total.item<int>());
      },
      quiet(2).max_restarts(1));
  EXPECT_EQ(results, std::vector<std::string>({"1:2", "1:2"}));
  auto pids = read_pid_files(dir);
  EXPECT_EQ(pids.size(), 4u);  // two attempts of two workers
  EXPECT_TRUE(wait_until_dead(pids, std::chrono::milliseconds(0)).empty());
  remove_tree(dir);
}

// Recovery::kReplaceFailedWorker: a worker SIGKILLed in the middle of a run of all-reduces is
// replaced alone; the others are not restarted (their pids do not change), they regroup with the
// replacement as generation 1, hand it the step by broadcast, and every step's sum is right.
void replaced_in_place(int processes, int victim) {
  const std::string dir = make_temp_dir();
  const auto start = std::chrono::steady_clock::now();
  auto results = launch(
      [&dir, victim](int index) {
        record_pid(dir, index);
        auto& state = ProcessState::get();
        Communicator& comm = state.communicator();
        const int n = state.world_size();
        const int64_t first_pid = ::getpid();
        int64_t step = 0;
        int64_t right = 0;
        if (state.restart_count() > 0) step = comm.broadcast_value(step, (victim + 1) % n);
        while (step < 6) {
          if (state.restart_count() == 0 && index == victim && step == 3) ::raise(SIGKILL);
          try {
            const auto sum = comm.all_reduce(torch::full({1}, index + 1.0));
            right += sum.item<double>() == n * (n + 1) / 2.0 ? 1 : 0;
            ++step;
          } catch (const CollectiveError& e) {
            // A process died: the step is done again with its replacement, which learns the step
            // from the lowest-numbered process after the victim (a survivor).
            state.regroup();
            step = comm.broadcast_value(step, (victim + 1) % n);
          }
        }
        return torch::tensor({first_pid, static_cast<int64_t>(::getpid()),
                              static_cast<int64_t>(state.restart_count()), right});
      },
      quiet(processes)
          .collective_timeout(std::chrono::seconds(4))
          .max_restarts(1)
          .recovery(Recovery::kReplaceFailedWorker));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  auto pids = read_pid_files(dir);
  EXPECT_EQ(pids.size(), static_cast<size_t>(processes + 1)) << "each worker once, one replacement";
  for (int r = 0; r < processes; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    EXPECT_EQ(results[r][2].item<int64_t>(), 1) << "generation 1";
    // Each survivor did 6 right steps; the replacement the 3 left after it joined.
    EXPECT_EQ(results[r][3].item<int64_t>(), r == victim ? 3 : 6);
  }
  EXPECT_TRUE(wait_until_dead(pids, std::chrono::milliseconds(0)).empty()) << "orphan workers";
  EXPECT_LT(seconds, 30.0) << "bounded";
  remove_tree(dir);
}

TEST(Launch, AFailedWorkerIsReplacedInPlaceAndTheOthersRegroupWithItOnTwoProcesses) {
  replaced_in_place(2, 1);
}

TEST(Launch, AFailedWorkerIsReplacedInPlaceAndTheOthersRegroupWithItOnFourProcesses) {
  replaced_in_place(4, 2);
}

// A replacement that dies before it joined (the survivors wait for it in the next generation)
// makes the launcher restart the whole group instead: no survivor waits for a generation that
// never forms.
TEST(Launch, AReplacementThatDiesBeforeJoiningRestartsTheWholeGroup) {
  const std::string dir = make_temp_dir();
  const auto start = std::chrono::steady_clock::now();
  auto results = launch(
      [&dir](int index) {
        record_pid(dir, index);
        // The replacement of generation 1 dies before it meets anyone.
        if (index == 1 && read_launch_contract().restart_count == 1) ::raise(SIGKILL);
        auto& state = ProcessState::get();
        if (state.restart_count() == 0) {
          state.communicator().all_reduce(torch::ones({1}));  // generation 0 formed
          if (index == 1) ::raise(SIGKILL);
          try {
            state.communicator().all_reduce(torch::ones({1}));
          } catch (const CollectiveError&) {
            state.regroup();  // waits for generation 1, which never forms: ended by the restart
          }
        }
        state.communicator().all_reduce(torch::ones({1}));
        return static_cast<int64_t>(state.restart_count());
      },
      quiet(2)
          .collective_timeout(std::chrono::seconds(4))
          .max_restarts(3)
          .recovery(Recovery::kReplaceFailedWorker));
  EXPECT_EQ(results, (std::vector<int64_t>{2, 2})) << "generation 2: the whole group restarted";
  const auto pids = read_pid_files(dir);
  EXPECT_EQ(pids.size(), 5u) << "2 workers, a replacement, then 2 again";
  EXPECT_TRUE(wait_until_dead(pids, std::chrono::milliseconds(0)).empty()) << "orphan workers";
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 30.0)
      << "bounded: nobody waited out the join timeout";
  remove_tree(dir);
}

// The same through Gloo alone (a peer's death is a broken connection there, not a dead pid).
TEST(Launch, AFailedWorkerIsReplacedInPlaceOverGloo) {
  ::setenv("ACCELERANT_SHM_ALLREDUCE", "0", 1);
  replaced_in_place(4, 0);
  ::unsetenv("ACCELERANT_SHM_ALLREDUCE");
}

TEST(Launch, WithoutRestartsASigkilledWorkerIsReportedByRankAndSignal) {
  const std::string dir = make_temp_dir();
  try {
    launch(
        [&dir](int index) {
          record_pid(dir, index);
          ProcessState::get();
          if (index == 1) {
            std::fprintf(stderr, "rank one was here\n");
            ::raise(SIGKILL);
          }
          std::this_thread::sleep_for(std::chrono::seconds(60));  // must be stopped by the agent
        },
        quiet(2).stop_grace_period(std::chrono::milliseconds(500)));
    FAIL() << "launch should have thrown";
  } catch (const LaunchError& e) {
    const std::string m = e.what();
    EXPECT_EQ(e.first_failure().rank, 1) << m;
    EXPECT_EQ(e.first_failure().signal, SIGKILL) << m;
    EXPECT_TRUE(contains(m, "worker rank 1")) << m;
    EXPECT_TRUE(contains(m, "signal 9 (SIGKILL)")) << m;
    EXPECT_TRUE(contains(m, "rank one was here")) << m;
    EXPECT_TRUE(contains(m, "Fix:")) << m;
  }
  auto pids = read_pid_files(dir);
  EXPECT_EQ(pids.size(), 2u);
  EXPECT_TRUE(wait_until_dead(pids, std::chrono::milliseconds(0)).empty()) << "orphan workers";
  remove_tree(dir);
}

TEST(Launch, UncaughtExceptionTextAndExitCodeAreReported) {
  try {
    launch(
        [](int index) {
          if (index == 1) throw std::runtime_error("loss became NaN at step 7");
          return 0;
        },
        quiet(2));
    FAIL() << "launch should have thrown";
  } catch (const LaunchError& e) {
    EXPECT_EQ(e.first_failure().rank, 1);
    EXPECT_EQ(e.first_failure().exit_code, 1);
    EXPECT_EQ(e.first_failure().error_text, "loss became NaN at step 7");
    EXPECT_TRUE(contains(e.what(), "exit code 1")) << e.what();
    EXPECT_TRUE(contains(e.what(), "loss became NaN at step 7")) << e.what();
  }
  try {
    launch(
        [](int index) {
          if (index == 0) ::_exit(3);
        },
        quiet(2));
    FAIL() << "launch should have thrown";
  } catch (const LaunchError& e) {
    EXPECT_EQ(e.first_failure().rank, 0);
    EXPECT_EQ(e.first_failure().exit_code, 3);
    EXPECT_TRUE(contains(e.what(), "exit code 3")) << e.what();
  }
}

TEST(Launch, RestartsExhaustedReportsTheLastAttempt) {
  try {
    launch(
        [](int index) {
          if (index == 0) ::_exit(4);
        },
        quiet(2).max_restarts(2));
    FAIL() << "launch should have thrown";
  } catch (const LaunchError& e) {
    EXPECT_EQ(e.restarts_used(), 2);
    EXPECT_TRUE(contains(e.what(), "attempt 3 of 3")) << e.what();
  }
}

TEST(Launch, BadOptionsAreRefusedWithTheValueAndAFix) {
  struct Case {
    LaunchOptions options;
    std::string phrase;
  };
  const std::vector<Case> cases = {
      {quiet(0), "processes_per_node is 0"},
      {quiet(1).num_nodes(2).node_rank(2).master_port(29500), "node_rank 2 is outside 0..1"},
      {quiet(1).num_nodes(2), "master_port 0 (a free port) cannot be used with several machines"},
      {quiet(1).master_port(70000), "master_port 70000 is not a TCP port"},
      {quiet(1).max_restarts(-1), "max_restarts is -1"},
  };
  for (const auto& c : cases) {
    try {
      launch([] {}, c.options);
      ADD_FAILURE() << "accepted: " << c.phrase;
    } catch (const LaunchError& e) {
      EXPECT_TRUE(contains(e.what(), c.phrase)) << e.what();
      EXPECT_TRUE(contains(e.what(), "Fix:")) << e.what();
    }
  }
}

TEST(Launch, TwoLaunchesAsTwoNodesFormOneWorldOfFour) {
  std::string out0, out1;
  int status0 = -1, status1 = -1;
  // free_port() can race with another test taking the same port: try a few ports.
  for (int attempt = 0; attempt < 3 && (status0 != 0 || status1 != 0); ++attempt) {
    out0.clear();
    out1.clear();
    const std::string port = std::to_string(free_port());
    auto node0 = start_program({launch_helper_path(), "node", "0", port});
    auto node1 = start_program({launch_helper_path(), "node", "1", port});
    status0 = finish_program(node0, out0, std::chrono::seconds(60));
    status1 = finish_program(node1, out1, std::chrono::seconds(60));
    if (!contains(out0, "could not host")) break;  // only a taken port is worth another try
  }
  EXPECT_EQ(status0, 0) << out0;
  EXPECT_EQ(status1, 0) << out1;
  EXPECT_TRUE(contains(out0, "node 0 of 2, 4 processes in all")) << out0;
  EXPECT_TRUE(contains(out0, "rank=0 world=4 node=0 sum=6")) << out0;
  EXPECT_TRUE(contains(out0, "rank=1 world=4 node=0 sum=6")) << out0;
  EXPECT_TRUE(contains(out1, "rank=2 world=4 node=1 sum=6")) << out1;
  EXPECT_TRUE(contains(out1, "rank=3 world=4 node=1 sum=6")) << out1;
}

namespace {

// Sets launcher variables for one test and restores the environment afterwards.
class OuterLauncher {
 public:
  explicit OuterLauncher(std::vector<std::pair<std::string, std::string>> vars)
      : vars_(std::move(vars)) {
    for (const auto& [name, value] : vars_) ::setenv(name.c_str(), value.c_str(), 1);
  }
  ~OuterLauncher() {
    for (const auto& [name, value] : vars_) ::unsetenv(name.c_str());
  }

 private:
  std::vector<std::pair<std::string, std::string>> vars_;
};

}  // namespace

// Under srun, torchrun, mpirun or `accelerant launch`, launch is one rank of the outer job: it
// forks nothing, runs fn here with this process's rank and returns that one result.
TEST(LaunchInPlace, UnderAnOuterLauncherFnRunsInThisProcessAsItsRank) {
  OuterLauncher srun({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}});
  const pid_t here = ::getpid();
  auto results =
      launch([](int index) { return static_cast<int64_t>(::getpid()) * 10 + index; }, quiet(3));
  ASSERT_EQ(results.size(), 1u);
  EXPECT_EQ(results[0], static_cast<int64_t>(here) * 10);
}

// This process is the worker: what fn throws ends it as it would a forked worker (reported on
// stderr, exit status 1), and is written to torchrun's error file first.
TEST(LaunchInPlace, AThrowingFnEndsTheWorkerAndIsWrittenToTorchrunsErrorFile) {
  ScratchDir dir;
  const std::string error_file = dir.path + "/error.json";
  OuterLauncher torchrun(
      {{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"TORCHELASTIC_ERROR_FILE", error_file}});
  EXPECT_EXIT(
      launch([](int) -> int { throw std::runtime_error("shard 7 is \"corrupt\""); }, quiet(2)),
      ::testing::ExitedWithCode(1), "worker failed with an uncaught exception: shard 7 is");
  std::ifstream in(error_file);
  const std::string json((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // torchrun's summary shows "message" as the traceback when it is a string (error_handler.py).
  EXPECT_TRUE(contains(json, R"("message":"shard 7 is \"corrupt\"")")) << json;
  EXPECT_TRUE(contains(json, R"("timestamp":")")) << json;
}
