#include "accelerant/config.h"

#include <sys/stat.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>

#include "accelerant/environment.h"
#include "accelerant/error.h"
#include "base/bounded_input.h"
#include "base/file_io.h"
#include "base/text.h"

namespace accelerant {
namespace {

// A config file is about 1 KB; anything over this is not one (docs/cli.md "Config files"), and is
// refused before it is read (note "Bounded input" in base/bounded_input.h).
constexpr uint64_t kMaxConfigBytes = 1u << 20;

// How one key is read from YAML into a Config and written back.
struct Field {
  const char* key;
  const char* type;  // for messages: "a whole number", "true or false", ...
  std::function<void(const YAML::Node&, Config&)> read;
  std::function<std::string(const Config&)> write;
  bool says_why = false;  // read throws an Error whose message names the key and the problem
};

template <class T>
Field field(const char* key, const char* type, T Config::*member) {
  return {key, type,
          [member, key](const YAML::Node& node, Config& c) {
            if constexpr (std::is_same_v<T, bool>) {
              c.*member = parse_bool(node.Scalar(),
                                     key);  // the one bool parser (it takes YAML 1.1 spellings too)
            } else {
              c.*member = node.as<T>();
            }
          },
          [member](const Config& c) {
            std::ostringstream out;
            if constexpr (std::is_same_v<T, std::string>) {
              out << '"' << c.*member << '"';  // quoted: YAML 1.1 readers take a bare no for false
            } else if constexpr (std::is_same_v<T, bool>) {
              out << (c.*member ? "true" : "false");
            } else {
              out << c.*member;
            }
            return out.str();
          }};
}

// Recovery: text in the file, the enum in Config (parse_recovery, the one parser).
Field recovery_field(const char* key, Recovery Config::*member) {
  return {key, "restart_group or replace_failed_worker",
          [member, key](const YAML::Node& node, Config& c) {
            c.*member = parse_recovery(node.Scalar(), key);
          },
          [member](const Config& c) { return std::string(to_string(c.*member)); }, true};
}

// Mixed precision: text in the file, the enum in Config (parse_mixed_precision, the one parser).
Field precision_field(const char* key, MixedPrecision Config::*member) {
  return {key, "no, fp16 or bf16",
          [member, key](const YAML::Node& node, Config& c) {
            c.*member = parse_mixed_precision(node.Scalar(), key);
          },
          // Quoted: a YAML 1.1 reader takes a bare no for false.
          [member](const Config& c) { return detail::str('"', to_string(c.*member), '"'); }, true};
}

// A duration: seconds in the file, std::chrono in Config (seconds_to_duration, the one converter).
Field seconds_field(const char* key, std::chrono::milliseconds Config::*member) {
  return {key, "a number of seconds",
          [member, key](const YAML::Node& node, Config& c) {
            c.*member = seconds_to_duration(node.as<double>(), key);
          },
          [member](const Config& c) { return duration_to_seconds_text(c.*member); }, true};
}

constexpr const char* kBoolType = "true or false (also 1/0, yes/no, y/n, on/off)";

const std::vector<Field>& fields() {
  static const std::vector<Field> all = {
      field("config_version", "a whole number", &Config::config_version),
      field("num_nodes", "a whole number", &Config::num_nodes),
      field("min_nodes", "a whole number", &Config::min_nodes),
      field("node_rank", "a whole number", &Config::node_rank),
      field("master_addr", "a host name or address", &Config::master_addr),
      field("master_port", "a port number", &Config::master_port),
      field("world_size", "a whole number", &Config::world_size),
      precision_field("mixed_precision", &Config::mixed_precision),
      field("downcast_bf16", kBoolType, &Config::downcast_bf16),
      field("cpu", kBoolType, &Config::cpu),
      field("debug", kBoolType, &Config::debug),
      field("max_restarts", "a whole number", &Config::max_restarts),
      recovery_field("recovery", &Config::recovery),
      seconds_field("monitor_interval", &Config::monitor_interval),
      seconds_field("join_timeout", &Config::join_timeout),
      seconds_field("rejoin_timeout", &Config::rejoin_timeout),
      seconds_field("collective_timeout", &Config::collective_timeout),
      field("threads_per_process", "a whole number", &Config::threads_per_process),
      field("gradient_accumulation_steps", "a whole number", &Config::gradient_accumulation_steps),
  };
  return all;
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

// The closest key or alias: a misspelt Accelerate name is answered with that name, which is read.
std::string closest_key(const std::string& unknown) {
  std::vector<std::string> candidates = config_keys();
  for (const auto& a : key_aliases()) candidates.push_back(a.alias);
  std::string best;
  size_t best_distance = SIZE_MAX;
  for (const auto& candidate : candidates) {
    const size_t d = edit_distance(unknown, candidate);
    if (d < best_distance) {
      best_distance = d;
      best = candidate;
    }
  }
  return best;
}

std::string position(const YAML::Mark& mark) {
  return detail::str("line ", mark.line + 1, ", column ", mark.column + 1);
}

void make_directories(const std::string& path) {
  for (size_t slash = path.find('/', 1); slash != std::string::npos;
       slash = path.find('/', slash + 1)) {
    ::mkdir(path.substr(0, slash).c_str(), 0755);
  }
}

}  // namespace

// Accelerate's and torchrun's names for our quantities (docs/names.md). An alias may name a
// quantity the config file does not store (processes_per_node: a launch flag only); the reader
// then refuses it as it refuses any unknown key.
const std::vector<KeyAlias>& key_aliases() {
  static const std::vector<KeyAlias> all = {
      {"num_processes", "world_size", "Accelerate"},
      {"nproc_per_node", "processes_per_node", "torchrun"},
      {"num_machines", "num_nodes", "Accelerate"},
      {"nnodes", "num_nodes", "torchrun"},
      {"machine_rank", "node_rank", "Accelerate"},
      {"main_process_ip", "master_addr", "Accelerate"},
      {"main_process_port", "master_port", "Accelerate"},
      {"use_cpu", "cpu", "Accelerate"},
      {"debug_mode", "debug", "Accelerate"},
  };
  return all;
}

std::string flag_names(const std::string& name, const std::string& short_name) {
  std::string names = short_name.empty() ? "--" + name : short_name + ",--" + name;
  for (const auto& a : key_aliases()) {
    if (a.name == name) names += std::string(",--") + a.alias;
  }
  return names;
}

std::string canonical_key(const std::string& key) {
  for (const auto& a : key_aliases()) {
    if (key == a.alias) return a.name;
  }
  return key;
}

const std::vector<std::string>& config_keys() {
  static const std::vector<std::string> keys = [] {
    std::vector<std::string> k;
    for (const auto& f : fields()) k.push_back(f.key);
    return k;
  }();
  return keys;
}

Config load_config(const std::string& path) {
  const auto file = detail::read_bounded_file(path, kMaxConfigBytes);
  if (!file.problem.empty()) {
    const bool too_big = file.error == 0 && file.problem.find("bytes") != std::string::npos;
    throw Error(detail::str(
        detail::said_of("Config file " + path, file.problem), ". ",
        too_big ? "Likely cause: --config_file or ACCELERANT_CONFIG_FILE names another kind of "
                  "file (a config file is a few lines of YAML, at most 1 MiB). "
        : file.error != ENOENT
            ? "Likely cause: --config_file or ACCELERANT_CONFIG_FILE names the wrong path, or "
              "the file's permissions keep it from this user. "
            : "",
        "Fix: create one with `accelerant config` (questions) or `accelerant config default`, ",
        "or pass another --config_file."));
  }
  const std::string nesting = detail::nesting_problem(file.bytes, detail::Syntax::kYaml);
  if (!nesting.empty()) {
    throw Error(detail::str(detail::said_of("Config file " + path, nesting),
                            ", while a config is a flat list of `key: value` lines. Fix: ",
                            "rewrite it with `accelerant config default`, or pass another ",
                            "--config_file."));
  }
  YAML::Node root;
  try {
    root = YAML::Load(file.bytes);
  } catch (const YAML::Exception& e) {
    throw Error(
        detail::str("Config file ", path, " is not valid YAML: ", e.msg, " at ", position(e.mark),
                    ". Fix: correct it there, or rewrite it with `accelerant config default`."));
  }
  Config config;
  if (!root || root.IsNull()) return config;  // an empty file: every default
  if (!root.IsMap()) {
    throw Error(detail::str("Config file ", path, " is not a mapping of keys to values (",
                            position(root.Mark()),
                            "). Fix: write one `key: value` per line, or rewrite it with "
                            "`accelerant config default`."));
  }
  std::vector<std::string> problems;
  std::map<std::string, std::string> spelling_of;  // one name -> the spelling the file used
  for (const auto& item : root) {
    const std::string key = item.first.as<std::string>();
    const std::string name = canonical_key(key);
    auto it = std::find_if(fields().begin(), fields().end(),
                           [&](const Field& f) { return name == f.key; });
    if (it == fields().end()) {
      problems.push_back(detail::str("unknown key '", key, "' at ", position(item.first.Mark()),
                                     " (did you mean '", closest_key(key), "'?)"));
      continue;
    }
    // Accelerate's name and ours for one setting in one file: which one was meant is a guess.
    const auto [earlier, first_time] = spelling_of.emplace(name, key);
    if (!first_time) {
      problems.push_back(detail::str("'", key, "' at ", position(item.first.Mark()), " sets ", name,
                                     " again (as '", earlier->second, "' did): keep one of them"));
      continue;
    }
    try {
      if (!item.second.IsScalar()) throw YAML::BadConversion(item.second.Mark());
      it->read(item.second, config);
    } catch (const std::exception& e) {  // YAML::Exception, or Error from a field's parser
      if (it->says_why && dynamic_cast<const Error*>(&e) != nullptr) {  // it names key and range
        problems.push_back(detail::str(e.what(), " (at ", position(item.second.Mark()), ")"));
        continue;
      }
      const std::string shown = item.second.IsScalar() ? item.second.Scalar() : "a list or mapping";
      problems.push_back(detail::str("'", key, "' is '", shown, "' at ",
                                     position(item.second.Mark()), ", but it must be ", it->type));
    }
  }
  if (!problems.empty()) {
    throw Error(
        detail::str("Config file ", path, " has ", problems.size(), " problem",
                    problems.size() == 1 ? "" : "s", ":\n  ", detail::join(problems, "\n  "),
                    "\nFix: correct the file, or rewrite it with `accelerant config`. Known keys: ",
                    detail::join(config_keys(), ", "), " (and their aliases, docs/names.md)."));
  }
  if (config.config_version > kConfigVersion || config.config_version < 1) {
    throw Error(
        detail::str("Config file ", path, " has config_version ", config.config_version,
                    ", but this Accelerant reads versions 1 to ", kConfigVersion,
                    ". Likely cause: it was written by a newer Accelerant. Fix: upgrade, or "
                    "rewrite the file with `accelerant config`."));
  }
  validate_config(config, "Config file " + path);
  return config;
}

void validate_config(const Config& c, const std::string& where) {
  std::vector<std::string> problems;
  if (c.num_nodes < 1)
    problems.push_back(detail::str("num_nodes is ", c.num_nodes, "; it must be 1 or more"));
  if (c.min_nodes < 0 || c.min_nodes > c.num_nodes) {
    problems.push_back(detail::str("min_nodes is ", c.min_nodes, "; it must be 1 to num_nodes (",
                                   c.num_nodes, "), or 0 for num_nodes"));
  }
  if (c.node_rank < 0 || c.node_rank >= std::max(1, c.num_nodes)) {
    problems.push_back(detail::str("node_rank is ", c.node_rank,
                                   "; it must be between 0 and num_nodes - 1 (", c.num_nodes - 1,
                                   ")"));
  }
  if (c.world_size < 1) {
    problems.push_back(detail::str("world_size is ", c.world_size,
                                   "; it must be 1 or more (the processes across machines)"));
  } else if (c.num_nodes >= 1 && c.world_size % c.num_nodes != 0) {
    problems.push_back(detail::str("world_size ", c.world_size, " cannot be split evenly over ",
                                   c.num_nodes, " machines; use a multiple of ", c.num_nodes));
  }
  if (c.master_port < 0 || c.master_port > 65535) {
    problems.push_back(
        detail::str("master_port is ", c.master_port, "; it must be 0 (any free port) to 65535"));
  } else if (c.master_port == 0 && c.num_nodes > 1) {
    problems.push_back(
        "master_port 0 (any free port) works on one machine only; the other machines must know "
        "the port: choose one, e.g. 29500");
  }
  if (c.master_addr.empty())
    problems.push_back("master_addr is empty; use the main machine's address");
  if (c.downcast_bf16 && c.mixed_precision != MixedPrecision::kBf16) {
    problems.push_back(
        "downcast_bf16 is true but mixed_precision is not bf16; set both or neither");
  }
  if (c.max_restarts < 0)
    problems.push_back(detail::str("max_restarts is ", c.max_restarts, "; it must be 0 or more"));
  // Text (the file, the flags) was range-checked where it became a duration
  // (seconds_to_duration); a Config built in code is checked here against the same range.
  const auto check_duration = [&](const char* key, std::chrono::milliseconds d) {
    if (d < std::chrono::milliseconds(1) || d.count() > kMaxConfigSeconds * 1000) {
      problems.push_back(detail::str(key, " is ", d.count(), " ms; it must be 1 ms to ",
                                     static_cast<long long>(kMaxConfigSeconds), " s (30 days)"));
    }
  };
  check_duration("monitor_interval", c.monitor_interval);
  check_duration("join_timeout", c.join_timeout);
  check_duration("rejoin_timeout", c.rejoin_timeout);
  check_duration("collective_timeout", c.collective_timeout);
  if (c.threads_per_process < 0 || c.threads_per_process > kMaxThreadsPerProcess) {
    problems.push_back(detail::str("threads_per_process is ", c.threads_per_process, "; use 0 ",
                                   "(automatic) to ", kMaxThreadsPerProcess));
  }
  if (c.gradient_accumulation_steps < 1) {
    problems.push_back(detail::str("gradient_accumulation_steps is ", c.gradient_accumulation_steps,
                                   "; it must be 1 or more"));
  }
  if (!problems.empty()) {
    throw Error(detail::str(where, ": ", detail::join(problems, "; "), "."));
  }
}

std::chrono::milliseconds seconds_to_duration(double seconds, const std::string& name) {
  if (!(seconds >= 0.001 && seconds <= kMaxConfigSeconds)) {  // also refuses nan
    throw Error(detail::str(name, " is ", seconds, "; it must be 0.001 to ",
                            static_cast<long long>(kMaxConfigSeconds), " seconds (30 days)"));
  }
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000 + 0.5));
}

std::string duration_to_seconds_text(std::chrono::milliseconds duration) {
  // Whole milliseconds as seconds with no trailing zeros (1800, 0.1), never exponent notation.
  std::string text = std::to_string(duration.count() / 1000);
  const int64_t millis = duration.count() % 1000;
  if (millis != 0) {
    std::string fraction = std::to_string(1000 + millis).substr(1);
    while (fraction.back() == '0') fraction.pop_back();
    text += "." + fraction;
  }
  return text;
}

std::string to_yaml(const Config& config) {
  std::string text = "# Written by accelerant (accelerant config). Keys: docs/cli.md\n";
  for (const auto& f : fields()) text += detail::str(f.key, ": ", f.write(config), "\n");
  return text;
}

void save_config(const Config& config, const std::string& path) {
  validate_config(config);
  make_directories(path);
  if (!detail::write_file_atomically(path, to_yaml(config))) {
    throw Error(
        detail::str("Could not write the config file ", path, " (through ", path,
                    ".tmp). Fix: check that the directory is writable and the disk not full."));
  }
}

std::string write_basic_config(MixedPrecision mixed_precision, const std::string& path) {
  Config config;
  config.mixed_precision = mixed_precision;
  const std::string target = path.empty() ? default_config_path(process_environment()) : path;
  save_config(config, target);
  return target;
}

ConfigValues to_config_values(const Config& config) {
  ConfigValues values;
  for (const auto& f : fields()) {
    std::string text = f.write(config);
    if (text.size() >= 2 && text.front() == '"') text = text.substr(1, text.size() - 2);
    values[f.key] = text;
  }
  return values;
}

std::string default_config_path(const EnvLookup& lookup) {
  auto non_empty = [&](const std::string& name) -> std::optional<std::string> {
    auto value = lookup(name);
    if (value && !value->empty()) return value;
    return std::nullopt;
  };
  if (auto path = non_empty("ACCELERANT_CONFIG_FILE")) return *path;
  if (auto cache = non_empty("XDG_CACHE_HOME")) return *cache + "/accelerant/default_config.yaml";
  return non_empty("HOME").value_or(".") + "/.cache/accelerant/default_config.yaml";
}

ConfigValues read_config_values(const std::string& path) {
  // No config file: nothing from this layer. One that exists but cannot be read is an error
  // (load_config says why), never silently skipped.
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 && errno == ENOENT) return {};
  return to_config_values(load_config(path));
}

}  // namespace accelerant
