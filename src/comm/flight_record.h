// A rank's flight record: its last collectives (docs/collectives.md "Ranks in different
// collectives"), as the communicator writes them when a collective fails and as the launcher and
// the other ranks read them. LibTorch-free (part of accelerant_core): the launcher's failure report
// merges the ranks' records into one table.
//
// Note "Flight record text": a record travels as text, one collective a line, so that it can sit
// in a file next to the worker's error file (error_file + kFlightRecordSuffix) and in the job's
// store, and be read by a program without LibTorch. Fields are tab-separated; the writer replaces
// tabs and newlines inside fields by spaces.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace accelerant::detail {

/// Appended to a worker's error file path (ACCELERANT_ERROR_FILE) to name its flight record file.
inline constexpr const char* kFlightRecordSuffix = ".collectives";

enum class CollectiveState { kStarted, kCompleted, kFailed };

const char* to_string(CollectiveState state);

/// One collective as one rank saw it.
struct CollectiveRecord {
  int64_t sequence = 0;  // the n-th public collective of the communicator
  std::string op;        // "all_reduce", "broadcast_bytes", ...
  std::string api;       // the public call that issued it: "save_state", "backward bucket 0"; ""
                         // for a direct Communicator call
  std::string dtype;     // "Float", "bytes"
  int64_t elements = 0;  // this rank's element count (byte count for bytes)
  CollectiveState state = CollectiveState::kStarted;
  int64_t start_ms = 0;  // wall clock, milliseconds since the epoch
  int64_t end_ms = 0;    // 0 while started
};

/// One rank's last collectives, oldest first.
struct RankFlightRecord {
  int rank = -1;
  int world_size = 0;
  int64_t written_ms = 0;  // when the record was taken (wall clock)
  std::vector<CollectiveRecord> collectives;
};

/// The record as text (note "Flight record text").
std::string format_flight_record(const RankFlightRecord& record);

/// Reads what format_flight_record wrote. False (and `record` unspecified) when `text` is not a
/// flight record; lines it does not understand are skipped, so a newer writer stays readable.
bool parse_flight_record(const std::string& text, RankFlightRecord& record);

/// "broadcast_bytes #28 (save_state)"; a direct Communicator call reads "(Communicator)".
std::string describe_collective(const CollectiveRecord& c);

/// What the ranks' records say together, in one sentence: that they issued different collectives
/// at the same sequence number (naming both calls), that a rank is behind, or that they agree
/// (then the transport failed). `different` is set when the ranks issued different collectives or
/// the same one with different dtypes or sizes.
std::string flight_verdict(const std::vector<RankFlightRecord>& records, bool* different = nullptr);

/// One table of each rank's last collective (sequence, op, calling API, state, since when; the
/// ranks behind marked) and the verdict line, for the launcher's failure report. `now_ms` is the
/// wall clock the durations are measured to for collectives still running.
std::string merged_flight_table(std::vector<RankFlightRecord> records, int64_t now_ms);

}  // namespace accelerant::detail
