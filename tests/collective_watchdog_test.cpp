// The collective watchdog (issue 38): a hang in which no collective can complete is named within
// seconds at the default 30-minute timeout (ranks in different collectives, a rank that ended
// early), while a slow but matched collective, or a rank that computes while the others wait, is
// never reported; the join at start-up is held to the join timeout, not the collective timeout.
#include "comm/collective_watchdog.h"

#include <accelerant/accelerant.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <fstream>
#include <thread>

#include "test_support.h"

using namespace accelerant;
using accelerant::testing::contains;
using Clock = std::chrono::steady_clock;

namespace {

using accelerant::detail::CollectiveRecord;
using accelerant::detail::CollectiveState;
using accelerant::detail::WatchReport;
using accelerant::detail::WatchStatus;

WatchReport waiting(int rank, int64_t sequence, const std::string& op, int64_t elements = 4,
                    const std::string& api = "") {
  WatchReport r;
  r.rank = rank;
  r.status = WatchStatus::kWaiting;
  r.sequence = sequence;
  r.record.rank = rank;
  r.record.world_size = 2;
  for (int64_t s = 1; s < sequence; ++s) {
    r.record.collectives.push_back(
        {s, "all_reduce", "", "Float", 4, CollectiveState::kCompleted, 1, 2});
  }
  r.record.collectives.push_back(
      {sequence, op, api, "Float", elements, CollectiveState::kStarted, 3, 0});
  return r;
}

WatchReport ended(int rank, int64_t last) {
  WatchReport r;
  r.rank = rank;
  r.status = WatchStatus::kEnded;
  r.sequence = last;
  r.record.rank = rank;
  r.record.world_size = 2;
  for (int64_t s = 1; s <= last; ++s) {
    r.record.collectives.push_back(
        {s, "all_reduce", "", "Float", 4, CollectiveState::kCompleted, 1, 2});
  }
  return r;
}

WatchReport running(int rank) {
  WatchReport r;
  r.rank = rank;
  return r;
}

// Nanoseconds on the steady clock, which is the same for every process of this machine
// (CLOCK_MONOTONIC): a worker writes when it reached the hang, the test compares.
int64_t now_ns() { return Clock::now().time_since_epoch().count(); }

void write_arrival(const std::string& dir, int rank) {
  std::ofstream(dir + "/arrived_" + std::to_string(rank)) << now_ns();
}

// The latest arrival written by the ranks, on the steady clock.
Clock::time_point last_arrival(const std::string& dir, int ranks) {
  int64_t latest = 0;
  for (int r = 0; r < ranks; ++r) {
    int64_t t = 0;
    std::ifstream(dir + "/arrived_" + std::to_string(r)) >> t;
    latest = std::max(latest, t);
  }
  return Clock::time_point(Clock::duration(latest));
}

// Runs `body` on `ranks` processes at the default collective timeout (30 minutes) and returns the
// launch's error text, "" when it succeeded; `took_after_arrival` receives the time from the last
// rank's arrival (written by the body) to the launch's end.
std::string launch_expecting(int ranks, const std::function<void(int, const std::string&)>& body,
                             Clock::duration& took_after_arrival) {
  accelerant::testing::ScratchDir scratch;
  const std::string dir = scratch.path;
  std::string error;
  try {
    launch([&](int index) { body(index, dir); },
           LaunchOptions().processes_per_node(ranks).verbose(false));
  } catch (const LaunchError& e) {
    error = e.what();
  }
  took_after_arrival = Clock::now() - last_arrival(dir, ranks);
  return error;
}

}  // namespace

TEST(WatchReports, FormatAndParseRoundTrip) {
  WatchReport r = waiting(1, 7, "barrier", 0, "end_training");
  r.heartbeat = 12;
  WatchReport back;
  ASSERT_TRUE(
      accelerant::detail::parse_watch_report(accelerant::detail::format_watch_report(r), back));
  EXPECT_EQ(back.rank, 1);
  EXPECT_EQ(back.heartbeat, 12);
  EXPECT_EQ(back.status, WatchStatus::kWaiting);
  EXPECT_EQ(back.sequence, 7);
  ASSERT_EQ(back.record.collectives.size(), 7u);
  EXPECT_EQ(back.record.collectives.back().api, "end_training");
  EXPECT_FALSE(
      accelerant::detail::parse_watch_report("accelerant-watch 1\t1\t2\tdancing\t3\n", back));
  EXPECT_FALSE(accelerant::detail::parse_watch_report("not a report", back));
}

TEST(FindHang, RanksInTheSameCollectiveAreSlowNotHung) {
  EXPECT_FALSE(
      accelerant::detail::find_hang({waiting(0, 5, "all_reduce"), waiting(1, 5, "all_reduce")}));
  // gather's sizes differ between ranks by design
  EXPECT_FALSE(
      accelerant::detail::find_hang({waiting(0, 5, "gather", 3), waiting(1, 5, "gather", 9)}));
}

TEST(FindHang, ARankThatComputesOrNeverReportedStopsEveryVerdict) {
  EXPECT_FALSE(accelerant::detail::find_hang({waiting(0, 5, "all_reduce"), running(1)}));
  EXPECT_FALSE(accelerant::detail::find_hang({waiting(0, 5, "all_reduce"), std::nullopt}));
  EXPECT_FALSE(accelerant::detail::find_hang(
      {waiting(0, 5, "barrier"), waiting(1, 5, "all_reduce"), running(2)}));
}

TEST(FindHang, DifferentCollectivesAreNamedWithTheirCallers) {
  auto finding = accelerant::detail::find_hang({waiting(0, 5, "broadcast_bytes", 10, "save_state"),
                                                waiting(1, 5, "barrier", 0, "end_training")});
  ASSERT_TRUE(finding);
  EXPECT_FALSE(finding->ended);
  EXPECT_TRUE(contains(finding->summary, "rank 0 waits in broadcast_bytes #5 (save_state)"))
      << finding->summary;
  EXPECT_TRUE(contains(finding->summary, "rank 1 waits in barrier #5 (end_training)"))
      << finding->summary;
  // another sequence number, or another size where sizes must match
  EXPECT_TRUE(
      accelerant::detail::find_hang({waiting(0, 5, "all_reduce"), waiting(1, 6, "all_reduce")}));
  EXPECT_TRUE(accelerant::detail::find_hang(
      {waiting(0, 5, "all_reduce", 4), waiting(1, 5, "all_reduce", 8)}));
}

TEST(FindHang, ARankThatEndedBeforeTheCollectiveOthersWaitInIsNamed) {
  auto finding = accelerant::detail::find_hang({waiting(0, 3, "all_reduce"), ended(1, 2)});
  ASSERT_TRUE(finding);
  EXPECT_TRUE(finding->ended);
  EXPECT_TRUE(contains(finding->summary, "rank 1 ended its program")) << finding->summary;
  EXPECT_TRUE(contains(finding->summary, "after collective #2")) << finding->summary;
  WatchReport gone = ended(1, 2);
  gone.exited = true;
  finding = accelerant::detail::find_hang({waiting(0, 3, "all_reduce"), gone});
  ASSERT_TRUE(finding);
  EXPECT_TRUE(contains(finding->summary, "rank 1's process exited")) << finding->summary;
  // It ended after the collective: its part is in, the waiting rank's wait is a transient.
  EXPECT_FALSE(accelerant::detail::find_hang({waiting(0, 3, "all_reduce"), ended(1, 3)}));
}

TEST(FindHang, TheKeyChangesWithTheSituation) {
  const auto a =
      accelerant::detail::find_hang({waiting(0, 5, "all_reduce"), waiting(1, 6, "barrier")});
  const auto b =
      accelerant::detail::find_hang({waiting(0, 6, "all_reduce"), waiting(1, 7, "barrier")});
  ASSERT_TRUE(a && b);
  EXPECT_NE(a->key, b->key);
}

// save_state called on the main process only: the main process waits in save_state's collective,
// the other in end_training's barrier. Named within 10 s of the last arrival, at the default
// 30-minute timeout, with both calls.
TEST(CollectiveWatchdog, SaveStateOnTheMainProcessOnlyIsNamedInSeconds) {
  accelerant::testing::ScratchDir checkpoints;
  const std::string ckpt = checkpoints.path + "/ckpt";
  Clock::duration took{};
  const std::string error = launch_expecting(
      2,
      [&](int index, const std::string& dir) {
        Accelerator accelerator;
        auto model = accelerator.prepare(accelerant::testing::small_mlp());
        write_arrival(dir, index);
        if (accelerator.is_main_process()) accelerator.save_state(ckpt);
        accelerator.end_training();
      },
      took);
  ASSERT_FALSE(error.empty()) << "the launch should have failed";
  EXPECT_TRUE(contains(error, "Collective watchdog")) << error;
  EXPECT_TRUE(contains(error, "save_state")) << error;
  EXPECT_TRUE(contains(error, "end_training")) << error;
  EXPECT_TRUE(contains(error, "Fix:")) << error;
  EXPECT_LT(took, std::chrono::seconds(10)) << error;
}

// Ranks that ran different numbers of steps: rank 1 ends after two all-reduces, rank 0 waits in a
// third. Named, with the rank that ended, within 10 s.
TEST(CollectiveWatchdog, UnevenStepsAreNamedInSeconds) {
  Clock::duration took{};
  const std::string error = launch_expecting(
      2,
      [](int index, const std::string& dir) {
        auto& comm = ProcessState::get().communicator();
        const int steps = index == 0 ? 3 : 2;
        for (int step = 0; step < steps; ++step) {
          if (step == 2) write_arrival(dir, index);
          comm.all_reduce(torch::ones({4}));
        }
        if (index == 1) write_arrival(dir, index);
      },
      took);
  ASSERT_FALSE(error.empty()) << "the launch should have failed";
  EXPECT_TRUE(contains(error, "Collective watchdog")) << error;
  EXPECT_TRUE(contains(error, "rank 1 ended its program")) << error;
  EXPECT_TRUE(contains(error, "after collective #2")) << error;
  EXPECT_TRUE(contains(error, "different numbers of steps")) << error;
  EXPECT_LT(took, std::chrono::seconds(10)) << error;
}

// A collective that every rank enters, some late: rank 1 computes for 7 s while rank 0 waits in
// the all-reduce (and publishes it), then joins. Not reported; the job succeeds.
TEST(CollectiveWatchdog, ASlowButMatchedCollectiveIsNotReported) {
  Clock::duration took{};
  const std::string error = launch_expecting(
      2,
      [](int index, const std::string& dir) {
        auto& comm = ProcessState::get().communicator();
        comm.barrier();
        if (index == 1) std::this_thread::sleep_for(std::chrono::seconds(7));
        auto sum = comm.all_reduce(torch::ones({4}));
        if (sum[0].item<float>() != 2) throw Error("wrong sum");
        write_arrival(dir, index);
      },
      took);
  EXPECT_EQ(error, "");
}

// Eight processes sharing two cores, each rank in turn computing 3 s while the others wait in a
// matched all-reduce: the watchdogs see waiting ranks and one running, round after round, and
// never report.
TEST(CollectiveWatchdog, NoFalseReportOnEightProcessesSharingTwoCores) {
  Clock::duration took{};
  const std::string error = launch_expecting(
      8,
      [](int index, const std::string& dir) {
        auto& comm = ProcessState::get().communicator();
        for (int round = 0; round < 3; ++round) {
          if (index == (round * 3) % 8) std::this_thread::sleep_for(std::chrono::seconds(3));
          comm.all_reduce(torch::ones({1 << 16}));
        }
        write_arrival(dir, index);
      },
      took);
  EXPECT_EQ(error, "");
}

// Start-up is held to the join timeout: eight processes on two cores meet with a 1 s collective
// timeout (they were once called "never arrived").
TEST(CollectiveWatchdog, TheJoinIsNotHeldToTheCollectiveTimeout) {
  auto sums = launch(
      [](int) {
        return ProcessState::get().communicator().all_reduce(torch::ones({1})).item<float>();
      },
      LaunchOptions()
          .processes_per_node(8)
          .collective_timeout(std::chrono::seconds(1))
          .verbose(false));
  for (float s : sums) EXPECT_EQ(s, 8);
}

// Only rank 0 of two started by hand: it names the rank it waits for within seconds, and ends at
// the join timeout (8 s here), not the 30-minute collective timeout, saying what to do.
TEST(CollectiveWatchdog, ARankNeverStartedIsNamedAndTheJoinTimeoutEndsTheWait) {
  const std::string port = std::to_string(accelerant::testing::free_port());
  auto only = accelerant::testing::start_program(
      {"/usr/bin/env", "MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + port, "RANK=0", "WORLD_SIZE=2",
       "LOCAL_RANK=0", "LOCAL_WORLD_SIZE=2", "ACCELERANT_JOIN_TIMEOUT_MS=8000",
       accelerant::testing::launch_helper_path(), "worker"});
  const auto start = Clock::now();
  std::string out;
  const int status = accelerant::testing::finish_program(only, out, std::chrono::seconds(60));
  const auto took = Clock::now() - start;
  EXPECT_TRUE(status >= 0 && !(WIFEXITED(status) && WEXITSTATUS(status) == 0)) << out;
  EXPECT_TRUE(contains(out, "[rank 0/2] Waiting for rank(s) 1 of 2 to join")) << out;
  EXPECT_TRUE(contains(out, "rank(s) 1 of 2 never arrived")) << out;
  EXPECT_TRUE(contains(out, "join timeout of 8 s")) << out;
  EXPECT_LT(took, std::chrono::seconds(40)) << out;
}
