// The CSV and JSON Lines trackers (docs/observability.md "Files").
#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "accelerant/error.h"
#include "track/builtin_trackers.h"
#include "track/tracker_files.h"

namespace accelerant::detail {
namespace {

// RFC 4180: a field with a comma, quote or line break is quoted, quotes doubled.
std::string csv_field(const std::string& text) {
  if (text.find_first_of(",\"\r\n") == std::string::npos) return text;
  std::string quoted = "\"";
  for (char c : text) {
    if (c == '"') quoted += '"';
    quoted += c;
  }
  return quoted + "\"";
}

std::string config_text(const TrackerValue& value) {
  return value.is_number() ? format_scalar(value.number()) : value.text();
}

// The lines the trackers write (without their newline), built in one place so that
// check_tracker_record measures exactly what is written.
std::string csv_scalar_row(int64_t step, const std::string& tag, double value) {
  return std::to_string(step) + "," + csv_field(tag) + "," + format_scalar(value);
}

std::string csv_config_row(const std::string& name, const TrackerValue& value) {
  return csv_field(name) + "," + csv_field(config_text(value));
}

std::string jsonl_scalars_line(const TrackerScalars& values, int64_t step) {
  auto scalars = nlohmann::ordered_json::object();
  for (const auto& [tag, value] : values) scalars[tag] = value;
  return nlohmann::ordered_json{{"step", step}, {"values", scalars}}.dump();
}

std::string jsonl_config_line(const TrackerConfig& config) {
  auto object = nlohmann::ordered_json::object();
  for (const auto& [name, value] : config) {
    const double number = value.number();
    if (value.is_number() && std::nearbyint(number) == number && std::abs(number) < 9.0e15) {
      object[name] = static_cast<int64_t>(number);  // 64, not 64.0
    } else if (value.is_number()) {
      object[name] = number;
    } else {
      object[name] = value.text();
    }
  }
  return nlohmann::ordered_json{{"config", object}}.dump();
}

[[noreturn]] void refuse_long_line(const std::string& who, const std::string& what, size_t bytes,
                                   size_t longest_name, const std::string& fix) {
  throw Error(who + ": " + what + " would be a line of " + std::to_string(bytes) +
              " bytes (its longest name has " + std::to_string(longest_name) +
              " bytes), over the " + std::to_string(kMaxTrackerLineBytes) +
              "-byte line limit of the trackers' files (kMaxTrackerLineBytes), which `accelerant "
              "report` reads back. Nothing was written. Fix: " +
              fix);
}

// Long format (one row per scalar) rather than one column per tag: the set of tags may grow
// during a run (accuracy appears only at the end of an epoch), and a header written at the first
// row could not name them without rewriting the file.
class CsvTracker : public Tracker {
 public:
  void init(const std::string& run_dir, const TrackerConfig& config) override {
    AppendFile config_file;
    config_file.open(run_dir + "/config.csv");
    config_file.append("name,value\n");
    for (const auto& [name, value] : config) {
      config_file.append(csv_config_row(name, value) + "\n");
    }
    config_file.close();
    // Kept: a resumed run (auto_resume) continues the same file; the header only when new.
    drop_torn_last_line(run_dir + "/scalars.csv");
    if (scalars_.open(run_dir + "/scalars.csv", /*keep=*/true) == 0) {
      scalars_.append("step,tag,value\n");
    }
    scalars_.flush();
  }
  void log(const TrackerScalars& values, int64_t step) override {
    for (const auto& [tag, value] : values) {
      scalars_.append(csv_scalar_row(step, tag, value) + "\n");
    }
    scalars_.flush_if_due(kTrackerFlushInterval);
  }
  void flush() override { scalars_.flush(); }
  void close() override { scalars_.close(); }

 private:
  AppendFile scalars_;
};

// JSON has no NaN or infinity: nlohmann writes them as null.
class JsonlTracker : public Tracker {
 public:
  void init(const std::string& run_dir, const TrackerConfig& config) override {
    drop_torn_last_line(run_dir + "/scalars.jsonl");
    file_.open(run_dir + "/scalars.jsonl", /*keep=*/true);  // a resumed run adds a config line
    file_.append(jsonl_config_line(config) + "\n");
    file_.flush();
  }
  void log(const TrackerScalars& values, int64_t step) override {
    file_.append(jsonl_scalars_line(values, step) + "\n");
    file_.flush_if_due(kTrackerFlushInterval);
  }
  void flush() override { file_.flush(); }
  void close() override { file_.close(); }

 private:
  AppendFile file_;
};

}  // namespace

void check_tracker_record(const TrackerScalars& values, int64_t step, const std::string& who) {
  size_t longest_tag = 0, longest_row = 0;
  for (const auto& [tag, value] : values) {
    longest_tag = std::max(longest_tag, tag.size());
    longest_row = std::max(longest_row, csv_scalar_row(step, tag, value).size());
  }
  // Cheap first: a record far below the limit is not serialised twice.
  size_t bound = 64;
  for (const auto& [tag, value] : values) bound += 6 * tag.size() + 40;
  if (bound <= kMaxTrackerLineBytes && longest_row <= kMaxTrackerLineBytes) return;
  const size_t bytes = std::max(longest_row, jsonl_scalars_line(values, step).size());
  if (bytes <= kMaxTrackerLineBytes) return;
  refuse_long_line(who, "this record of " + std::to_string(values.size()) + " scalars", bytes,
                   longest_tag,
                   "use short tags (a tag names a scalar, e.g. \"train/loss\"), or split the "
                   "scalars across log calls.");
}

void check_tracker_config(const TrackerConfig& config, const std::string& who) {
  size_t longest_name = 0, bytes = jsonl_config_line(config).size();
  for (const auto& [name, value] : config) {
    longest_name = std::max(longest_name, name.size());
    bytes = std::max(bytes, csv_config_row(name, value).size());
  }
  if (bytes <= kMaxTrackerLineBytes) return;
  refuse_long_line(who, "the config of " + std::to_string(config.size()) + " values", bytes,
                   longest_name,
                   "keep hyper-parameters short (a path or a name, not a file's content); save "
                   "large values as files of the run folder instead.");
}

std::shared_ptr<Tracker> make_csv_tracker() { return std::make_shared<CsvTracker>(); }
std::shared_ptr<Tracker> make_jsonl_tracker() { return std::make_shared<JsonlTracker>(); }

}  // namespace accelerant::detail
