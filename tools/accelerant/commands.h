// The sub-commands of the accelerant command line; each registers itself on the CLI11 app and
// runs when chosen. main.cpp (the front end, no LibTorch) and libtorch_main.cpp (the helper that
// runs env and test) only dispatch.
#pragma once
#include <accelerant/config.h>

#include <CLI/CLI.hpp>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace accelerant::cli {

/// What a chosen sub-command does; returns the process exit status.
using Action = std::function<int()>;

/// `accelerant config [default|show|validate]`.
void add_config_command(CLI::App& app, Action& action);
/// `accelerant launch [options] program [args...]`.
void add_launch_command(CLI::App& app, Action& action);
/// `accelerant checkpoint inspect|verify DIR`.
void add_checkpoint_command(CLI::App& app, Action& action);
/// `accelerant checkpoint merge DIR OUT [--optimizer] [--force]` (in the helper).
void add_checkpoint_merge_command(CLI::App& app, Action& action);
/// The helper's `checkpoint verify-contents DIR...` (started by the front end's `checkpoint verify`
/// once the bytes verify): prints one line per checkpoint, OK or BAD with the reason; the exit
/// status is the number of bad ones (at most 100).
void add_checkpoint_contents_command(CLI::App& checkpoint, Action& action);
/// Runs the helper with `args` as a child process (its output goes where this process's goes) and
/// returns its exit status, or throws accelerant::Error when it cannot be started.
int run_helper(const std::vector<std::string>& args);
/// `accelerant report RUN_DIR [-o FILE] [--log_dir DIR] [--checkpoints DIR]`.
void add_report_command(CLI::App& app, Action& action);
/// `accelerant trace merge DIR`.
void add_trace_command(CLI::App& app, Action& action);
/// `accelerant estimate-memory (--params N | FILE) [--world_size ...] [--zero_stage ...] ...`.
void add_estimate_memory_command(CLI::App& app, Action& action);
/// `accelerant test` (in the helper).
void add_test_command(CLI::App& app, Action& action);

/// accelerant launch's flags; unset ones leave the config file's value.
struct LaunchFlags {
  std::string config_file;
  std::optional<int> world_size, processes_per_node, node_rank, master_port, max_restarts,
      threads_per_process, gradient_accumulation_steps;
  // num_nodes: N or MIN:MAX (parse_machine_count)
  std::optional<std::string> num_nodes, master_addr, mixed_precision, recovery;
  std::optional<double> monitor_interval, join_timeout, rejoin_timeout, collective_timeout;
  std::string log_dir;
  bool cpu = false, debug = false, prefix_output = false, tee = false;
};

/// The config file (when given or present at the default location), then the flags over it;
/// validated. Throws accelerant::Error naming the problems.
Config resolve_launch_config(const LaunchFlags& flags);

/// Launches `command` as workers with the config file's settings under `flags`; returns the exit
/// status, or throws accelerant::Error (LaunchError: the failure report).
int run_launch(const LaunchFlags& flags, const std::vector<std::string>& command);
/// `accelerant env` (in the helper).
void add_env_command(CLI::App& app, Action& action);
/// The front end's `env` and `test`: listed with the other sub-commands, run by exec'ing the
/// helper with this command line (they need LibTorch, which the front end does not load).
void add_libtorch_commands(CLI::App& app, Action& action, int argc, char** argv);
/// The front end's `checkpoint merge`, under its `checkpoint` sub-command: exec'd in the helper as
/// `env` and `test` are.
void add_libtorch_checkpoint_commands(CLI::App& checkpoint, Action& action, int argc, char** argv);

/// --mixed_precision's check: the one parser (accelerant::parse_mixed_precision); the value is
/// rewritten to its canonical spelling (no, fp16, bf16).
CLI::Validator mixed_precision_flag();

/// The config file path: --config_file when given, else the default location.
std::string config_path_or_default(const std::string& config_file);

}  // namespace accelerant::cli
