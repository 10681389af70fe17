// Each communicator's ring of its last kFlightRecorderSlots collectives (docs/collectives.md
// "Ranks in different collectives"): what a rank was doing when a collective failed, written next
// to its error file and into the job's store for the other ranks' diagnosis.
//
// Recording must cost the training step nothing it would notice: a slot is fixed (the ring
// allocates once, with the communicator), names are string literals kept as pointers, and the
// text is made only when a record is taken, after a failure. Fields are relaxed atomics because a
// collective may be completed (PendingCollective::wait) on another thread than the one that issued
// it, and a record may be taken while another thread issues one.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>

#include "comm/collective_label.h"
#include "comm/flight_record.h"

namespace accelerant::detail {

/// How many collectives each rank remembers. Ranks rarely drift apart by more than a few
/// collectives before one blocks, so 64 keeps the common sequence number of a mismatch in every
/// rank's ring with room to spare, and the record stays a few kilobytes.
inline constexpr int64_t kFlightRecorderSlots = 64;

/// Now on the steady clock, in nanoseconds: when a collective started or ended, and since when a
/// rank waits (the watchdog).
int64_t steady_clock_ns();
/// Now on the wall clock, in milliseconds since the epoch: the times a flight record shows.
int64_t wall_clock_ms();

class FlightRecorder {
 public:
  /// Records collective `sequence` as started now. `op` and `dtype` must be string literals (or
  /// otherwise outlive the recorder), as the label's API is.
  void start(int64_t sequence, const char* op, const CollectiveLabel& api, const char* dtype,
             int64_t elements);
  /// Marks `sequence` completed or failed now (nothing when its slot was reused since).
  void finish(int64_t sequence, CollectiveState state);

  /// The collectives still in the ring, oldest first, with wall-clock times.
  RankFlightRecord record(int rank, int world_size) const;

 private:
  struct Slot {
    std::atomic<int64_t> sequence{0};  // 0: never used
    std::atomic<const char*> op{nullptr};
    std::atomic<const char*> api{nullptr};
    std::atomic<int64_t> api_index{-1};
    std::atomic<const char*> dtype{nullptr};
    std::atomic<int64_t> elements{0};
    std::atomic<int64_t> start_ns{0};  // steady clock
    std::atomic<int64_t> end_ns{0};
    std::atomic<int> state{0};
  };
  std::array<Slot, kFlightRecorderSlots> slots_;
};

}  // namespace accelerant::detail
