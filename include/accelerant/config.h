// The config file that `accelerant config` writes and `accelerant launch` and the Accelerator read:
// YAML, one key per setting, each key the quantity's one name (docs/names.md: torchrun's, as the
// environment variables have them). Accelerate's and torchrun's names for the same quantities are
// read too (key_aliases()), so that a file written for `accelerate launch` keeps working.
//
//   config_version: 1
//   num_nodes: 1
//   node_rank: 0
//   master_addr: 127.0.0.1
//   master_port: 0
//   world_size: 2
//   mixed_precision: "no"
//   ...
//
// Loading is strict, so that a typo never silently falls back to a default: an unknown key is an
// error naming the closest known key, a wrong type names the key, the value and the expected type,
// malformed YAML gives the line and column. `config_version` lets later versions of the schema
// keep reading old files.
#pragma once
#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "accelerant/environment.h"  // MixedPrecision, Recovery
#include "accelerant/launch_contract.h"

namespace accelerant {

/// The schema version this build writes (and the newest it reads).
constexpr int kConfigVersion = 1;

/// The longest timeout or interval a config file or a launcher flag accepts, in seconds: 30 days.
/// Beyond it (or inf, nan) is refused rather than wrapped when made milliseconds.
constexpr double kMaxConfigSeconds = 30 * 24 * 3600;

/// The contents of a config file, one field per key (the key is the field's name). The
/// initialisers are the values of a key the file leaves out. `accelerant launch` reads every key
/// (its flags override them); the Accelerator reads mixed_precision, downcast_bf16, cpu and
/// gradient_accumulation_steps.
struct Config {
  /// The schema version the file was written with, 1 to kConfigVersion; newer is refused.
  int config_version = kConfigVersion;
  int num_nodes = 1;  ///< machines taking part, each running its own `accelerant launch`
  /// Elastic membership (LaunchOptions::min_nodes): the fewest machines the job goes on with,
  /// 1 to num_nodes; 0 = num_nodes (every machine is needed).
  int min_nodes = 0;
  int node_rank = 0;  ///< this machine's index, 0 (the main machine) to num_nodes - 1
  /// Address of the main machine (node_rank 0), where the job's store listens (MASTER_ADDR).
  std::string master_addr = "127.0.0.1";
  /// The main machine's port: 0 = a free port chosen at launch, on one machine only (a fixed
  /// default would collide with another job's); several machines need an explicit one.
  int master_port = 0;
  int world_size = 1;  ///< processes in total, across machines (WORLD_SIZE)
  /// Autocast precision; in the file as no, fp16 (CUDA only) or bf16, read by
  /// parse_mixed_precision ("fp32" and "none" are refused).
  MixedPrecision mixed_precision = MixedPrecision::kNo;
  /// Keep the model's weights in bf16 (AcceleratorOptions::downcast_bf16); needs mixed_precision
  /// bf16.
  bool downcast_bf16 = false;
  bool cpu = false;  ///< train on the CPU even when CUDA is available
  /// Debug mode (LaunchOptions::debug): a dry fork first, then cross-rank checks of every
  /// collective in the workers.
  bool debug = false;
  int max_restarts = 0;  ///< how often the whole group is restarted after a worker fails, ≥ 0
  /// What a failure within max_restarts leads to (LaunchOptions::recovery); in the file as
  /// restart_group or replace_failed_worker, read by parse_recovery.
  Recovery recovery = Recovery::kRestartGroup;
  /// Time between checks of the workers. (The durations are seconds in the file.)
  std::chrono::milliseconds monitor_interval{100};
  /// How long the launchers, and the workers at start-up, wait for each other.
  std::chrono::milliseconds join_timeout = std::chrono::minutes(10);
  /// With min_nodes: how long the launchers wait for missing machines before going on without
  /// them; under replace_failed_worker, for a lost machine's launcher to come back
  /// (LaunchOptions::rejoin_timeout).
  std::chrono::milliseconds rejoin_timeout = std::chrono::seconds(60);
  /// How long a collective may wait before it fails naming the ranks it waited for
  /// (ACCELERANT_TIMEOUT_MS in the workers). `accelerant launch`: --collective_timeout, else the
  /// user's ACCELERANT_TIMEOUT_MS, else this key.
  std::chrono::milliseconds collective_timeout = std::chrono::minutes(30);
  int threads_per_process = 0;          ///< 0 = cores / local processes
  int gradient_accumulation_steps = 1;  ///< micro-batches per optimizer step, ≥ 1
};

/// Every key a config file may contain, in the order they are written (aliases aside).
const std::vector<std::string>& config_keys();

/// Another tool's name for one of our quantities, accepted wherever text names it: a config file's
/// key and an `accelerant launch` flag (docs/names.md lists them, and a test holds the two equal).
struct KeyAlias {
  const char* alias;   ///< e.g. "num_processes"
  const char* name;    ///< the one name it stands for, e.g. "world_size"
  const char* origin;  ///< whose name it is: "Accelerate" or "torchrun"
};

/// The one table of aliases, read by the config file's reader and by the CLI's flags.
const std::vector<KeyAlias>& key_aliases();

/// A command-line flag's names in CLI11's add_option form: `short_name` when given, "--<name>",
/// then "--<alias>" for each of its aliases, e.g. flag_names("world_size", "-n") is
/// "-n,--world_size,--num_processes". The `accelerant` command and the examples name their flags
/// with it, so that each flag takes the aliases the config file takes.
std::string flag_names(const std::string& name, const std::string& short_name = "");

/// The one name `key` stands for: its KeyAlias::name when it is an alias, else `key` itself.
std::string canonical_key(const std::string& key);

/// A duration given in seconds (a config file's value or a launch flag: the one place their unit
/// is read) as milliseconds, rounded. Throws accelerant::Error naming `name` and the range when it
/// is not 0.001 to kMaxConfigSeconds: inf, nan, a negative or 1e20 would otherwise wrap.
std::chrono::milliseconds seconds_to_duration(double seconds, const std::string& name);

/// A duration as the seconds a config file holds: "0.1", "600".
std::string duration_to_seconds_text(std::chrono::milliseconds duration);

/// Reads and validates a config file. Throws accelerant::Error naming the file and the problem
/// (missing file, malformed YAML with line and column, unknown key with the closest known one,
/// wrong type, out-of-range value, a config_version newer than this build).
Config load_config(const std::string& path);

/// Checks the values' ranges and combinations; throws accelerant::Error naming each problem.
void validate_config(const Config& config, const std::string& where = "config");

/// The config as YAML text (every key, in config_keys() order).
std::string to_yaml(const Config& config);

/// Writes `config` to `path` (creating its directory), through a temporary file and a rename.
void save_config(const Config& config, const std::string& path);

/// Writes a basic config (Config's defaults: one machine, one process, a free port) with
/// `mixed_precision` to `path`, or to the default location when `path` is empty; returns the path
/// written. Accelerate's write_basic_config.
std::string write_basic_config(MixedPrecision mixed_precision = MixedPrecision::kNo,
                               const std::string& path = "");

/// Top-level keys of a config file with their values as text.
using ConfigValues = std::map<std::string, std::string>;

/// The config file path: $ACCELERANT_CONFIG_FILE, else $XDG_CACHE_HOME/accelerant/
/// default_config.yaml, else ~/.cache/accelerant/default_config.yaml.
std::string default_config_path(const EnvLookup& lookup);

/// Reads a config file (load_config: strict) as key -> text. A missing file gives no values; a
/// bad one throws accelerant::Error naming the problem.
ConfigValues read_config_values(const std::string& path);

/// The config as key -> text for the Accelerator's option resolution.
ConfigValues to_config_values(const Config& config);

}  // namespace accelerant
