// The sub-commands of the accelerant command line; each registers itself on the CLI11 app and
// runs when chosen. main.cpp only dispatches.
#pragma once
#include <CLI/CLI.hpp>
#include <functional>

namespace accelerant::cli {

/// What a chosen sub-command does; returns the process exit status.
using Action = std::function<int()>;

/// `accelerant config [default|show|validate]`.
void add_config_command(CLI::App& app, Action& action);
/// `accelerant launch [options] program [args...]`.
void add_launch_command(CLI::App& app, Action& action);
/// `accelerant env`.
void add_env_command(CLI::App& app, Action& action);

/// The config file path: --config_file when given, else the default location.
std::string config_path_or_default(const std::string& config_file);

}  // namespace accelerant::cli
