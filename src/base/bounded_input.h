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

#include "accelerant/bounded_file.h"

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

// The file readers themselves are public (accelerant/bounded_file.h): the CLI reads run folders
// with them too.
using accelerant::BoundedRead;
using accelerant::read_bounded_file;
using accelerant::read_file_tail;
using accelerant::said_of;
using accelerant::Symlinks;

/// Parses `text` as JSON after the nesting check. On failure returns nullopt and sets
/// `*problem` ("it nests ... deep ...", or "it is not valid JSON (<parser message>)").
std::optional<nlohmann::json> parse_bounded_json(std::string_view text, std::string* problem,
                                                 int max_depth = kMaxNestingDepth);

}  // namespace accelerant::detail
