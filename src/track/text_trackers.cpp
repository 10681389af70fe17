// The CSV and JSON Lines trackers (docs/observability.md "Files").
#include <cmath>
#include <nlohmann/json.hpp>

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
      config_file.append(csv_field(name) + "," + csv_field(config_text(value)) + "\n");
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
      scalars_.append(std::to_string(step) + "," + csv_field(tag) + "," + format_scalar(value) +
                      "\n");
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
    drop_torn_last_line(run_dir + "/scalars.jsonl");
    file_.open(run_dir + "/scalars.jsonl", /*keep=*/true);  // a resumed run adds a config line
    file_.append(nlohmann::ordered_json{{"config", object}}.dump() + "\n");
    file_.flush();
  }
  void log(const TrackerScalars& values, int64_t step) override {
    auto scalars = nlohmann::ordered_json::object();
    for (const auto& [tag, value] : values) scalars[tag] = value;
    file_.append(nlohmann::ordered_json{{"step", step}, {"values", scalars}}.dump() + "\n");
    file_.flush_if_due(kTrackerFlushInterval);
  }
  void flush() override { file_.flush(); }
  void close() override { file_.close(); }

 private:
  AppendFile file_;
};

}  // namespace

std::shared_ptr<Tracker> make_csv_tracker() { return std::make_shared<CsvTracker>(); }
std::shared_ptr<Tracker> make_jsonl_tracker() { return std::make_shared<JsonlTracker>(); }

}  // namespace accelerant::detail
