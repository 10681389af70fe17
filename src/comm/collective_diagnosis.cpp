#include "comm/collective_diagnosis.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <thread>

#include "accelerant/error.h"
#include "base/file_io.h"
#include "base/text.h"
#include "comm/flight_record.h"
#include "comm/machine_identity.h"

namespace accelerant::detail {
namespace {

std::string key(const char* kind, const CollectiveCall& call, int rank) {
  return str(kind, "/", call.sequence, "/", rank);
}

std::vector<int> ranks_without_key(c10d::Store& store, const char* kind, const CollectiveCall& call,
                                   int size) {
  std::vector<int> missing;
  for (int r = 0; r < size; ++r) {
    if (!store.check({key(kind, call, r)})) missing.push_back(r);
  }
  return missing;
}

std::string rank_list(const std::vector<int>& ranks) {
  return str(ranks.size() == 1 ? "Rank " : "Ranks ", join(ranks, ", "));
}

std::string bytes_to_string(const std::vector<uint8_t>& bytes) {
  return std::string(bytes.begin(), bytes.end());
}

// A process's state letter and start time (clock ticks after boot) from /proc/<pid>/stat, or
// false when there is no such process.
bool read_process_stat(long pid, char& state, std::string& start_time) {
  const std::string content = read_proc_file("/proc/" + std::to_string(pid) + "/stat");
  const auto paren = content.rfind(')');
  if (paren == std::string::npos || paren + 2 >= content.size()) return false;
  std::istringstream fields(content.substr(paren + 2));
  fields >> state;
  std::string field;
  for (int i = 4; i <= 22 && fields >> field; ++i) {  // field 22 is the start time
    if (i == 22) start_time = field;
  }
  return true;
}

// A missing rank whose process is known to have exited: it published itself on this machine and
// its pid is gone, a zombie, or another process's (started at another time).
// This machine and pid namespace: pids are comparable only between processes that share both.
std::string pid_space() {
  char ns[128] = {0};
  const ssize_t length = ::readlink("/proc/self/ns/pid", ns, sizeof ns - 1);
  return str(machine_identity(), "|",
             length > 0 ? std::string(ns, static_cast<size_t>(length)) : "");
}

struct DeadRank {
  int rank;
  long pid;
  std::string error_file;
};

std::vector<DeadRank> dead_among(c10d::Store& store, const std::vector<int>& ranks) {
  std::vector<DeadRank> dead;
  const std::string here = pid_space();
  for (int r : ranks) {
    const std::string key = str("process/", r);
    if (!store.check({key})) continue;
    std::istringstream record(bytes_to_string(store.get(key)));
    long pid = 0;
    std::string start_time, machine_line, error_file;
    record >> pid >> start_time;
    record.ignore(1);
    std::getline(record, machine_line);
    std::getline(record, error_file);
    if (machine_line != here) continue;  // another machine: nothing to look at from here
    char state = '?';
    std::string now_started;
    const bool exists = read_process_stat(pid, state, now_started);
    if (!exists || state == 'Z' || state == 'X' || now_started != start_time) {
      dead.push_back({r, pid, error_file});
    }
  }
  return dead;
}

std::string dead_ranks_text(const std::vector<DeadRank>& dead, int size) {
  std::vector<int> ranks;
  std::vector<std::string> pids, where;
  for (const auto& d : dead) {
    ranks.push_back(d.rank);
    pids.push_back(std::to_string(d.pid));
    where.push_back(str("rank ", d.rank, "'s output (lines prefixed [rank ", d.rank, "/", size,
                        "] on the launcher's console, or attempt_<n>/rank_", d.rank,
                        ".stderr under the launcher's --log_dir, and the launcher's report of the "
                        "failure)",
                        d.error_file.empty() ? "" : " and its error file " + d.error_file));
  }
  return str(rank_list(ranks), " died: ", dead.size() == 1 ? "its process " : "their processes ",
             join(pids, ", "), " on this machine exited before reaching this collective, so ",
             "this is not a mismatch of collectives. Likely cause: ",
             dead.size() == 1 ? "it crashed or was killed" : "they crashed or were killed",
             " (an uncaught exception, a signal, the out-of-memory "
             "killer). Fix: look at ",
             join(where, "; "),
             " for the first error; to have the group restarted from its newest checkpoint "
             "after such a failure, launch with --max_restarts N (LaunchOptions::max_restarts) "
             "and save checkpoints (AcceleratorOptions::auto_resume).");
}

}  // namespace

std::string different_collectives_advice() {
  return str(
      "Likely cause: a call that talks to every rank ran on some ranks only, e.g. save_state, "
      "gather_for_metrics, reduce, wait_for_everyone or a Communicator collective inside "
      "`if (accelerator.is_main_process())`, or the ranks ran different numbers of batches or "
      "epochs. Fix: ",
      kSameCallsFix,
      "; call the methods named above on every rank (the checkpoint calls write files on the main "
      "process only by themselves), and give every rank the same number of batches.");
}

std::vector<int> exited_ranks(c10d::Store& store, const std::vector<int>& ranks) {
  std::vector<int> exited;
  for (const auto& d : dead_among(store, ranks)) exited.push_back(d.rank);
  return exited;
}

void publish_process(c10d::Store& store, int rank, const std::string& error_file) {
  const long pid = static_cast<long>(::getpid());
  char state = '?';
  std::string start_time;
  if (!read_process_stat(pid, state, start_time)) return;  // no /proc: nothing to compare later
  const std::string record = str(pid, " ", start_time, "\n", pid_space(), "\n", error_file);
  store.set(str("process/", rank), std::vector<uint8_t>(record.begin(), record.end()));
}

void check_signatures(c10d::Store& store, const CollectiveCall& call, int rank, int size,
                      std::chrono::milliseconds timeout, const std::string& rank_prefix) {
  const std::string mine = call.signature;
  store.set(key("debug", call, rank), std::vector<uint8_t>(mine.begin(), mine.end()));
  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) keys.push_back(key("debug", call, r));
  try {
    store.wait(keys, timeout);
  } catch (const std::exception&) {
    auto missing = ranks_without_key(store, "debug", call, size);
    throw CollectiveError(
        str(rank_prefix, "Debug mode: ", call.name, " #", call.sequence, " (", mine, ") waited ",
            timeout.count(), " ms but ", rank_list(missing), " never reached it. Likely cause: ",
            missing.size() == 1 ? "that rank is" : "those ranks are",
            " stuck, slower than the timeout, or on a code path that skips this collective. Fix: ",
            kSameCallsFix, "; check the missing ranks' own output for an earlier error."),
        missing);
  }
  std::vector<std::string> all;
  bool equal = true;
  for (int r = 0; r < size; ++r) {
    all.push_back(r == rank ? mine : bytes_to_string(store.get(keys[r])));
    equal = equal && all[r] == mine;
  }
  if (equal) return;
  std::string table;
  for (int r = 0; r < size; ++r) table += str("\n  rank ", r, ": ", all[r]);
  throw CollectiveMismatchError(str(rank_prefix,
                                    "Debug mode: the ranks disagree about collective #",
                                    call.sequence, ":", table, "\nFix: ", kSameCallsFix, "."));
}

namespace {

// Every rank's flight record that reached the store; `missing` receives the ranks without one.
std::vector<RankFlightRecord> published_records(c10d::Store& store, int size,
                                                std::vector<int>& missing) {
  std::vector<RankFlightRecord> records;
  missing.clear();
  for (int r = 0; r < size; ++r) {
    const std::string key = str("flight/", r);
    RankFlightRecord record;
    if (store.check({key}) && parse_flight_record(bytes_to_string(store.get(key)), record)) {
      records.push_back(std::move(record));
    } else {
      missing.push_back(r);
    }
  }
  return records;
}

// Publishes this rank's flight record and waits up to `grace` for every rank's, or until every
// rank without one is known dead: a dead rank never reports, and waiting for it would only delay
// the report (and look like an idle hang to a launcher that ends idle groups after a rank exits).
std::vector<RankFlightRecord> exchange_records(c10d::Store& store, int rank, int size,
                                               std::chrono::milliseconds grace,
                                               const std::string& flight_record,
                                               std::vector<int>& missing) {
  store.set(str("flight/", rank), std::vector<uint8_t>(flight_record.begin(), flight_record.end()));
  const auto deadline = std::chrono::steady_clock::now() + grace;
  while (true) {
    auto records = published_records(store, size, missing);
    if (missing.empty() || std::chrono::steady_clock::now() >= deadline ||
        dead_among(store, missing).size() == missing.size()) {
      return records;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

bool ranks_at_same_collective(const std::vector<RankFlightRecord>& records) {
  for (const auto& r : records) {
    if (r.collectives.empty() || records[0].collectives.empty() ||
        r.collectives.back().sequence != records[0].collectives.back().sequence) {
      return false;
    }
  }
  return true;
}

std::string missing_text(c10d::Store& store, const std::string& head,
                         const std::vector<int>& missing, int size, std::chrono::milliseconds grace,
                         std::chrono::milliseconds timeout) {
  const auto dead = dead_among(store, missing);
  if (!dead.empty()) {
    std::vector<int> alive;
    for (int r : missing) {
      if (std::none_of(dead.begin(), dead.end(), [r](const DeadRank& d) { return d.rank == r; }))
        alive.push_back(r);
    }
    std::string text = str(head, "\n", dead_ranks_text(dead, size));
    if (!alive.empty()) {
      text += str("\n", rank_list(alive), " did not report either; check ",
                  alive.size() == 1 ? "its" : "their", " output too.");
    }
    return text;
  }
  return str(head, "\n", rank_list(missing), " did not reach this collective (no report within ",
             grace.count(), " ms of the failure; timeout ", timeout.count(),
             " ms). Likely cause: ", missing.size() == 1 ? "that rank is" : "those ranks are",
             " stuck, slower than the timeout, dead, or on a code path that skips this collective. "
             "Fix: ",
             kSameCallsFix,
             "; check the missing ranks' output for an earlier error; if they are "
             "only slow, raise the timeout (ProcessStateOptions::collective_timeout or "
             "ACCELERANT_TIMEOUT_MS); "
             "ACCELERANT_DEBUG_MODE=1 checks every call across ranks.");
}

}  // namespace

FailureDiagnosis diagnose_failure(c10d::Store& store, const CollectiveCall& call, int rank,
                                  int size, std::chrono::milliseconds timeout,
                                  const std::string& rank_prefix, const std::string& cause,
                                  const std::string& flight_record) {
  FailureDiagnosis d;
  const std::string head =
      str(rank_prefix, call.name, " #", call.sequence, " (", call.signature, ") failed: ", cause);
  // Long enough for peers that hit the same timeout to report, short enough that the whole
  // failure surfaces well within twice the timeout.
  const auto grace =
      std::clamp(timeout / 2, std::chrono::milliseconds(200), std::chrono::milliseconds(5000));
  std::vector<RankFlightRecord> records;
  try {
    if (store.check({kWatchdogVerdictKey})) {  // a peer's watchdog ended the job: say why
      const auto verdict = store.get(kWatchdogVerdictKey);
      d.message = str(rank_prefix, call.name, " #", call.sequence,
                      " ended: the collective watchdog of another rank ended the job:\n",
                      bytes_to_string(verdict));
      return d;
    }
    records = exchange_records(store, rank, size, grace, flight_record, d.missing);
  } catch (const std::exception& e) {
    d.missing.clear();
    d.message = str(head, "\nThe job's store could not be reached either (", e.what(),
                    "). Likely cause: the process hosting it (rank 0 or the launcher) has exited. "
                    "Fix: look at rank 0's or the launcher's output for the first error.");
    return d;
  }
  flight_verdict(records, &d.different_collectives);
  if (d.different_collectives) {
    d.message =
        str(head, "\nFrom the ranks' flight records, compared at the same sequence number: ",
            flight_verdict(records), " ", different_collectives_advice());
    if (!d.missing.empty())
      d.message = missing_text(store, d.message, d.missing, size, grace, timeout);
    return d;
  }
  if (!d.missing.empty()) {
    d.message = missing_text(store, head, d.missing, size, grace, timeout);
    return d;
  }
  if (!ranks_at_same_collective(records)) {
    d.message =
        str(head, "\nEvery rank reported a failure, but not in the same collective: ",
            flight_verdict(records),
            " Likely cause: the rank behind is stuck or slow between collectives (compute, I/O, a "
            "deadlock), or skips a collective the others issue. Fix: look at what the rank behind "
            "does after its last collective; ",
            kSameCallsFix,
            "; if it is only slow, raise the timeout (ProcessStateOptions::collective_timeout or "
            "ACCELERANT_TIMEOUT_MS).");
    return d;
  }
  d.message = str(
      head,
      "\nEvery rank reached this collective and their flight records agree on it, so it failed "
      "in the transport or on its input (see the cause above). Likely cause: a "
      "rank died during the transfer, the network between ranks dropped, or the backend does not "
      "support this dtype. Fix: look for an earlier error from another rank; set "
      "GLOO_SOCKET_IFNAME to the interface the machines share if they have several.");
  return d;
}

}  // namespace accelerant::detail
