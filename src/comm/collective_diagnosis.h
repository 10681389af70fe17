// What turns a hang into an error: the debug-mode signature check before a collective, and the
// diagnosis after one fails, both done through the job's store so they work even when the
// process group itself is stuck. See docs/collectives.md "How failures are reported".
#pragma once

#include <string>
#include <vector>

#include "base/torch_compat.h"

namespace accelerant::detail {

/// The fix for ranks whose collectives differ, in every message that says so.
inline constexpr const char* kSameCallsFix =
    "make every rank call the same collectives in the same order with the same shapes and dtypes "
    "(use gather or pad_across_processes for per-rank lengths)";

/// Why ranks end up in different collectives, and what to do ("Likely cause: ... Fix: ..."): for
/// the failure diagnosis and the watchdog alike.
std::string different_collectives_advice();

/// Where the collective watchdog stores the job's verdict (collective_watchdog.h): a rank whose
/// collective fails because a peer ended on it reports the verdict, not the peer's exit.
inline constexpr const char* kWatchdogVerdictKey = "watch/verdict";

struct CollectiveCall {
  int64_t sequence;       // the n-th public collective of this communicator
  std::string signature;  // "all_reduce(sum) float [4, 3]": must be equal on every rank
  std::string name;       // "all_reduce"
};

/// Debug mode: publishes this rank's signature and waits up to `timeout` for every rank's.
/// Throws CollectiveError naming ranks that never arrived, CollectiveMismatchError listing every
/// rank's signature when they differ.
void check_signatures(c10d::Store& store, const CollectiveCall& call, int rank, int size,
                      std::chrono::milliseconds timeout, const std::string& rank_prefix);

/// Publishes this process in the store under "process/<rank>" (its pid and start time, its
/// machine, `error_file` where its fatal error is recorded, "" for none), so that a peer's
/// diagnose_failure can tell a rank that died from one that is stuck or skipped a collective.
void publish_process(c10d::Store& store, int rank, const std::string& error_file);

/// Those of `ranks` that published themselves on this machine (publish_process) and whose process
/// has exited since; ranks on other machines are never in it.
std::vector<int> exited_ranks(c10d::Store& store, const std::vector<int>& ranks);

struct FailureDiagnosis {
  std::string message;                 // the CollectiveError's text
  std::vector<int> missing;            // ranks that never reported a failure
  bool different_collectives = false;  // the reporting ranks issued different collectives
};

/// After `call` failed on this rank with `cause`: publishes this rank's flight record
/// (`flight_record`, format_flight_record's text) in the store, waits a short grace period for the
/// other ranks to publish theirs, and explains the failure. Ranks that reported are compared at
/// the same sequence number: when they issued different collectives the message names each
/// rank's collective and the public call that issued it (flight_verdict) with each rank's last
/// collective in a table; a rank behind is named as such. Ranks that never reported never
/// reached a collective, or died: a rank published on this machine whose process has exited is
/// said to have died, with where its error is and the fix of restarting, instead of advice about
/// mismatched collectives.
FailureDiagnosis diagnose_failure(c10d::Store& store, const CollectiveCall& call, int rank,
                                  int size, std::chrono::milliseconds timeout,
                                  const std::string& rank_prefix, const std::string& cause,
                                  const std::string& flight_record);

}  // namespace accelerant::detail
