// What `accelerant report` shows, read from a run's folders: the trackers' scalars and config,
// the launcher's per-attempt logs and the checkpoints. Kept apart from the page so that the
// reading (and its error messages) can be understood, and changed, without the drawing.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace accelerant::cli {

/// Where `accelerant report` reads from; empty folders mean "look in the default places".
struct ReportInputs {
  std::string run_dir;          // the trackers' folder: <project_dir>/<project_name>
  std::string log_dir;          // accelerant launch --log_dir; default RUN_DIR/logs when present
  std::string checkpoints_dir;  // default: RUN_DIR, RUN_DIR/checkpoints, RUN_DIR/../checkpoints
};

/// One scalar tag's values by step; a step logged twice (a resumed run repeats the steps after
/// its checkpoint) keeps the later value.
using ScalarSeries = std::map<int64_t, double>;

/// The step-time breakdown of one rank (tags step_time/rank_<r>/<phase>_ms).
struct RankStepTime {
  int rank = 0;
  int64_t step = 0;                      // the step of the last logged values
  std::map<std::string, double> phases;  // phase name -> its last logged milliseconds
  double step_ms = 0;                    // the logged total, else the phases' sum
  double median_step_ms = 0;             // the median of all logged totals (the whole run)
  bool straggler = false;
};

/// One rank's output in one attempt of the launcher.
struct RankLog {
  int rank = 0;
  std::string stderr_path;
  std::string stderr_tail;    // its last lines
  std::string error_message;  // a torchrun-style error.json's message, when there is one
};

/// One start of the workers by the launcher (attempt_<n> in its log_dir).
struct Attempt {
  int index = 0;
  std::vector<RankLog> ranks;
};

/// One checkpoint_<n> folder and what its manifest says.
struct CheckpointRow {
  std::string name, path;
  int64_t step = -1, epoch = -1;  // -1: unknown (no readable manifest)
  std::string created;            // UTC, ISO 8601, from the manifest
  uint64_t bytes = 0;             // on disk, every file in the folder
  std::string problem;            // "" when its manifest reads; else why not
};

/// Everything the report shows.
struct RunReport {
  std::string run_dir, scalars_path, log_dir, checkpoints_dir;
  std::vector<std::pair<std::string, std::string>> config;  // the newest config, in its order
  int tracker_starts = 0;                       // config lines: 1 + the times the run was resumed
  std::map<std::string, ScalarSeries> scalars;  // every tag except the step-time ones
  std::vector<std::string> scalar_order;        // their tags in the order first logged
  std::vector<RankStepTime> step_times;         // by rank
  double median_rank_step_ms = 0;               // the straggler threshold's reference
  std::vector<Attempt> attempts;
  std::vector<CheckpointRow> checkpoints;
  std::vector<std::string> warnings;  // input that was skipped, said on the page
};

/// The phases of the step-time breakdown in the order they happen (and are stacked).
const std::vector<std::string>& step_time_phases();

/// Reads a run. Throws accelerant::Error saying what was looked for, where, and the fix when
/// RUN_DIR or a folder given explicitly is missing or holds no readable scalars.
RunReport read_run(const ReportInputs& inputs);

}  // namespace accelerant::cli
