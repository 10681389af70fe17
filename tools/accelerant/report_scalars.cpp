#include "report_scalars.h"

#include <accelerant/bounded_file.h>
#include <accelerant/error.h>
#include <accelerant/tracker.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <utility>

namespace accelerant::cli {

bool is_file(const std::string& path) {
  std::error_code ignored;
  return std::filesystem::is_regular_file(path, ignored);
}

namespace {

// A record is one line of a few hundred bytes; the trackers write none longer than this, so a
// longer one is not theirs and would only make the report slow or huge.
constexpr size_t kMaxLineBytes = kMaxTrackerLineBytes;
// A tracker file larger than this is not read (a million steps of ten tags is about 300 MB of CSV).
constexpr uint64_t kMaxScalarFileBytes = uint64_t{4} << 30;

// A tracker file of the run folder: a regular file, not a link (which could bring another file's
// text into a page people share), within a cap far above any run's scalars.
std::istringstream open_or_throw(const std::string& path) {
  const BoundedRead read = read_bounded_file(path, kMaxScalarFileBytes, Symlinks::kRefuse);
  if (!read.problem.empty()) {
    throw Error(
        "accelerant report: cannot read " + said_of(path, read.problem) +
        ". Fix: point the report at the run folder the trackers wrote, with its own files.");
  }
  return std::istringstream(read.bytes);
}

Error malformed(const std::string& where, const std::string& what) {
  return Error("accelerant report: " + where + " " + what +
               ". Likely cause: the file was edited, or is not one Accelerant's trackers wrote. "
               "Fix: repair or remove that line.");
}

std::string config_value_text(const nlohmann::ordered_json& value) {
  return value.is_string() ? value.get<std::string>() : value.dump();
}

// A line that is cut short can only be the last one, from a process killed while writing it
// (records are flushed whole): it is skipped with a warning, while a bad line elsewhere throws.
void read_jsonl(const std::string& path, TrackedScalars& out) {
  std::istringstream in = open_or_throw(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) {
    if (line.size() > kMaxLineBytes) {
      throw malformed(path + ":" + std::to_string(lines.size() + 1),
                      "has a line of " + std::to_string(line.size()) + " bytes");
    }
    lines.push_back(std::move(line));
  }
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string where = path + ":" + std::to_string(i + 1);
    if (lines[i].find_first_not_of(" \t\r") == std::string::npos) continue;
    // Ordered: the config table keeps the order init_trackers was given.
    const auto doc = nlohmann::ordered_json::parse(lines[i], nullptr, /*allow_exceptions=*/false);
    if (doc.is_discarded() || !doc.is_object()) {
      if (i + 1 == lines.size()) {
        out.warnings.push_back(where +
                               ": the last line is not a complete record (a process "
                               "stopped while writing it); skipped.");
        continue;
      }
      throw malformed(where, "is not a JSON object");
    }
    if (doc.contains("config")) {
      if (!doc["config"].is_object()) throw malformed(where, "has a \"config\" that is no object");
      ++out.config_lines;
      out.config.clear();  // a resumed run's config replaces the first one
      for (const auto& [name, value] : doc["config"].items()) {
        out.config.emplace_back(name, config_value_text(value));
      }
      continue;
    }
    if (!doc.contains("step") || !doc["step"].is_number_integer() || !doc.contains("values") ||
        !doc["values"].is_object()) {
      throw malformed(where, "is neither {\"config\":{...}} nor {\"step\":N,\"values\":{...}}");
    }
    const int64_t step = doc["step"].get<int64_t>();
    for (const auto& [tag, value] : doc["values"].items()) {
      // NaN and infinity were written as null: the step is kept as a gap in the curve.
      auto& series = out.tags[tag];
      if (series.empty()) out.tag_order.push_back(tag);
      series[step] = value.is_number() ? value.get<double>() : std::nan("");
    }
  }
}

// RFC 4180: fields separated by commas, quoted when they hold a comma, quote or line break, a
// quote inside doubled. Returns false at the end of the input.
bool next_csv_record(std::istream& in, std::vector<std::string>& fields, size_t& line) {
  fields.assign(1, "");
  bool quoted = false, any = false;
  for (int c; (c = in.get()) != EOF;) {
    any = true;
    if (quoted) {
      if (c == '"' && in.peek() == '"') {
        fields.back() += '"';
        in.get();
      } else if (c == '"') {
        quoted = false;
      } else {
        if (c == '\n') ++line;
        fields.back() += static_cast<char>(c);
      }
    } else if (c == '"') {
      quoted = true;
    } else if (c == ',') {
      fields.emplace_back();
    } else if (c == '\n') {
      ++line;
      return true;
    } else if (c != '\r') {
      fields.back() += static_cast<char>(c);
    }
    if (fields.back().size() > kMaxLineBytes) return true;
  }
  return any;
}

bool parse_number(const std::string& text, double& value) {
  if (text.empty()) return false;
  char* end = nullptr;
  value = std::strtod(text.c_str(), &end);
  return end == text.c_str() + text.size();
}

void read_csv(const std::string& path, TrackedScalars& out) {
  std::istringstream in = open_or_throw(path);
  std::vector<std::string> fields;
  size_t line = 1;
  bool header = true;
  while (true) {
    const size_t first_line = line;
    if (!next_csv_record(in, fields, line)) break;
    const std::string where = path + ":" + std::to_string(first_line);
    if (header) {
      header = false;
      if (fields == std::vector<std::string>{"step", "tag", "value"}) continue;
      throw malformed(where, "does not start with the header step,tag,value");
    }
    if (fields.size() == 1 && fields[0].empty()) continue;
    double step = 0, value = 0;
    if (fields.size() != 3 || !parse_number(fields[0], step) || !parse_number(fields[2], value)) {
      if (in.peek() == EOF) {
        out.warnings.push_back(where +
                               ": the last row is not a complete step,tag,value (a "
                               "process stopped while writing it); skipped.");
        break;
      }
      throw malformed(where, "is not a row step,tag,value");
    }
    auto& series = out.tags[fields[1]];
    if (series.empty()) out.tag_order.push_back(fields[1]);
    series[static_cast<int64_t>(step)] = value;  // strtod reads nan and inf too
  }
}

void read_config_csv(const std::string& path, TrackedScalars& out) {
  std::istringstream in = open_or_throw(path);
  std::vector<std::string> fields;
  size_t line = 1;
  bool header = true;
  while (next_csv_record(in, fields, line)) {
    if (std::exchange(header, false) || (fields.size() == 1 && fields[0].empty())) continue;
    if (fields.size() != 2) throw malformed(path, "has a row that is not name,value");
    out.config.emplace_back(fields[0], fields[1]);
  }
  out.config_lines = 1;
}

}  // namespace

TrackedScalars read_tracked_scalars(const std::string& run_dir) {
  TrackedScalars out;
  const std::string jsonl = run_dir + "/scalars.jsonl", csv = run_dir + "/scalars.csv";
  // JSON Lines first: it holds the config and every resume's, and its nulls keep NaN apart.
  if (is_file(jsonl)) {
    out.path = jsonl;
    read_jsonl(jsonl, out);
  } else if (is_file(csv)) {
    out.path = csv;
    read_csv(csv, out);
    if (is_file(run_dir + "/config.csv")) read_config_csv(run_dir + "/config.csv", out);
  } else {
    // The common slip is passing the project_dir, which holds the run folder: name it.
    std::string hint;
    std::error_code ignored;
    for (const auto& entry : std::filesystem::directory_iterator(run_dir, ignored)) {
      const std::string sub = entry.path().string();
      if (is_file(sub + "/scalars.jsonl") || is_file(sub + "/scalars.csv")) {
        hint = " It has a run folder inside: try `accelerant report " + sub + "`.";
        break;
      }
    }
    throw Error("accelerant report: " + run_dir + " has no scalars: looked for " + jsonl + " and " +
                csv + "." + hint +
                " Likely cause: the run logged with no text tracker (TensorBoard's event files "
                "are not read), or this is not the folder init_trackers wrote. Fix: run with "
                "log_with including \"jsonl\" or \"csv\" (e.g. fashion_mnist --log_with "
                "jsonl), and pass <project_dir>/<project_name>.");
  }
  return out;
}

}  // namespace accelerant::cli
