// Reading files that may be hostile (a damaged disk, a file from the internet, a typo that points
// at a 50 GB file): see the note "Bounded input" below, which every JSON and YAML reader follows.
//
// Note "Bounded input": nlohmann::json and yaml-cpp build one node per value and walk nested
// values recursively, so a file of a few megabytes of '[' can take gigabytes and overflow the
// stack (SIGSEGV) before any error is thrown. Every file Accelerant parses as JSON or YAML is
// therefore first checked here: its size against a cap chosen per format (the formats' docs
// give the caps) and its nesting depth against kMaxNestingDepth, by a linear scan that skips
// strings. Only then is it parsed. The callers turn the problem text into their own typed error
// (CheckpointError, ConfigError), which names the file.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

namespace accelerant::detail {

/// The deepest nesting of lists and mappings accepted in a JSON or YAML file. Accelerant's own
/// files nest at most 4 deep; safetensors headers 3.
constexpr int kMaxNestingDepth = 64;

/// The syntax whose strings and comments a nesting scan skips.
enum class Syntax { kJson, kYaml };

/// "" when `text` nests lists and mappings at most `max_depth` deep; otherwise what was found
/// and where, e.g. "it nests lists and mappings more than 64 deep (at byte 65)". Brackets inside
/// strings (and, for YAML, comments) do not count. Linear time, no allocation.
std::string nesting_problem(std::string_view text, Syntax syntax, int max_depth = kMaxNestingDepth);

/// Whether a symbolic link is read through or refused.
enum class Symlinks { kFollow, kRefuse };

/// A whole file read within a size cap: its bytes, or why there are none.
struct BoundedRead {
  std::string bytes;
  /// "" on success; else the reason, starting with "it": "it does not exist", "it is a
  /// directory", "it cannot be read (Permission denied)", "it has 52428800 bytes, more than the
  /// limit of 1048576", "it is a symbolic link".
  std::string problem;
  /// The errno behind `problem`, 0 when there is none (a size or type problem).
  int error = 0;
};

/// Reads `path`, a regular file of at most `max_bytes` bytes. The size is checked with fstat
/// before anything is allocated, and again while reading (the file may grow).
BoundedRead read_bounded_file(const std::string& path, uint64_t max_bytes,
                              Symlinks symlinks = Symlinks::kFollow);

/// A problem above said of `subject`: ("manifest.json", "it is a directory") -> "manifest.json is
/// a directory".
std::string said_of(const std::string& subject, const std::string& problem);

/// Parses `text` as JSON after the nesting check. On failure returns nullopt and sets
/// `*problem` ("it nests ... deep ...", or "it is not valid JSON (<parser message>)").
std::optional<nlohmann::json> parse_bounded_json(std::string_view text, std::string* problem,
                                                 int max_depth = kMaxNestingDepth);

}  // namespace accelerant::detail
