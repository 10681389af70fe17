// The flight records of collectives (docs/collectives.md "Ranks in different collectives"):
// the text they travel as, the verdict and the launcher's merged table, from hand-made records;
// the ring that keeps each rank's last collectives and the labels naming the calling API.
#include "comm/flight_record.h"

#include <gtest/gtest.h>

#include <csignal>

#include "accelerant/error.h"
#include "comm/collective_label.h"
#include "comm/flight_recorder.h"
#include "launch/failure_report.h"

using namespace accelerant::detail;

namespace {

// 2026-12-04 05:21:00.000 UTC
constexpr int64_t kT0 = 1796361660000;

CollectiveRecord collective(int64_t sequence, const std::string& op, const std::string& api,
                            CollectiveState state, int64_t start_ms, int64_t end_ms = 0,
                            const std::string& dtype = "Float", int64_t elements = 1024) {
  CollectiveRecord c;
  c.sequence = sequence;
  c.op = op;
  c.api = api;
  c.dtype = dtype;
  c.elements = elements;
  c.state = state;
  c.start_ms = start_ms;
  c.end_ms = end_ms;
  return c;
}

RankFlightRecord rank_record(int rank, std::vector<CollectiveRecord> collectives,
                             int64_t written_ms = kT0 + 3100) {
  RankFlightRecord r;
  r.rank = rank;
  r.world_size = 2;
  r.written_ms = written_ms;
  r.collectives = std::move(collectives);
  return r;
}

// Rank 0 saves a checkpoint that rank 1 skips: both block in collective #28.
std::vector<RankFlightRecord> save_state_on_main_only() {
  using S = CollectiveState;
  return {
      rank_record(
          0, {collective(27, "all_reduce", "backward bucket 0", S::kCompleted, kT0 - 50, kT0 - 40),
              collective(28, "broadcast_bytes", "save_state", S::kFailed, kT0, kT0 + 3005, "bytes",
                         9)}),
      rank_record(
          1,
          {collective(27, "all_reduce", "backward bucket 0", S::kCompleted, kT0 - 50, kT0 - 40),
           collective(28, "all_reduce", "backward bucket 0", S::kFailed, kT0 + 20, kT0 + 3020)})};
}

}  // namespace

TEST(FlightRecord, TextRoundTripsAndFieldsCannotBreakTheLines) {
  auto record = save_state_on_main_only()[0];
  record.collectives[1].api = "odd\tlabel\nwith breaks";
  RankFlightRecord read;
  ASSERT_TRUE(parse_flight_record(format_flight_record(record), read));
  EXPECT_EQ(read.rank, 0);
  EXPECT_EQ(read.world_size, 2);
  EXPECT_EQ(read.written_ms, record.written_ms);
  ASSERT_EQ(read.collectives.size(), 2u);
  const auto& c = read.collectives[1];
  EXPECT_EQ(c.sequence, 28);
  EXPECT_EQ(c.op, "broadcast_bytes");
  EXPECT_EQ(c.api, "odd label with breaks");
  EXPECT_EQ(c.dtype, "bytes");
  EXPECT_EQ(c.elements, 9);
  EXPECT_EQ(c.state, CollectiveState::kFailed);
  EXPECT_EQ(c.start_ms, kT0);
  EXPECT_EQ(c.end_ms, kT0 + 3005);
}

TEST(FlightRecord, ParseRefusesOtherTextAndSkipsLinesItDoesNotKnow) {
  RankFlightRecord read;
  EXPECT_FALSE(parse_flight_record("", read));
  EXPECT_FALSE(parse_flight_record("[rank 0/2] all_reduce #3 failed", read));
  const std::string text =
      "accelerant-flight-record 1\nrank\t1\t2\nfuture_field\tx\ncollective\tnot-a-number\n"
      "collective\t5\tbarrier\t\tnone\t0\tcompleted\t10\t20\n";
  ASSERT_TRUE(parse_flight_record(text, read));
  EXPECT_EQ(read.rank, 1);
  ASSERT_EQ(read.collectives.size(), 1u);
  EXPECT_EQ(describe_collective(read.collectives[0]), "barrier #5 (Communicator)");
}

TEST(FlightRecord, VerdictNamesBothCallsWhenTheRanksIssueDifferentCollectives) {
  bool different = false;
  EXPECT_EQ(flight_verdict(save_state_on_main_only(), &different),
            "rank 0 is in broadcast_bytes #28 (save_state) while rank 1 is in all_reduce #28 "
            "(backward bucket 0): the ranks issue different collectives.");
  EXPECT_TRUE(different);
}

TEST(FlightRecord, VerdictComparesAtTheSameSequenceNumberWhenOneRankWentOn) {
  using S = CollectiveState;
  // Rank 0's broadcast completed (its sends did not need rank 1) and it blocked in #29.
  auto records = save_state_on_main_only();
  records[0].collectives[1].state = S::kCompleted;
  records[0].collectives.push_back(collective(29, "gather", "save_state", S::kFailed, kT0 + 10));
  bool different = false;
  EXPECT_EQ(flight_verdict(records, &different),
            "rank 0 completed broadcast_bytes #28 (save_state) while rank 1 is in all_reduce #28 "
            "(backward bucket 0): the ranks issue different collectives.");
  EXPECT_TRUE(different);
}

TEST(FlightRecord, VerdictNamesTheRankBehind) {
  using S = CollectiveState;
  auto records = std::vector<RankFlightRecord>{
      rank_record(0, {collective(28, "all_reduce", "reduce", S::kCompleted, kT0, kT0 + 1),
                      collective(29, "all_reduce", "reduce", S::kFailed, kT0 + 5)}),
      rank_record(1, {collective(28, "all_reduce", "reduce", S::kCompleted, kT0, kT0 + 1)})};
  bool different = true;
  EXPECT_EQ(flight_verdict(records, &different),
            "rank 1 is behind: rank 1's last collective is all_reduce #28 (reduce) (completed), "
            "while rank 0 is at all_reduce #29 (reduce) (failed). It has not issued #29: stuck or "
            "slow before it, or on a code path that skips it.");
  EXPECT_FALSE(different);
}

TEST(FlightRecord, VerdictSaysTheRanksAgreeWhenTheyAreInTheSameCollective) {
  using S = CollectiveState;
  auto records = std::vector<RankFlightRecord>{
      rank_record(0, {collective(3, "barrier", "wait_for_everyone", S::kFailed, kT0)}),
      rank_record(1, {collective(3, "barrier", "wait_for_everyone", S::kFailed, kT0)})};
  bool different = true;
  EXPECT_EQ(flight_verdict(records, &different),
            "every rank that reported is in barrier #3 (wait_for_everyone) (failed): the ranks "
            "agree on the collective, so it failed in the transport or on its input.");
  EXPECT_FALSE(different);
}

// A stopped rank publishes nothing; the one that reported must not be said to agree with it.
TEST(FlightRecord, VerdictNamesTheRankThatLeftNoRecordInsteadOfSayingTheRanksAgree) {
  using S = CollectiveState;
  auto records = std::vector<RankFlightRecord>{
      rank_record(0, {collective(3, "barrier", "wait_for_everyone", S::kFailed, kT0)})};
  bool different = true;
  EXPECT_EQ(flight_verdict(records, &different),
            "rank 1 left no flight record (stopped, hung outside a collective, or gone) while "
            "rank 0 is in barrier #3 (wait_for_everyone) (failed), waiting for it.");
  EXPECT_FALSE(different);
}

TEST(FlightRecord, VerdictNamesDifferentDtypesOfTheSameCall) {
  using S = CollectiveState;
  auto records = std::vector<RankFlightRecord>{
      rank_record(0, {collective(7, "all_reduce", "reduce", S::kFailed, kT0, 0, "Float", 4)}),
      rank_record(1, {collective(7, "all_reduce", "reduce", S::kFailed, kT0, 0, "Double", 4)})};
  bool different = false;
  EXPECT_EQ(flight_verdict(records, &different),
            "the ranks call all_reduce #7 (reduce) with different dtypes or sizes (rank 0 Float "
            "of 4 elements, rank 1 Double of 4 elements).");
  EXPECT_TRUE(different);
}

TEST(FlightRecord, MergedTableHasEachRanksLastCollectiveAndTheVerdict) {
  using S = CollectiveState;
  auto records = save_state_on_main_only();
  records[0].collectives[1].state = S::kCompleted;
  records[0].collectives.push_back(
      collective(29, "gather", "save_state", S::kFailed, kT0 + 10, kT0 + 3010, "Byte", 12));
  std::swap(records[0], records[1]);  // the table is in rank order whatever the input's
  EXPECT_EQ(merged_flight_table(records, kT0 + 9999),
            "Last collective of each rank (their flight records):\n"
            "  rank  last collective (op #sequence (called by))  state   started (UTC)  for\n"
            "  0     gather #29 (save_state)                     failed  05:21:00.010   3.0 s\n"
            "  1     all_reduce #28 (backward bucket 0)          failed  05:21:00.020   3.0 s  "
            "<- behind\n"
            "Verdict: rank 0 completed broadcast_bytes #28 (save_state) while rank 1 is in "
            "all_reduce #28 (backward bucket 0): the ranks issue different collectives.\n");
}

TEST(FlightRecord, FailureReportMergesTheWorkersRecords) {
  accelerant::WorkerExit exit;
  exit.rank = 1;
  exit.local_rank = 1;
  exit.pid = 42;
  exit.exit_code = 1;
  exit.error_text = "[rank 1/2] all_reduce #28 failed";
  std::vector<std::string> files;
  for (const auto& r : save_state_on_main_only()) files.push_back(format_flight_record(r));
  files.push_back("");  // a worker that wrote none
  const std::string report = failure_report(exit, 0, 0, 0, files);
  EXPECT_NE(report.find("Its error:\n  | [rank 1/2] all_reduce #28 failed\n"
                        "Last collective of each rank (their flight records):\n"),
            std::string::npos)
      << report;
  EXPECT_NE(report.find("Verdict: rank 0 is in broadcast_bytes #28 (save_state) while rank 1 is "
                        "in all_reduce #28 (backward bucket 0)"),
            std::string::npos)
      << report;
  EXPECT_EQ(failure_report(exit, 0, 0, 0).find("flight records"), std::string::npos);
}

TEST(FlightRecorder, KeepsTheLastSlotsWithTheirStateAndCallingApi) {
  FlightRecorder recorder;
  const int64_t total = kFlightRecorderSlots + 10;
  for (int64_t s = 1; s <= total; ++s) {
    ScopedCollectiveLabel outer("save_state");
    ScopedCollectiveLabel inner("gather");  // the outermost public call names the API
    recorder.start(s, "gather", current_collective_label(), "Float", s);
    if (s < total) recorder.finish(s, CollectiveState::kCompleted);
  }
  recorder.finish(3, CollectiveState::kFailed);  // long gone from the ring: ignored
  const auto record = recorder.record(1, 2);
  ASSERT_EQ(static_cast<int64_t>(record.collectives.size()), kFlightRecorderSlots);
  EXPECT_EQ(record.collectives.front().sequence, total - kFlightRecorderSlots + 1);
  const auto& last = record.collectives.back();
  EXPECT_EQ(last.sequence, total);
  EXPECT_EQ(last.state, CollectiveState::kStarted);
  EXPECT_EQ(last.api, "save_state");
  EXPECT_EQ(last.elements, total);
  EXPECT_EQ(record.collectives[0].state, CollectiveState::kCompleted);
  EXPECT_LE(record.collectives[0].start_ms, record.written_ms);
  EXPECT_EQ(current_collective_label().api, nullptr);  // the scopes restored it
}

TEST(FlightRecorder, IndexedLabelsNameTheBucket) {
  FlightRecorder recorder;
  {
    ScopedCollectiveLabel label("backward bucket", 3);
    recorder.start(1, "all_reduce", current_collective_label(), "Float", 8);
  }
  recorder.start(2, "barrier", current_collective_label(), "none", 0);
  const auto record = recorder.record(0, 2);
  ASSERT_EQ(record.collectives.size(), 2u);
  EXPECT_EQ(describe_collective(record.collectives[0]), "all_reduce #1 (backward bucket 3)");
  EXPECT_EQ(describe_collective(record.collectives[1]), "barrier #2 (Communicator)");
}

TEST(FlightRecord, AnAbortAfterARecordedExceptionIsReportedAsTheException) {
  accelerant::WorkerExit exit;
  exit.rank = 1;
  exit.signal = SIGABRT;  // std::terminate after an uncaught exception in an exec'd worker
  exit.error_text = "[rank 1/2] barrier #1 failed";
  const std::string report = failure_report(exit, 0, 0, 0);
  EXPECT_NE(report.find("Likely cause: an uncaught exception in the worker"), std::string::npos)
      << report;
  exit.error_text.clear();  // no recorded exception: a native crash
  EXPECT_NE(failure_report(exit, 0, 0, 0).find("a crash in native code"), std::string::npos);
}
