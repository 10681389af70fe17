#include "comm/flight_record.h"

#include <algorithm>
#include <ctime>
#include <sstream>

#include "base/text.h"

namespace accelerant::detail {
namespace {

constexpr const char* kMagic = "accelerant-flight-record 1";
constexpr size_t kMaxCollectives = 4096;  // a hostile or corrupt file cannot grow the report

std::string field(std::string text) {
  for (char& c : text) {
    if (c == '\t' || c == '\n' || c == '\r') c = ' ';
  }
  return text;
}

std::vector<std::string> split_tabs(const std::string& line) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    const size_t tab = line.find('\t', start);
    parts.push_back(line.substr(start, tab == std::string::npos ? std::string::npos : tab - start));
    if (tab == std::string::npos) return parts;
    start = tab + 1;
  }
}

bool to_int(const std::string& text, int64_t& value) {
  try {
    size_t used = 0;
    value = std::stoll(text, &used);
    return used == text.size();
  } catch (const std::exception&) {
    return false;
  }
}

bool state_from(const std::string& text, CollectiveState& state) {
  for (auto s :
       {CollectiveState::kStarted, CollectiveState::kCompleted, CollectiveState::kFailed}) {
    if (text == to_string(s)) {
      state = s;
      return true;
    }
  }
  return false;
}

int64_t newest(const RankFlightRecord& r) {
  return r.collectives.empty() ? 0 : r.collectives.back().sequence;
}

const CollectiveRecord* at(const RankFlightRecord& r, int64_t sequence) {
  for (const auto& c : r.collectives) {
    if (c.sequence == sequence) return &c;
  }
  return nullptr;
}

std::string ranks_text(const std::vector<int>& ranks) {
  return str(ranks.size() == 1 ? "rank " : "ranks ", join(ranks, ", "));
}

// "rank 0 is in broadcast_bytes #28 (save_state)", "ranks 1, 2 completed all_reduce #28 (...)".
std::string doing(const std::vector<int>& ranks, const CollectiveRecord& c) {
  const bool one = ranks.size() == 1;
  const char* verb = c.state == CollectiveState::kCompleted ? " completed "
                     : one                                  ? " is in "
                                                            : " are in ";
  return str(ranks_text(ranks), verb, describe_collective(c));
}

std::string last_of(const RankFlightRecord& r) {
  if (r.collectives.empty()) return "no collective yet";
  const auto& c = r.collectives.back();
  return str(describe_collective(c), " (", to_string(c.state), ")");
}

// Sizes that must match on every rank: all-reduces and tensor broadcasts (a gather's first
// dimension and a broadcast_bytes receiver's length legitimately differ).
bool sizes_must_match(const std::string& op) { return op == "all_reduce" || op == "broadcast"; }

// What differs between the ranks' collective #s (records in rank order): different ops or
// calling APIs, else different dtypes or sizes where they must match; "" when nothing does.
std::string difference_at(const std::vector<RankFlightRecord>& records, int64_t s) {
  // Ranks by the op and API they issued, in the order of their lowest rank.
  std::vector<std::pair<const CollectiveRecord*, std::vector<int>>> groups;
  std::vector<std::string> payloads;
  const CollectiveRecord* first = nullptr;
  bool payload_differs = false;
  for (const auto& r : records) {
    const CollectiveRecord* c = at(r, s);
    if (!c) continue;  // gone from its ring, or not issued yet
    auto same = std::find_if(groups.begin(), groups.end(), [c](const auto& g) {
      return g.first->op == c->op && g.first->api == c->api;
    });
    if (same == groups.end()) {
      groups.push_back({c, {r.rank}});
    } else {
      same->second.push_back(r.rank);
    }
    if (!first) first = c;
    payload_differs = payload_differs || c->dtype != first->dtype ||
                      (sizes_must_match(c->op) && c->elements != first->elements);
    payloads.push_back(str("rank ", r.rank, " ", c->dtype, " of ", c->elements, " elements"));
  }
  if (groups.size() > 1) {
    std::vector<std::string> parts;
    for (const auto& [c, ranks] : groups) parts.push_back(doing(ranks, *c));
    return str(join(parts, " while "), ": the ranks issue different collectives.");
  }
  if (payload_differs) {
    return str("the ranks call ", describe_collective(*first), " with different dtypes or sizes (",
               join(payloads, ", "), ").");
  }
  return "";
}

// The ranks whose newest collective is `lo`, older than the others'.
std::string behind_text(const std::vector<RankFlightRecord>& records, int64_t lo) {
  std::vector<int> behind;
  std::vector<std::string> ahead;
  const RankFlightRecord* slowest = nullptr;
  for (const auto& r : records) {
    if (newest(r) == lo) {
      behind.push_back(r.rank);
      if (!slowest) slowest = &r;
    } else {
      ahead.push_back(str("rank ", r.rank, " is at ", last_of(r)));
    }
  }
  const bool one = behind.size() == 1;
  return str(ranks_text(behind), one ? " is" : " are", " behind: rank ", slowest->rank,
             "'s last collective is ", last_of(*slowest), ", while ", join(ahead, ", "), ". ",
             one ? "It has" : "They have", " not issued #", lo + 1,
             ": stuck or slow before it, or on a code path that skips it.");
}

std::string clock_text(int64_t ms) {
  const std::time_t seconds = static_cast<std::time_t>(ms / 1000);
  std::tm utc{};
  ::gmtime_r(&seconds, &utc);
  char text[32];
  std::snprintf(text, sizeof text, "%02d:%02d:%02d.%03d", utc.tm_hour, utc.tm_min, utc.tm_sec,
                static_cast<int>(ms % 1000));
  return text;
}

std::string seconds_text(int64_t ms) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f s", static_cast<double>(std::max<int64_t>(0, ms)) / 1000);
  return text;
}

std::string pad(const std::string& text, size_t width) {
  return text.size() >= width ? text : text + std::string(width - text.size(), ' ');
}

}  // namespace

const char* to_string(CollectiveState state) {
  switch (state) {
    case CollectiveState::kStarted:
      return "started";
    case CollectiveState::kCompleted:
      return "completed";
    case CollectiveState::kFailed:
      return "failed";
  }
  return "unknown";
}

std::string format_flight_record(const RankFlightRecord& record) {
  std::string text = str(kMagic, "\nrank\t", record.rank, "\t", record.world_size, "\nwritten_ms\t",
                         record.written_ms, "\n");
  for (const auto& c : record.collectives) {
    text +=
        str("collective\t", c.sequence, "\t", field(c.op), "\t", field(c.api), "\t", field(c.dtype),
            "\t", c.elements, "\t", to_string(c.state), "\t", c.start_ms, "\t", c.end_ms, "\n");
  }
  return text;
}

bool parse_flight_record(const std::string& text, RankFlightRecord& record) {
  std::istringstream lines(text);
  std::string line;
  if (!std::getline(lines, line) || line != kMagic) return false;
  record = RankFlightRecord{};
  bool have_rank = false;
  while (std::getline(lines, line)) {
    const auto parts = split_tabs(line);
    int64_t a = 0, b = 0;
    if (parts[0] == "rank" && parts.size() >= 3 && to_int(parts[1], a) && to_int(parts[2], b)) {
      record.rank = static_cast<int>(a);
      record.world_size = static_cast<int>(b);
      have_rank = true;
    } else if (parts[0] == "written_ms" && parts.size() >= 2 && to_int(parts[1], a)) {
      record.written_ms = a;
    } else if (parts[0] == "collective" && parts.size() >= 9 &&
               record.collectives.size() < kMaxCollectives) {
      CollectiveRecord c;
      if (!to_int(parts[1], c.sequence) || !to_int(parts[5], c.elements) ||
          !state_from(parts[6], c.state) || !to_int(parts[7], c.start_ms) ||
          !to_int(parts[8], c.end_ms)) {
        continue;
      }
      c.op = parts[2];
      c.api = parts[3];
      c.dtype = parts[4];
      record.collectives.push_back(std::move(c));
    }
  }
  std::sort(record.collectives.begin(), record.collectives.end(),
            [](const auto& x, const auto& y) { return x.sequence < y.sequence; });
  return have_rank;
}

std::string describe_collective(const CollectiveRecord& c) {
  return str(c.op, " #", c.sequence, " (", c.api.empty() ? "Communicator" : c.api, ")");
}

std::string flight_verdict(const std::vector<RankFlightRecord>& unsorted, bool* different) {
  if (different) *different = false;
  if (unsorted.empty()) return "no rank left a flight record.";
  auto records = unsorted;
  std::sort(records.begin(), records.end(), [](auto& x, auto& y) { return x.rank < y.rank; });
  int64_t lo = newest(records[0]), hi = lo, from = 1;
  for (const auto& r : records) {
    lo = std::min(lo, newest(r));
    hi = std::max(hi, newest(r));
    if (!r.collectives.empty()) from = std::max(from, r.collectives.front().sequence);
  }
  // The first sequence number at which the ranks that still hold it disagree.
  for (int64_t s = from; s <= lo; ++s) {
    std::string difference = difference_at(records, s);
    if (!difference.empty()) {
      if (different) *different = true;
      return difference;
    }
  }
  if (lo < hi) return behind_text(records, lo);
  const auto& c = records[0].collectives;
  if (c.empty()) return "no rank has issued a collective yet.";
  // Ranks without a record did not answer (stopped, hung outside any collective, or gone): the
  // ones that reported agreeing says nothing about them, and they are what the others wait for.
  std::vector<int> silent;
  for (int r = 0; r < records[0].world_size; ++r) {
    const bool reported = std::any_of(records.begin(), records.end(),
                                      [r](const RankFlightRecord& x) { return x.rank == r; });
    if (!reported) silent.push_back(r);
  }
  if (!silent.empty()) {
    std::vector<int> reported;
    for (const auto& r : records) reported.push_back(r.rank);
    return str(ranks_text(silent),
               " left no flight record (stopped, hung outside a collective, "
               "or gone) while ",
               ranks_text(reported), reported.size() == 1 ? " is" : " are", " in ",
               describe_collective(c.back()), " (", to_string(c.back().state), "), waiting for ",
               silent.size() == 1 ? "it." : "them.");
  }
  return str(records.size() == 1 ? "rank " + std::to_string(records[0].rank) + " is in "
                                 : std::string("every rank that reported is in "),
             describe_collective(c.back()), " (", to_string(c.back().state),
             "): the ranks agree on the collective, so it failed in the transport or on its "
             "input.");
}

std::string merged_flight_table(std::vector<RankFlightRecord> records, int64_t now_ms) {
  std::sort(records.begin(), records.end(), [](auto& x, auto& y) { return x.rank < y.rank; });
  int64_t hi = 0;
  for (const auto& r : records) hi = std::max(hi, newest(r));
  std::vector<std::vector<std::string>> rows = {
      {"rank", "last collective (op #sequence (called by))", "state", "started (UTC)", "for", ""}};
  for (const auto& r : records) {
    if (r.collectives.empty()) {
      rows.push_back({std::to_string(r.rank), "none yet", "", "", "", ""});
      continue;
    }
    const auto& c = r.collectives.back();
    const int64_t end = c.end_ms ? c.end_ms : (r.written_ms ? r.written_ms : now_ms);
    rows.push_back({std::to_string(r.rank), describe_collective(c), to_string(c.state),
                    clock_text(c.start_ms), seconds_text(end - c.start_ms),
                    newest(r) < hi ? "<- behind" : ""});
  }
  std::vector<size_t> width(rows[0].size(), 0);
  for (const auto& row : rows) {
    for (size_t i = 0; i < row.size(); ++i) width[i] = std::max(width[i], row[i].size());
  }
  std::string table = "Last collective of each rank (their flight records):\n";
  for (const auto& row : rows) {
    std::string line = "  ";
    for (size_t i = 0; i < row.size(); ++i) line += pad(row[i], width[i] + 2);
    while (!line.empty() && line.back() == ' ') line.pop_back();
    table += line + "\n";
  }
  return table + "Verdict: " + flight_verdict(records) + "\n";
}

}  // namespace accelerant::detail
