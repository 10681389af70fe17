// Collectives that go wrong must fail fast and say why: mismatched shapes in debug mode, a rank
// that never arrives (named, within twice the timeout), a rank that died (said to have died, not
// to have skipped the call), a rank missing at the rendezvous.
#include <accelerant/accelerant.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <csignal>
#include <fstream>
#include <iterator>
#include <thread>

#include "test_support.h"

using namespace accelerant;
using accelerant::testing::contains;
using Clock = std::chrono::steady_clock;

TEST(CollectiveFailures, DebugModeMismatchListsEveryRanksShape) {
  auto messages = launch(
      [](int index) -> std::string {
        auto& comm = ProcessState::get().communicator();
        comm.all_reduce(torch::ones({2}));  // agreeing call first: sequence numbers line up
        try {
          comm.all_reduce(torch::ones({4 + index}));
          return "no error";
        } catch (const CollectiveMismatchError& e) {
          return e.what();
        }
      },
      LaunchOptions()
          .processes_per_node(2)
          .debug(true)
          .collective_timeout(std::chrono::seconds(20))
          .verbose(false));
  for (const auto& m : messages) {
    EXPECT_TRUE(contains(m, "disagree about collective #2")) << m;
    EXPECT_TRUE(contains(m, "rank 0: all_reduce(sum) Float [4]")) << m;
    EXPECT_TRUE(contains(m, "rank 1: all_reduce(sum) Float [5]")) << m;
    EXPECT_TRUE(contains(m, "Fix:")) << m;
  }
}

TEST(CollectiveFailures, GatherWithDifferentTrailingDimsIsAnErrorEvenWithoutDebugMode) {
  auto messages = launch(
      [](int index) -> std::string {
        try {
          ProcessState::get().communicator().gather(torch::ones({2, 3 + index}));
          return "no error";
        } catch (const CollectiveMismatchError& e) {
          return e.what();
        }
      },
      LaunchOptions()
          .processes_per_node(2)
          .collective_timeout(std::chrono::seconds(20))
          .verbose(false));
  for (const auto& m : messages) {
    EXPECT_TRUE(contains(m, "rank 0: Float [2, 3]")) << m;
    EXPECT_TRUE(contains(m, "rank 1: Float [2, 4]")) << m;
  }
}

TEST(CollectiveFailures, ARankThatNeverArrivesIsNamedWithinTwiceTheTimeout) {
  constexpr auto kTimeout = std::chrono::milliseconds(1500);
  constexpr int kSleeper = 2;
  auto results = launch(
      [&](int index) -> std::string {
        auto& comm = ProcessState::get().communicator();
        comm.barrier();
        if (index == kSleeper) {  // never joins the all_reduce below
          std::this_thread::sleep_for(kTimeout * 3);
          return "slept";
        }
        const auto start = Clock::now();
        try {
          comm.all_reduce(torch::ones({8}));
          return "no error";
        } catch (const CollectiveError& e) {
          const auto waited =
              std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
          std::string missing;
          for (int r : e.missing_ranks()) missing += std::to_string(r) + ",";
          // Later calls are refused at once: the group is broken.
          std::string refused;
          try {
            comm.barrier();
          } catch (const CollectiveError& again) {
            refused = again.what();
          }
          return std::to_string(waited.count()) + "|" + missing + "|" + e.what() + "|" + refused;
        }
      },
      LaunchOptions().processes_per_node(3).collective_timeout(kTimeout).verbose(false));
  ASSERT_EQ(results.size(), 3u);
  EXPECT_EQ(results[kSleeper], "slept");
  for (int r : {0, 1}) {
    const std::string& m = results[r];
    SCOPED_TRACE(m);
    const long waited = std::stol(m.substr(0, m.find('|')));
    EXPECT_LT(waited, 2 * kTimeout.count());
    EXPECT_GE(waited, kTimeout.count() / 2);
    EXPECT_TRUE(contains(m, "|2,|"));
    EXPECT_TRUE(contains(m, "Rank 2 did not reach this collective"));
    EXPECT_TRUE(contains(m, "[rank " + std::to_string(r) + "/3]"));
    EXPECT_TRUE(contains(m, "refused: this communicator broke earlier"));
  }
}

TEST(CollectiveFailures, DebugModeNamesARankThatNeverArrives) {
  auto results = launch(
      [](int index) -> std::string {
        auto& comm = ProcessState::get().communicator();
        if (index == 1) {
          std::this_thread::sleep_for(std::chrono::seconds(3));
          return "slept";
        }
        try {
          comm.all_reduce(torch::ones({1}));
          return "no error";
        } catch (const CollectiveError& e) {
          return e.what();
        }
      },
      LaunchOptions()
          .processes_per_node(2)
          .debug(true)
          .collective_timeout(std::chrono::seconds(1))
          .verbose(false));
  EXPECT_TRUE(contains(results[0], "Rank 1 never reached it")) << results[0];
}

TEST(CollectiveFailures, RendezvousNamesTheRanksThatNeverJoined) {
  auto results = launch(
      [](int index) -> std::string {
        if (index == 1) {
          std::this_thread::sleep_for(std::chrono::seconds(3));  // never initialises
          return "absent";
        }
        try {
          ProcessState::get();
          return "no error";
        } catch (const CollectiveError& e) {
          return e.what();
        }
      },
      LaunchOptions()
          .processes_per_node(2)
          .join_timeout(std::chrono::seconds(1))  // the join's own timeout, not the collectives'
          .verbose(false));
  EXPECT_TRUE(contains(results[0], "rank(s) 1 of 2 never arrived")) << results[0];
  EXPECT_TRUE(contains(results[0], "join timeout of 1 s")) << results[0];
}

TEST(CollectiveFailures, ARankThatDiedIsSaidToHaveDiedNotToHaveSkippedTheCall) {
  accelerant::testing::ScratchDir scratch;
  const std::string report = scratch.path + "/rank_0.txt";
  try {
    launch(
        [report](int index) {
          // Rank 0 keeps going when the launcher stops the group for rank 1's exit, long enough
          // (the stop grace period) to write down what its failed collective said.
          std::signal(SIGTERM, SIG_IGN);
          auto& comm = ProcessState::get().communicator();
          comm.barrier();
          if (index == 1) ::_exit(3);
          std::string message = "no error";
          try {
            comm.all_reduce(torch::ones({8}));
          } catch (const CollectiveError& e) {
            message = e.what();
          }
          std::ofstream(report) << message;
          ::_exit(0);  // said; not waiting at the end for the dead rank (the stop grace period)
        },
        LaunchOptions()
            .processes_per_node(2)
            .collective_timeout(std::chrono::milliseconds(1500))
            .stop_grace_period(std::chrono::seconds(10))
            .verbose(false));
    FAIL() << "rank 1 exited with 3, yet the launch succeeded";
  } catch (const LaunchError&) {
  }
  std::ifstream in(report);
  const std::string m((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_TRUE(contains(m, "[rank 0/2] all_reduce")) << m;
  EXPECT_TRUE(contains(m, "Rank 1 died: its process ")) << m;
  EXPECT_TRUE(contains(m, "not a mismatch of collectives")) << m;
  EXPECT_TRUE(contains(m, "rank_1.stderr")) << m;
  EXPECT_TRUE(contains(m, "--max_restarts")) << m;
  EXPECT_FALSE(contains(m, "make every rank call the same collectives")) << m;
}

// Issue 22: save_state called on the main process only. The ranks block in different collectives
// at the same sequence number; after the timeout each rank's error and the launcher's report name
// both collectives and the public calls that issued them, without debug mode, and the report has
// one table of every rank's last collective.
TEST(CollectiveFailures, RanksInDifferentCollectivesAreNamedWithTheCallsThatIssuedThem) {
  accelerant::testing::ScratchDir scratch;
  const std::string dir = scratch.path;
  constexpr auto kTimeout = std::chrono::milliseconds(3000);
  const auto start = Clock::now();
  std::string report;
  try {
    launch(
        [dir](int index) {
          Accelerator acc;
          torch::manual_seed(1);
          auto model = torch::nn::Linear(4, 2);
          torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
          auto [m, o] = acc.prepare(model, sgd);
          auto step = [&, &m = m, &o = o] {
            acc.backward(m->forward(torch::ones({3, 4})).sum());
            o.step();
            o.zero_grad();
          };
          step();
          if (acc.is_main_process()) acc.save_state(dir + "/checkpoint");  // the bug under test
          step();
          acc.end_training();
        },
        LaunchOptions().processes_per_node(2).collective_timeout(kTimeout).verbose(false));
    FAIL() << "only rank 0 saved, yet the launch succeeded";
  } catch (const LaunchError& e) {
    report = e.what();
  }
  const auto took = std::chrono::duration_cast<std::chrono::seconds>(Clock::now() - start);
  EXPECT_LT(took.count(), 30) << "bounded by the timeout, the grace period and the stop";
  EXPECT_TRUE(contains(report, "Last collective of each rank (their flight records):")) << report;
  EXPECT_TRUE(contains(report, "(save_state)")) << report;
  EXPECT_TRUE(contains(report, "all_reduce #")) << report;
  EXPECT_TRUE(contains(report, "(backward bucket 0)")) << report;
  EXPECT_TRUE(contains(report, "the ranks issue different collectives")) << report;
  // The worker's own error says it too (from the store, so also under other launchers).
  EXPECT_TRUE(contains(report,
                       "From the ranks' flight records, compared at the same sequence "
                       "number: rank 0 "))
      << report;
  EXPECT_FALSE(contains(report, "set GLOO_SOCKET_IFNAME")) << report;
}

// Issue 23: the sharded collectives are guarded as all_reduce is.
TEST(CollectiveFailures, DebugModeMismatchOfReduceScatterListsEveryRanksShapes) {
  auto messages = launch(
      [](int index) -> std::string {
        auto& comm = ProcessState::get().communicator();
        comm.reduce_scatter_(torch::ones({4}), torch::empty({2}));  // agreeing call first
        try {
          comm.reduce_scatter_(torch::ones({2 * (4 + index)}), torch::empty({4 + index}));
          return "no error";
        } catch (const CollectiveMismatchError& e) {
          return e.what();
        }
      },
      LaunchOptions()
          .processes_per_node(2)
          .debug(true)
          .collective_timeout(std::chrono::seconds(20))
          .verbose(false));
  for (const auto& m : messages) {
    EXPECT_TRUE(contains(m, "disagree about collective #2")) << m;
    EXPECT_TRUE(contains(m, "rank 0: reduce_scatter(sum) Float [8] -> [4]")) << m;
    EXPECT_TRUE(contains(m, "rank 1: reduce_scatter(sum) Float [10] -> [5]")) << m;
    EXPECT_TRUE(contains(m, "Fix:")) << m;
  }
}

// Rank 1 is killed (SIGKILL) inside a reduce_scatter of a tensor of many shared-memory steps;
// ranks 0 and 2, in the same reduce_scatter, fail fast naming it, on both transports, and refuse
// the next collective.
class RankKilledDuringReduceScatter : public ::testing::TestWithParam<bool> {};

TEST_P(RankKilledDuringReduceScatter, TheOthersFailFastNamingTheDeadRank) {
  accelerant::testing::ScratchDir scratch;
  const std::string dir = scratch.path;
  constexpr auto kTimeout = std::chrono::milliseconds(4000);
  ::setenv("ACCELERANT_SHM_ALLREDUCE", GetParam() ? "1" : "0", 1);
  const auto start = Clock::now();
  try {
    launch(
        [dir](int index) {
          std::signal(SIGTERM, SIG_IGN);  // the survivors write their reports (as above)
          auto& comm = ProcessState::get().communicator();
          comm.barrier();
          const int64_t shard = 1 << 21;  // 8 MB of float per shard: many steps
          auto input = torch::ones({3 * shard});
          auto output = torch::empty({shard});
          std::string message = "no error";
          const auto t0 = Clock::now();
          try {
            auto pending = comm.reduce_scatter_async_(input, output);
            if (index == 1) ::kill(::getpid(), SIGKILL);
            pending.wait();
          } catch (const CollectiveError& e) {
            message = e.what();
          }
          const auto waited =
              std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
          try {  // the group is broken: later calls are refused at once
            comm.all_gather_(output, input);
          } catch (const CollectiveError& e) {
            message += std::string("|") + e.what();
          }
          std::ofstream(dir + "/rank_" + std::to_string(index) + ".txt") << waited << "\n"
                                                                         << message;
          ::_exit(0);
        },
        LaunchOptions()
            .processes_per_node(3)
            .collective_timeout(kTimeout)
            .stop_grace_period(std::chrono::seconds(10))
            .verbose(false));
    ADD_FAILURE() << "rank 1 was killed, yet the launch succeeded";
  } catch (const LaunchError&) {
  }
  ::unsetenv("ACCELERANT_SHM_ALLREDUCE");
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(30)) << "no hang";
  for (int r : {0, 2}) {
    std::ifstream in(dir + "/rank_" + std::to_string(r) + ".txt");
    long waited = -1;
    in >> waited;
    const std::string m((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    SCOPED_TRACE("rank " + std::to_string(r) + ": " + m);
    ASSERT_GE(waited, 0) << "no report";
    EXPECT_LT(waited, 2 * kTimeout.count());
    EXPECT_TRUE(contains(m, "[rank " + std::to_string(r) + "/3] reduce_scatter"));
    EXPECT_TRUE(contains(m, "Rank 1 died: its process "));
    EXPECT_FALSE(contains(m, "make every rank call the same collectives"));
    EXPECT_TRUE(contains(m, "|[rank " + std::to_string(r) +
                                "/3] all_gather refused: this communicator broke earlier"));
  }
}

INSTANTIATE_TEST_SUITE_P(SharedMemoryAndGloo, RankKilledDuringReduceScatter, ::testing::Bool(),
                         [](const auto& info) {
                           return std::string(info.param ? "SharedMemory" : "Gloo");
                         });
