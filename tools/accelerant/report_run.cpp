#include "report_run.h"

#include <accelerant/bounded_file.h>
#include <accelerant/checkpoint.h>
#include <accelerant/error.h>
#include <accelerant/metrics.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "report_scalars.h"

namespace accelerant::cli {
namespace {

namespace fs = std::filesystem;

// Enough of a failed rank's stderr to show its error and what led to it, not its whole log.
constexpr size_t kTailLines = 12;
constexpr uint64_t kTailBytes = 16 * 1024;
constexpr uint64_t kMaxErrorFileBytes = 1 << 20;

bool is_directory(const std::string& path) {
  std::error_code ignored;
  return fs::is_directory(path, ignored);
}

// n of "<prefix><n><suffix>", or -1.
int64_t number_in(const std::string& name, const std::string& prefix, const std::string& suffix) {
  if (name.size() <= prefix.size() + suffix.size() || name.compare(0, prefix.size(), prefix) != 0 ||
      name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) {
    return -1;
  }
  const std::string digits =
      name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
  if (digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos) return -1;
  return std::stoll(digits);
}

// The lower middle for an even count: with two ranks the median is then the faster one's time,
// so one slow rank of two is still seen 20 % above it.
double low_median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  return values[(values.size() - 1) / 2];
}

// The median as the library takes it (the mean of the middle two for an even count).
double median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t mid = values.size() / 2;
  return values.size() % 2 ? values[mid] : (values[mid - 1] + values[mid]) / 2;
}

// The value at the last step that has a number (NaN steps are gaps), with that step.
bool last_value(const ScalarSeries& series, int64_t& step, double& value) {
  for (auto it = series.rbegin(); it != series.rend(); ++it) {
    if (!std::isnan(it->second)) {
      step = it->first;
      value = it->second;
      return true;
    }
  }
  return false;
}

// Splits the scalars into curves and the step-time breakdown (step_time/rank_<r>/<phase>_ms).
void take_step_times(std::map<std::string, ScalarSeries>& tags, RunReport& report) {
  std::map<int, RankStepTime> ranks;
  std::map<int, std::vector<double>> totals;
  int64_t logged_straggler_step = 0;
  double logged_straggler = -2;  // -2: the run did not log step_time/straggler
  for (auto it = tags.begin(); it != tags.end();) {
    const std::string& tag = it->first;
    if (tag.rfind("step_time/", 0) != 0) {
      report.scalars.insert(std::move(*it));
      it = tags.erase(it);
      continue;
    }
    if (tag == "step_time/straggler") {  // the library's own verdict at each exchange
      if (!last_value(it->second, logged_straggler_step, logged_straggler)) logged_straggler = -2;
      it = tags.erase(it);
      continue;
    }
    const size_t slash = tag.find('/', 10);
    const int64_t rank =
        slash == std::string::npos ? -1 : number_in(tag.substr(10, slash - 10), "rank_", "");
    const std::string leaf = slash == std::string::npos ? "" : tag.substr(slash + 1);
    if (rank < 0 || leaf.size() <= 3 || leaf.compare(leaf.size() - 3, 3, "_ms") != 0) {
      report.warnings.push_back("the tag " + tag +
                                " is not step_time/rank_<r>/<phase>_ms; not shown.");
      it = tags.erase(it);
      continue;
    }
    RankStepTime& r = ranks[static_cast<int>(rank)];
    r.rank = static_cast<int>(rank);
    const std::string phase = leaf.substr(0, leaf.size() - 3);
    int64_t step = 0;
    double value = 0;
    if (last_value(it->second, step, value)) {
      if (phase == "step") {
        r.step_ms = value;
        r.step = step;
        for (const auto& [s, v] : it->second) {
          if (!std::isnan(v)) totals[r.rank].push_back(v);
        }
      } else {
        r.phases[phase] = value;
        r.step = std::max(r.step, step);
      }
    }
    it = tags.erase(it);
  }
  std::vector<double> rank_totals;
  for (auto& [rank, r] : ranks) {
    if (r.step_ms == 0) {  // no total logged: the phases are all there is
      for (const auto& [phase, ms] : r.phases) r.step_ms += ms;
    }
    r.median_step_ms = totals.count(rank) ? low_median(totals[rank]) : r.step_ms;
    rank_totals.push_back(r.step_ms);
  }
  report.median_rank_step_ms = low_median(rank_totals);
  // The library's rule (src/accelerator/step_breakdown.h), for runs logged without its verdict:
  // busy time (the step minus the all-reduce wait, where the others wait for a slow rank) at
  // least 20 % above the median of the other ranks'.
  auto busy = [](const RankStepTime& r) {
    const auto wait = r.phases.find("all_reduce");
    return r.step_ms - (wait == r.phases.end() ? 0 : wait->second);
  };
  for (auto& [rank, r] : ranks) {
    if (logged_straggler > -2) {
      r.straggler = static_cast<int>(logged_straggler) == rank;
    } else {
      std::vector<double> others;
      for (const auto& [other_rank, other] : ranks)
        if (other_rank != rank) others.push_back(busy(other));
      const double typical = median(std::move(others));
      // The library's rule (accelerant/metrics.h), for runs that did not log its verdict.
      r.straggler = typical > 0 && busy(r) - typical >= kStragglerThreshold * typical &&
                    busy(r) - typical >= kStragglerMinExcess.count();
    }
    report.step_times.push_back(r);
  }
}

// A rank's log in the run folder: the tail of a regular file that is not a link (a link to
// /etc/shadow would be copied into the page; /dev/zero would be read without end). What is not
// shown says why.
std::string tail_of(const std::string& path) {
  BoundedRead read = read_file_tail(path, kTailBytes, Symlinks::kRefuse);
  if (!read.problem.empty()) return "(not shown: " + said_of(path, read.problem) + ")";
  std::string text = std::move(read.bytes);
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
  size_t start = text.size(), lines = 0;
  while (start > 0 && lines < kTailLines) {
    start = text.rfind('\n', start - 1);
    if (start == std::string::npos) {
      start = 0;
      break;
    }
    ++lines;
  }
  return text.substr(start == 0 ? 0 : start + 1);
}

// torchrun's error file (TORCHELASTIC_ERROR_FILE, which Accelerant's workers also write): JSON
// whose "message" is the text, or an object holding it.
std::string error_file_message(const std::string& path) {
  const BoundedRead read = read_bounded_file(path, kMaxErrorFileBytes, Symlinks::kRefuse);
  if (!read.problem.empty()) return "(not shown: " + said_of(path, read.problem) + ")";
  const std::string& text = read.bytes;
  const auto doc = nlohmann::json::parse(text, nullptr, false);
  if (doc.is_discarded() || !doc.is_object() || !doc.contains("message")) return text;
  const auto& message = doc["message"];
  if (message.is_string()) return message.get<std::string>();
  if (message.is_object() && message.contains("message") && message["message"].is_string()) {
    return message["message"].get<std::string>();
  }
  return message.dump();
}

// attempt_<n>/rank_<r>.stderr as accelerant launch --log_dir writes them (launch/output_relay);
// attempt_<n>/<r>/stderr.log and error.json as torchrun's --log_dir does.
std::vector<Attempt> read_attempts(const std::string& log_dir) {
  std::vector<Attempt> attempts;
  std::error_code ignored;
  for (const auto& entry : fs::directory_iterator(log_dir, ignored)) {
    const int64_t n = number_in(entry.path().filename().string(), "attempt_", "");
    if (n < 0 || !entry.is_directory(ignored)) continue;
    Attempt attempt;
    attempt.index = static_cast<int>(n);
    std::map<int, RankLog> ranks;
    for (const auto& file : fs::directory_iterator(entry.path(), ignored)) {
      const std::string name = file.path().filename().string(), path = file.path().string();
      int64_t r = number_in(name, "rank_", ".stderr");
      if (r < 0) r = number_in(name, "rank_", ".stdout");
      if (r >= 0) {
        ranks[r].rank = static_cast<int>(r);
        if (name.size() > 7 && name.compare(name.size() - 7, 7, ".stderr") == 0) {
          ranks[r].stderr_path = path;
          ranks[r].stderr_tail = tail_of(path);
        }
        continue;
      }
      r = number_in(name, "", "");
      if (r >= 0 && is_directory(path)) {
        ranks[r].rank = static_cast<int>(r);
        if (is_file(path + "/stderr.log")) {
          ranks[r].stderr_path = path + "/stderr.log";
          ranks[r].stderr_tail = tail_of(path + "/stderr.log");
        }
        if (is_file(path + "/error.json")) {
          ranks[r].error_message = error_file_message(path + "/error.json");
        }
      }
    }
    for (auto& [r, log] : ranks) attempt.ranks.push_back(std::move(log));
    attempts.push_back(std::move(attempt));
  }
  std::sort(attempts.begin(), attempts.end(),
            [](const Attempt& a, const Attempt& b) { return a.index < b.index; });
  return attempts;
}

uint64_t bytes_under(const std::string& dir) {
  uint64_t total = 0;
  std::error_code ignored;
  for (const auto& entry : fs::recursive_directory_iterator(dir, ignored)) {
    if (entry.is_regular_file(ignored)) total += entry.file_size(ignored);
  }
  return total;
}

bool has_checkpoint_dirs(const std::string& dir) {
  std::error_code ignored;
  for (const auto& entry : fs::directory_iterator(dir, ignored)) {
    if (checkpoint_iteration(entry.path().filename().string()) >= 0) return true;
  }
  return false;
}

// Every checkpoint_<n>, complete or not: an incomplete one says a save was cut short.
std::vector<CheckpointRow> read_checkpoints(const std::string& dir) {
  std::vector<std::pair<int64_t, CheckpointRow>> found;
  std::error_code ignored;
  for (const auto& entry : fs::directory_iterator(dir, ignored)) {
    const std::string name = entry.path().filename().string();
    const int64_t n = checkpoint_iteration(name);
    if (n < 0 || !entry.is_directory(ignored)) continue;
    CheckpointRow row;
    row.name = name;
    row.path = entry.path().string();
    row.bytes = bytes_under(row.path);
    if (!is_file(row.path + "/manifest.json")) {
      row.problem = "incomplete: no manifest.json (a save that never finished)";
    } else {
      try {
        const CheckpointManifest m = read_checkpoint_manifest(row.path);
        row.step = m.step;
        row.epoch = m.epoch;
        row.created = m.created;
      } catch (const Error& e) {
        row.problem = e.what();
      }
    }
    found.emplace_back(n, std::move(row));
  }
  std::sort(found.begin(), found.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<CheckpointRow> rows;
  for (auto& [n, row] : found) rows.push_back(std::move(row));
  return rows;
}

// fashion_mnist and the Accelerator put checkpoints in <project_dir>/checkpoints and the
// trackers in <project_dir>/<project_name>, so a run's checkpoints are usually its parent's.
std::string find_checkpoints_dir(const ReportInputs& in) {
  if (!in.checkpoints_dir.empty()) {
    if (!is_directory(in.checkpoints_dir)) {
      throw Error("accelerant report: --checkpoints " + in.checkpoints_dir +
                  " is not a directory. Fix: pass the folder that holds the checkpoint_<n> "
                  "folders (<project_dir>/checkpoints) or the project_dir.");
    }
    const std::string inner = in.checkpoints_dir + "/checkpoints";
    return !has_checkpoint_dirs(in.checkpoints_dir) && has_checkpoint_dirs(inner)
               ? inner
               : in.checkpoints_dir;
  }
  const std::string parent = fs::path(in.run_dir).lexically_normal().parent_path().string();
  for (const std::string& dir : {in.run_dir, in.run_dir + "/checkpoints",
                                 (parent.empty() ? "." : parent) + "/checkpoints"}) {
    if (has_checkpoint_dirs(dir)) return dir;
  }
  return "";
}

}  // namespace

const std::vector<std::string>& step_time_phases() {
  static const std::vector<std::string> kPhases = {"data", "forward_backward", "all_reduce",
                                                   "optimizer", "other"};
  return kPhases;
}

RunReport read_run(const ReportInputs& inputs) {
  if (!is_directory(inputs.run_dir)) {
    throw Error("accelerant report: the run folder " + inputs.run_dir +
                " does not exist or is not a directory. Fix: pass the folder the trackers wrote, "
                "<project_dir>/<project_name> (e.g. runs/a/fashion_mnist).");
  }
  RunReport report;
  report.run_dir = inputs.run_dir;
  TrackedScalars tracked = read_tracked_scalars(inputs.run_dir);
  report.scalars_path = tracked.path;
  report.config = std::move(tracked.config);
  report.tracker_starts = tracked.config_lines;
  report.warnings = std::move(tracked.warnings);
  take_step_times(tracked.tags, report);
  for (const auto& tag : tracked.tag_order) {
    if (report.scalars.count(tag)) report.scalar_order.push_back(tag);
  }

  report.log_dir = inputs.log_dir;
  if (report.log_dir.empty() && is_directory(inputs.run_dir + "/logs")) {
    report.log_dir = inputs.run_dir + "/logs";
  }
  if (!report.log_dir.empty()) {
    if (!is_directory(report.log_dir)) {
      throw Error("accelerant report: --log_dir " + report.log_dir +
                  " is not a directory. Fix: pass the folder given to accelerant launch "
                  "--log_dir (it holds attempt_<n> folders).");
    }
    report.attempts = read_attempts(report.log_dir);
    if (report.attempts.empty()) {
      report.warnings.push_back(report.log_dir +
                                " holds no attempt_<n> folders: no launcher logs shown.");
    }
  }
  report.checkpoints_dir = find_checkpoints_dir(inputs);
  if (!report.checkpoints_dir.empty())
    report.checkpoints = read_checkpoints(report.checkpoints_dir);
  return report;
}

}  // namespace accelerant::cli
