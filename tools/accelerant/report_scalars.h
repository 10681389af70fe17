// Reading the text trackers' files (docs/observability.md "Files") back: scalars.jsonl, else
// scalars.csv with config.csv. An independent reader of what src/track/text_trackers.cpp writes,
// on the CLI's side so that the report needs neither LibTorch nor the library's internals.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace accelerant::cli {

/// A run's scalars and config as its trackers wrote them.
struct TrackedScalars {
  std::string path;  // the file read
  std::vector<std::pair<std::string, std::string>> config;
  int config_lines = 0;                                   // 1 + the resumes (jsonl only)
  std::map<std::string, std::map<int64_t, double>> tags;  // later values for a step win
  std::vector<std::string> tag_order;                     // as first logged: loss before accuracy
  std::vector<std::string> warnings;                      // skipped input
};

/// RUN_DIR/scalars.jsonl, else RUN_DIR/scalars.csv (+ config.csv). Throws accelerant::Error
/// naming the files looked for when there is neither, or the line of a malformed record.
TrackedScalars read_tracked_scalars(const std::string& run_dir);

// Whether `path` is a regular file (false, not an exception, when it cannot be examined).
bool is_file(const std::string& path);

}  // namespace accelerant::cli
