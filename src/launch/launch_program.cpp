// accelerant::launch_program: the launcher's agent with a program as each worker's body. Each
// forked worker replaces itself with the program (execvp, no shell), keeping the environment the
// agent set for it (the torchrun variables and ACCELERANT_*). No LibTorch here, so no AgentHooks:
// an exec'd worker starts with fresh thread pools and no CUDA state of ours, sizes its pools from
// ACCELERANT_THREADS_PER_PROCESS, and `accelerant launch` (which does not load LibTorch) runs this.
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "accelerant/environment.h"
#include "accelerant/launch_options.h"
#include "base/text.h"
#include "launch/agent.h"

namespace accelerant {
namespace {

std::string cannot_run(const std::string& program, const std::string& why) {
  return detail::str("accelerant launch: cannot run '", program, "': ", why,
                     ". Fix: give a path to an executable program (./train), or put it on PATH.");
}

// Whether execvp would find an executable `program` (a path, or a name looked up on PATH).
bool runnable(const std::string& program) {
  if (program.find('/') != std::string::npos) return ::access(program.c_str(), X_OK) == 0;
  const std::string dirs = environment_value("PATH").value_or("/usr/bin:/bin");
  for (size_t start = 0; start <= dirs.size();) {
    size_t end = dirs.find(':', start);
    if (end == std::string::npos) end = dirs.size();
    const std::string dir = end > start ? dirs.substr(start, end - start) : ".";
    if (::access((dir + "/" + program).c_str(), X_OK) == 0) return true;
    start = end + 1;
  }
  return false;
}

}  // namespace

void launch_program(const std::vector<std::string>& command, const LaunchOptions& options) {
  if (command.empty()) {
    throw Error(
        "accelerant launch: no program given. Fix: name the program after the options, e.g. "
        "`accelerant launch -n 2 ./train --epochs 3`.");
  }
  if (!runnable(command[0])) {
    throw Error(cannot_run(command[0], command[0].find('/') == std::string::npos
                                           ? "no such executable on PATH"
                                           : "no such executable"));
  }
  std::vector<std::string> args = command;
  // Never in place: `accelerant launch` under another launcher is its own (per-machine) group.
  detail::run_agent(
      options,
      [&args](int) -> std::vector<char> {
        std::vector<char*> argv;
        for (auto& a : args) argv.push_back(a.data());
        argv.push_back(nullptr);
        ::execvp(argv[0], argv.data());
        throw Error(cannot_run(args[0], std::strerror(errno)));
      },
      detail::AgentHooks{});
}

}  // namespace accelerant
