// Merging the ranks' Chrome traces (accelerant/trace_files.h). LibTorch-free, so that the
// `accelerant` front end can merge files copied from several machines.
#include "accelerant/trace_files.h"

#include <algorithm>
#include <filesystem>
#include <regex>
#include <system_error>

#include "accelerant/error.h"
#include "base/bounded_input.h"
#include "base/file_io.h"

namespace accelerant {

namespace {

// A rank's trace of a few minutes of operators runs to tens of megabytes; nlohmann::json needs
// about ten times a file's size in memory, so a larger file is refused rather than parsed
// (note "Bounded input" in base/bounded_input.h).
constexpr uint64_t kMaxRankTraceBytes = 512ull << 20;

nlohmann::json read_rank_trace(const std::string& path) {
  const detail::BoundedRead read = detail::read_bounded_file(path, kMaxRankTraceBytes);
  if (!read.problem.empty()) {
    throw Error("merge_trace_files: cannot read " + detail::said_of(path, read.problem) +
                ". Fix: record a shorter range (ProfileOptions::steps) or check the file.");
  }
  std::string problem;
  std::optional<nlohmann::json> trace = detail::parse_bounded_json(read.bytes, &problem);
  if (!trace || !trace->is_object() || !(*trace)["traceEvents"].is_array()) {
    throw Error("merge_trace_files: " + path + " is not a Chrome trace (" +
                (problem.empty() ? "no \"traceEvents\" list" : problem) +
                "). Likely cause: the file was cut short or is not a trace_rank file. Fix: record "
                "the trace again.");
  }
  return std::move(*trace);
}

// The ranks whose files are in `dir`, ascending.
std::vector<int> ranks_in(const std::string& dir) {
  static const std::regex name("trace_rank([0-9]{1,6})\\.json");
  std::vector<int> ranks;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(dir, error)) {
    std::smatch match;
    const std::string file = entry.path().filename().string();
    if (std::regex_match(file, match, name)) ranks.push_back(std::stoi(match[1].str()));
  }
  std::sort(ranks.begin(), ranks.end());
  return ranks;
}

}  // namespace

std::string trace_rank_file(const std::string& dir, int rank) {
  return dir + "/trace_rank" + std::to_string(rank) + ".json";
}

TraceMergeResult merge_trace_files(const std::string& dir, int num_ranks) {
  // A count no job reaches: beyond it each expected rank costs a lookup and a listed name, and a
  // typo (-n 2000000000) would run for hours and fill memory with "missing" names.
  constexpr int kMostRanks = 1 << 20;
  if (num_ranks < 0 || num_ranks > kMostRanks) {
    throw Error("merge_trace_files: " + std::to_string(num_ranks) + " ranks expected; give 0 " +
                "(merge the files found) to " + std::to_string(kMostRanks) + ".");
  }
  TraceMergeResult result;
  result.merged_file = dir + "/trace.json";
  std::vector<int> ranks;
  if (num_ranks > 0) {
    for (int r = 0; r < num_ranks; ++r) {
      if (std::filesystem::exists(trace_rank_file(dir, r))) {
        ranks.push_back(r);
      } else {
        result.missing_files.push_back(trace_rank_file(dir, r));
      }
    }
  } else {
    ranks = ranks_in(dir);
  }
  if (ranks.empty()) {
    throw Error("merge_trace_files: no trace_rank<r>.json in " + dir +
                ". Fix: give the folder Accelerator::profile wrote to (ProfileOptions::dir).");
  }
  nlohmann::json events = nlohmann::json::array();
  for (int rank : ranks) {
    nlohmann::json trace = read_rank_trace(trace_rank_file(dir, rank));
    // One process per rank, whatever pid the file used; its name is the rank's.
    events.push_back({{"ph", "M"},
                      {"name", "process_name"},
                      {"pid", rank},
                      {"tid", 0},
                      {"args", {{"name", "rank " + std::to_string(rank)}}}});
    events.push_back({{"ph", "M"},
                      {"name", "process_sort_index"},
                      {"pid", rank},
                      {"tid", 0},
                      {"args", {{"sort_index", rank}}}});
    for (auto& event : trace["traceEvents"]) {
      if (!event.is_object()) continue;
      if (event.value("ph", "") == "M" && (event.value("name", "") == "process_name" ||
                                           event.value("name", "") == "process_sort_index")) {
        continue;
      }
      event["pid"] = rank;
      events.push_back(std::move(event));
    }
    result.merged_ranks.push_back(rank);
  }
  const nlohmann::json merged = {{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}};
  if (!detail::write_file_atomically(result.merged_file, merged.dump())) {
    throw Error("merge_trace_files: cannot write " + result.merged_file +
                ". Likely cause: the folder is not writable or the disk is full. Fix: free space "
                "or give a writable ProfileOptions::dir.");
  }
  return result;
}

}  // namespace accelerant
