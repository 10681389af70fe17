// The launcher's agent, for the two public entry points built on it: launch_serialized (which
// first checks for an outer launcher) and launch_program (`accelerant launch`, which always
// starts its own group).
#pragma once

#include <chrono>
#include <vector>

#include "accelerant/launch.h"

namespace accelerant::detail {

/// Forks, watches and restarts the local group (launch_serialized without the in-place rule).
std::vector<std::vector<char>> run_agent(const LaunchOptions& options, const WorkerBody& body);

/// The workers' collective timeout: options.timeout(), else this process's ACCELERANT_TIMEOUT_MS
/// (the user's choice), else 30 minutes.
std::chrono::milliseconds resolved_timeout(const LaunchOptions& options);

}  // namespace accelerant::detail
