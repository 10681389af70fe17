// The collective watchdog (docs/collectives.md "The collective watchdog"): names a hang in seconds
// instead of at the collective timeout (30 minutes by default) when no collective can complete,
// because the ranks wait in different collectives or a rank ended its program while others wait.
//
// Each rank's watchdog thread looks every tick at where its own rank is blocked (the communicator
// marks the collective its caller waits in). After a rank has waited a few seconds, its watchdog
// publishes that in the job's store, with the rank's flight record and a heartbeat, and reads the
// other ranks' reports. It ends the job only when every rank is accounted for (waiting, ended, or
// its process gone), the ranks cannot meet, and that stays so over a confirmation period in which
// every waiting rank's heartbeat advanced: a report is a rank's state when it was written, and the
// heartbeats prove that the states compared are current, not left over from a collective that has
// since completed. A rank that computes (not blocked) stops every verdict, so a rank evaluating
// alone while the others wait at a barrier is never reported; ranks that wait in the same
// collective are slow, not mismatched, and are left to the timeout.
//
// A collective in Gloo cannot be interrupted, so a verdict ends the process: it writes the
// diagnosis where an uncaught exception's text goes (the launcher's failure report quotes it),
// and the flight record next to it, then exits with status 1. The first rank to reach a verdict
// stores it; every other rank's watchdog ends its process with the same text.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "base/torch_compat.h"
#include "comm/flight_record.h"
#include "comm/flight_recorder.h"

namespace accelerant::detail {

/// A collective timeout at or below this is left to name hangs by itself: the watchdog would not
/// be faster.
inline constexpr std::chrono::seconds kWatchdogMinTimeout{10};

/// Where a rank stands, as its watchdog reports it.
enum class WatchStatus { kRunning, kWaiting, kEnded };

/// One rank's report in the store ("watch/<rank>"); its record holds only the collective at
/// `sequence` (or, running, its newest one), the whole record lives under "watchrec/<rank>".
struct WatchReport {
  int rank = -1;
  int64_t heartbeat = 0;  // advances each time the rank's watchdog publishes
  WatchStatus status = WatchStatus::kRunning;
  int64_t sequence = 0;  // kWaiting: the collective it is blocked in; kEnded: its last one
  bool exited = false;   // kEnded because its process is gone (not published, found out)
  RankFlightRecord record;
};

std::string format_watch_report(const WatchReport& report);
/// False when `text` is not a watch report.
bool parse_watch_report(const std::string& text, WatchReport& report);

/// A situation in which no collective can complete.
struct HangFinding {
  std::string key;      // equal while the situation is the same (to confirm it over time)
  std::string summary;  // one sentence naming each rank's place
  bool ended = false;   // a rank ended (or exited) before the collective others wait in
};

/// What the ranks' reports (one per rank, nullopt for a rank that never published) show: a hang
/// when every rank waits or has ended and either a rank ended before the collective another waits
/// in, or the waiting ranks are in different collectives (another sequence number, another
/// operation, or another size where sizes must match). nullopt otherwise: a rank running or
/// without a report, or every waiting rank in the same collective.
std::optional<HangFinding> find_hang(const std::vector<std::optional<WatchReport>>& reports);

/// When the watchdog looks and how long it waits before it speaks.
struct WatchdogTiming {
  std::chrono::milliseconds tick{500};
  std::chrono::milliseconds report_after{2000};  // blocked this long: publish and compare
  std::chrono::milliseconds confirm{2000};       // a finding held this long ends the job
};

/// Set by the communicator around each wait of its caller: the collective's sequence number (0:
/// not blocked) and since when (steady clock, nanoseconds).
struct BlockedIn {
  std::atomic<int64_t> sequence{0};
  std::atomic<int64_t> since_ns{0};
};

class CollectiveWatchdog {
 public:
  struct Setup {
    std::function<c10::intrusive_ptr<c10d::Store>()> connect;  // the watchdog's own connection
    const FlightRecorder* flight = nullptr;
    const BlockedIn* blocked = nullptr;
    const std::atomic<int64_t>* issued = nullptr;  // the communicator's sequence counter
    int rank = 0;
    int size = 1;
    std::chrono::milliseconds collective_timeout{0};
    std::string rank_prefix;
    std::string error_file;  // the flight record goes next to it
    WatchdogTiming timing;
  };
  explicit CollectiveWatchdog(Setup setup);
  /// Stops the thread, then tells the other ranks this one ended (its process is leaving).
  ~CollectiveWatchdog();
  CollectiveWatchdog(const CollectiveWatchdog&) = delete;
  CollectiveWatchdog& operator=(const CollectiveWatchdog&) = delete;

  /// This rank will issue no more collectives (ProcessState::shutdown): reported at the next tick.
  void mark_ended();

 private:
  void run();
  void tick(c10d::Store& store);
  void publish(c10d::Store& store, WatchStatus status, int64_t sequence);
  std::vector<std::optional<WatchReport>> read_reports(c10d::Store& store);
  [[noreturn]] void end_process(const std::string& message);

  Setup setup_;
  std::atomic<bool> ended_{false};
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  c10::intrusive_ptr<c10d::Store> store_;
  int64_t heartbeat_ = 0;
  WatchStatus published_ = WatchStatus::kRunning;
  int64_t published_sequence_ = 0;
  int64_t ticks_waiting_ = 0;  // ticks spent waiting, for taking turns to compare
  // The finding being confirmed: its key, since when, and each rank's heartbeat then.
  std::string pending_key_;
  std::chrono::steady_clock::time_point pending_since_;
  std::vector<int64_t> pending_heartbeats_;
  std::thread thread_;  // last: started when everything above is ready
};

}  // namespace accelerant::detail
