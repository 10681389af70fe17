// The files of a profiler trace (docs/observability.md "Profiler traces"): each process writes
// `trace_rank<r>.json`; merge_trace_files joins them into `trace.json`, one process lane per rank.
// Needs no LibTorch: `accelerant trace merge DIR` runs it after a multi-machine run.
#pragma once
#include <string>
#include <vector>

namespace accelerant {

/// `<dir>/trace_rank<rank>.json`.
std::string trace_rank_file(const std::string& dir, int rank);

/// What merge_trace_files wrote and what it could not find.
struct TraceMergeResult {
  /// The merged file, `<dir>/trace.json`.
  std::string merged_file;
  /// The ranks whose files were merged, ascending.
  std::vector<int> merged_ranks;
  /// The rank files expected and not found (another machine's, without a shared folder).
  std::vector<std::string> missing_files;
};

/// Merges the rank files in `dir` into `<dir>/trace.json` (written atomically): each event keeps
/// its rank as pid, and each rank's process is named "rank <r>". `num_ranks` > 0 expects ranks
/// 0..num_ranks-1 and lists the missing ones; 0 merges the rank files found. Throws Error when a
/// file cannot be parsed or none is found, or when trace.json cannot be written.
TraceMergeResult merge_trace_files(const std::string& dir, int num_ranks = 0);

}  // namespace accelerant
