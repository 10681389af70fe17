// jsonl_files: JSON Lines files as a RecordSource. Lines are read within a length bound and
// parsed within the nesting bound (the note "Bounded input" in base/bounded_input.h).
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>

#include "accelerant/stream_loader.h"
#include "base/bounded_input.h"
#include "base/text.h"

namespace accelerant {
namespace {

class JsonLinesReader : public RecordReader {
 public:
  JsonLinesReader(std::string path, const ShardCursor& from, int64_t max_line_bytes)
      : path_(std::move(path)), cursor_(from), max_line_bytes_(max_line_bytes) {
    file_ = std::fopen(path_.c_str(), "rb");
    if (!file_) {
      throw Error(detail::str("jsonl_files: cannot open ", path_, " (", std::strerror(errno),
                              "). Fix: check the path, and that every shard exists and is ",
                              "readable on every process."));
    }
    if (from.byte_offset > 0 && ::fseeko(file_, static_cast<off_t>(from.byte_offset), SEEK_SET)) {
      throw Error(detail::str("jsonl_files: cannot seek to byte ", from.byte_offset, " of ", path_,
                              " (", std::strerror(errno), ") to resume there. Likely cause: ",
                              "the file changed since the checkpoint. Fix: resume with the same ",
                              "files."));
    }
  }
  ~JsonLinesReader() override { std::fclose(file_); }
  JsonLinesReader(const JsonLinesReader&) = delete;
  JsonLinesReader& operator=(const JsonLinesReader&) = delete;

  bool next(RawRecord& record) override {
    for (;;) {
      std::string line;
      bool newline = false;
      int c;
      while ((c = getc_unlocked(file_)) != EOF) {
        if (c == '\n') {
          newline = true;
          break;
        }
        if (static_cast<int64_t>(line.size()) >= max_line_bytes_) too_long();
        line.push_back(static_cast<char>(c));
      }
      if (std::ferror(file_)) {
        throw Error(detail::str("jsonl_files: reading ", path_, " failed at line ",
                                cursor_.lines + 1, " (", std::strerror(errno), ")."));
      }
      if (!newline && line.empty()) return false;  // the end of the file
      ++cursor_.lines;
      cursor_.byte_offset += static_cast<int64_t>(line.size()) + (newline ? 1 : 0);
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line.find_first_not_of(" \t") == std::string::npos) continue;  // blank
      ++cursor_.records;
      record.text = std::move(line);
      record.line = cursor_.lines;
      return true;
    }
  }

  ShardCursor cursor() const override { return cursor_; }

 private:
  [[noreturn]] void too_long() const {
    throw Error(detail::str(path_, ":", cursor_.lines + 1, ": the line is longer than ",
                            max_line_bytes_, " bytes (JsonLinesOptions::max_line_bytes). Likely ",
                            "cause: not a JSON Lines file (one JSON value per line). Fix: check ",
                            "the file, or raise max_line_bytes for records that long."));
  }

  std::string path_;
  ShardCursor cursor_;
  int64_t max_line_bytes_;
  std::FILE* file_ = nullptr;
};

}  // namespace

RecordSource jsonl_files(std::vector<std::string> paths,
                         std::function<Batch(const nlohmann::json& record)> parse,
                         JsonLinesOptions options) {
  if (!parse) {
    throw Error(
        "jsonl_files: the parse function is empty. Fix: pass a function that turns one "
        "record (a nlohmann::json) into a Batch of one sample.");
  }
  if (options.max_line_bytes() < 1) {
    throw Error(detail::str("JsonLinesOptions::max_line_bytes is ", options.max_line_bytes(),
                            ". Fix: use 1 or more."));
  }
  RecordSource source;
  source.shards = std::move(paths);
  const int64_t max_line = options.max_line_bytes();
  auto shards = source.shards;
  source.open = [shards, max_line](size_t index, const ShardCursor& from) {
    return std::make_unique<JsonLinesReader>(shards.at(index), from, max_line);
  };
  // The stream adds the file and line to what this throws.
  source.parse = [parse = std::move(parse)](const RawRecord& record) {
    std::string problem;
    auto value = detail::parse_bounded_json(record.text, &problem);
    if (!value) throw Error(detail::str(problem, ". Fix: one JSON value per line."));
    try {
      return parse(*value);
    } catch (const nlohmann::json::exception& e) {
      throw Error(detail::str("the parse function rejected the record (", e.what(),
                              "). Likely cause: a missing or mistyped field. Fix: correct the ",
                              "record, or make the parse function accept it."));
    }
  };
  return source;
}

}  // namespace accelerant
