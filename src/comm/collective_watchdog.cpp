#include "comm/collective_watchdog.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <sstream>

#include "accelerant/error.h"
#include "base/exit_hooks.h"
#include "base/file_io.h"
#include "base/text.h"
#include "base/uncaught_exception_recorder.h"
#include "comm/collective_diagnosis.h"

namespace accelerant::detail {
namespace {

std::string report_key(int rank) { return str("watch/", rank); }
// The rank's whole flight record, for the verdict's table: rewritten only when where it stands
// changes, so that the report read every tick stays one line of a collective.
std::string record_key(int rank) { return str("watchrec/", rank); }

const char* status_word(WatchStatus s) {
  switch (s) {
    case WatchStatus::kRunning:
      return "running";
    case WatchStatus::kWaiting:
      return "waiting";
    case WatchStatus::kEnded:
      return "ended";
  }
  return "?";
}

std::vector<uint8_t> bytes_of(const std::string& text) {
  return std::vector<uint8_t>(text.begin(), text.end());
}

std::string text_of(const std::vector<uint8_t>& bytes) {
  return std::string(bytes.begin(), bytes.end());
}

// Operations whose every rank must pass the same number of elements: a difference is a mismatch.
bool sizes_must_match(const std::string& op) {
  return op == "all_reduce" || op == "reduce_scatter" || op == "all_gather" || op == "broadcast";
}

const CollectiveRecord* collective_at(const WatchReport& r, int64_t sequence) {
  for (const auto& c : r.record.collectives) {
    if (c.sequence == sequence) return &c;
  }
  return nullptr;
}

// "all_reduce #7 (backward bucket 0)", or "collective #7" when the ring no longer holds it.
std::string place_of(const WatchReport& r) {
  const CollectiveRecord* c = collective_at(r, r.sequence);
  return c ? describe_collective(*c) : str("collective #", r.sequence);
}

std::string ranks_text(const std::vector<int>& ranks) {
  return str(ranks.size() == 1 ? "rank " : "ranks ", join(ranks, ", "));
}

}  // namespace

std::string format_watch_report(const WatchReport& r) {
  return str("accelerant-watch 1\t", r.rank, "\t", r.heartbeat, "\t", status_word(r.status), "\t",
             r.sequence, "\n", format_flight_record(r.record));
}

bool parse_watch_report(const std::string& text, WatchReport& r) {
  const auto newline = text.find('\n');
  if (newline == std::string::npos) return false;
  std::istringstream head(text.substr(0, newline));
  std::string magic, version, status;
  if (!(head >> magic >> version >> r.rank >> r.heartbeat >> status >> r.sequence) ||
      magic != "accelerant-watch" || version != "1") {
    return false;
  }
  if (status == "running") {
    r.status = WatchStatus::kRunning;
  } else if (status == "waiting") {
    r.status = WatchStatus::kWaiting;
  } else if (status == "ended") {
    r.status = WatchStatus::kEnded;
  } else {
    return false;
  }
  r.exited = false;
  return parse_flight_record(text.substr(newline + 1), r.record);
}

std::optional<HangFinding> find_hang(const std::vector<std::optional<WatchReport>>& reports) {
  std::vector<const WatchReport*> waiting, ended;
  for (const auto& r : reports) {
    if (!r || r->status == WatchStatus::kRunning) return std::nullopt;  // it may yet arrive
    (r->status == WatchStatus::kWaiting ? waiting : ended).push_back(&*r);
  }
  if (waiting.empty()) return std::nullopt;
  HangFinding finding;
  for (const auto& r : reports) {
    finding.key += str(r->rank, ":", status_word(r->status), ":", r->sequence, ";");
  }
  // A rank that ended after collective n never issues n + 1: whoever waits beyond n waits forever.
  std::vector<std::string> gone;
  for (const WatchReport* e : ended) {
    std::vector<int> stranded;
    for (const WatchReport* w : waiting) {
      if (w->sequence > e->sequence) stranded.push_back(w->rank);
    }
    if (stranded.empty()) continue;
    finding.ended = true;
    gone.push_back(str("rank ", e->rank,
                       e->exited ? "'s process exited"
                                 : " ended its program (ProcessState::shutdown, "
                                   "e.g. from end_training)",
                       e->sequence > 0 ? str(" after collective #", e->sequence)
                                       : std::string(" before its first collective"),
                       " while ", ranks_text(stranded), stranded.size() == 1 ? " waits" : " wait",
                       " in a later one"));
  }
  // Where each waiting rank is, grouped: ranks in the same place are listed together.
  std::vector<std::pair<std::string, std::vector<int>>> places;  // in the order of their first rank
  std::set<std::string> distinct;
  for (const WatchReport* w : waiting) {
    const CollectiveRecord* c = collective_at(*w, w->sequence);
    const std::string place = place_of(*w);
    auto it =
        std::find_if(places.begin(), places.end(), [&](const auto& p) { return p.first == place; });
    if (it == places.end()) it = places.insert(places.end(), {place, {}});
    it->second.push_back(w->rank);
    distinct.insert(str(w->sequence, "|", c ? c->op : "?", "|",
                        c && sizes_must_match(c->op) ? std::to_string(c->elements) : "*"));
  }
  if (!finding.ended && distinct.size() <= 1) return std::nullopt;  // same collective: slow
  std::vector<std::string> where;
  for (const auto& [place, ranks] : places) {
    where.push_back(str(ranks_text(ranks), ranks.size() == 1 ? " waits in " : " wait in ", place));
  }
  finding.summary = finding.ended
                        ? str(join(gone, "; "), " (", join(where, "; "), ")")
                        : str("the ranks wait in different collectives: ", join(where, "; "));
  return finding;
}

CollectiveWatchdog::CollectiveWatchdog(Setup setup) : setup_(std::move(setup)) {
  thread_ = std::thread([this] { run(); });
}

CollectiveWatchdog::~CollectiveWatchdog() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  // The process is leaving: a rank still waiting for this one would otherwise wait out the
  // timeout. Best effort: the store may already be gone with rank 0.
  if (store_ && published_ != WatchStatus::kEnded) {
    try {
      publish(*store_, WatchStatus::kEnded, setup_.issued->load());
    } catch (const std::exception&) {
    }
  }
}

void CollectiveWatchdog::mark_ended() {
  ended_ = true;
  wake_.notify_all();
}

void CollectiveWatchdog::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_) {
    wake_.wait_for(lock, setup_.timing.tick);
    if (stop_) break;
    lock.unlock();
    try {
      if (!store_) store_ = setup_.connect();
      tick(*store_);
    } catch (const std::exception&) {
      // The store is unreachable (its host ended, or is restarting the group): nothing to
      // compare with; the collective timeout still names the hang.
    }
    lock.lock();
  }
}

void CollectiveWatchdog::publish(c10d::Store& store, WatchStatus status, int64_t sequence) {
  const RankFlightRecord whole = setup_.flight->record(setup_.rank, setup_.size);
  if (status != published_ || sequence != published_sequence_ || heartbeat_ == 0) {
    store.set(record_key(setup_.rank), bytes_of(format_flight_record(whole)));
  }
  WatchReport r;
  r.rank = setup_.rank;
  r.heartbeat = ++heartbeat_;
  r.status = status;
  r.sequence = sequence;
  // Only the collective the report is about (the one waited in, or the last one): the reports
  // are read every tick by every waiting rank, so they stay small whatever the world size.
  r.record.rank = whole.rank;
  r.record.world_size = whole.world_size;
  r.record.written_ms = whole.written_ms;
  for (const auto& c : whole.collectives) {
    if (status == WatchStatus::kWaiting ? c.sequence == sequence
                                        : &c == &whole.collectives.back()) {
      r.record.collectives.push_back(c);
    }
  }
  store.set(report_key(setup_.rank), bytes_of(format_watch_report(r)));
  published_ = status;
  published_sequence_ = sequence;
}

std::vector<std::optional<WatchReport>> CollectiveWatchdog::read_reports(c10d::Store& store) {
  std::vector<std::optional<WatchReport>> reports(static_cast<size_t>(setup_.size));
  std::vector<int> silent;  // running or never reported: perhaps gone
  for (int r = 0; r < setup_.size; ++r) {
    WatchReport report;
    if (store.check({report_key(r)}) &&
        parse_watch_report(text_of(store.get(report_key(r))), report)) {
      reports[r] = std::move(report);
    }
    if (!reports[r] || reports[r]->status == WatchStatus::kRunning) silent.push_back(r);
  }
  if (silent.empty() || silent.size() == static_cast<size_t>(setup_.size)) return reports;
  // A rank that exited without a word (returned from main without shutdown, killed) is as good as
  // ended; only looked for when every other rank is accounted for.
  for (int r : exited_ranks(store, silent)) {
    WatchReport gone;
    if (reports[r]) gone = *reports[r];
    gone.rank = r;
    gone.status = WatchStatus::kEnded;
    gone.exited = true;
    gone.sequence = gone.record.collectives.empty() ? 0 : gone.record.collectives.back().sequence;
    reports[r] = std::move(gone);
  }
  return reports;
}

void CollectiveWatchdog::tick(c10d::Store& store) {
  if (store.check({kWatchdogVerdictKey})) {
    end_process(str(setup_.rank_prefix,
                    "Ended by the collective watchdog (another rank's verdict):\n",
                    text_of(store.get(kWatchdogVerdictKey))));
  }
  const int64_t blocked = setup_.blocked->sequence.load();
  const auto blocked_for =
      std::chrono::nanoseconds(steady_clock_ns() - setup_.blocked->since_ns.load());
  WatchStatus status = WatchStatus::kRunning;
  if (ended_) {
    status = WatchStatus::kEnded;
  } else if (blocked != 0 && blocked_for >= setup_.timing.report_after) {
    status = WatchStatus::kWaiting;
  }
  if (status == WatchStatus::kRunning) {
    if (published_ != WatchStatus::kRunning) publish(store, status, 0);
    pending_key_.clear();
    return;
  }
  if (status == WatchStatus::kEnded) {
    if (published_ != WatchStatus::kEnded) publish(store, status, setup_.issued->load());
    return;
  }
  publish(store, status, blocked);  // every tick: the heartbeat says the report is current
  // Reading every report costs a request per rank: with many ranks, each compares on every
  // (size / 8)-th tick only, the ranks taking turns, so that about 8 comparisons run per tick
  // whatever the world size (a verdict then waits for a rank's turn, still seconds to a minute).
  const int64_t compare_every = std::max(1, setup_.size / 8);
  if ((++ticks_waiting_ + setup_.rank) % compare_every != 0) return;
  const auto reports = read_reports(store);
  const auto finding = find_hang(reports);
  if (!finding) {
    pending_key_.clear();
    return;
  }
  const auto now = std::chrono::steady_clock::now();
  std::vector<int64_t> heartbeats;
  for (const auto& r : reports) heartbeats.push_back(r ? r->heartbeat : 0);
  if (finding->key != pending_key_) {
    pending_key_ = finding->key;
    pending_since_ = now;
    pending_heartbeats_ = heartbeats;
    return;
  }
  if (now - pending_since_ < setup_.timing.confirm) return;
  // Every waiting rank must have published at least twice since the finding was first seen: its
  // report then shows where it waits now, not where it waited before a collective completed.
  for (const auto& r : reports) {
    if (r->status == WatchStatus::kWaiting && r->heartbeat < pending_heartbeats_[r->rank] + 2) {
      return;
    }
  }
  std::vector<RankFlightRecord> records;
  for (const auto& r : reports) {
    RankFlightRecord whole;
    const std::string key = record_key(r->rank);
    records.push_back(store.check({key}) && parse_flight_record(text_of(store.get(key)), whole)
                          ? whole
                          : r->record);
  }
  const auto waited = std::chrono::duration_cast<std::chrono::seconds>(blocked_for).count();
  const std::string verdict = str(
      setup_.rank_prefix, "Collective watchdog: ", finding->summary,
      ". No collective can complete like this, so the job ends now (this rank waited ", waited,
      " s) instead of at the collective timeout of ",
      std::chrono::duration_cast<std::chrono::seconds>(setup_.collective_timeout).count(),
      " s, which still governs a collective every rank entered.\n",
      merged_flight_table(records, wall_clock_ms()),
      finding->ended
          ? str("Likely cause: the ranks ran different numbers of steps or epochs (unevenly "
                "sharded data, a loop bound or an early return that differs between ranks). Fix: "
                "give every rank the same number of batches (drop or pad the remainder), and "
                "call end_training on every rank after the same step; ",
                kSameCallsFix, ".")
          : different_collectives_advice());
  // The first verdict stored is the job's: every rank ends with the same text.
  const auto stored = store.compareSet(kWatchdogVerdictKey, {}, bytes_of(verdict));
  end_process(
      text_of(stored) == verdict
          ? verdict
          : str(setup_.rank_prefix, "Ended by the collective watchdog:\n", text_of(stored)));
}

void CollectiveWatchdog::end_process(const std::string& message) {
  if (!setup_.error_file.empty()) {
    write_file_atomically(setup_.error_file + kFlightRecordSuffix,
                          format_flight_record(setup_.flight->record(setup_.rank, setup_.size)));
  }
  record_exception(std::make_exception_ptr(CollectiveError(message, {})));
  std::fprintf(stderr, "%s\n", message.c_str());
  std::fflush(nullptr);
  run_exit_hooks();
  // Not exit(): the main thread is blocked inside the transport, and static destructors would
  // tear it down under that thread.
  std::_Exit(1);
}

}  // namespace accelerant::detail
