// accelerant::launch_program: the launcher's agent with a program as each worker's body. Each
// forked worker replaces itself with the program (execvp, no shell), keeping the environment the
// agent set for it (the torchrun variables and ACCELERANT_*). No LibTorch here, so no AgentHooks:
// an exec'd worker starts with fresh thread pools and no CUDA state of ours, sizes its pools from
// ACCELERANT_THREADS_PER_PROCESS, and `accelerant launch` (which does not load LibTorch) runs this.
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "accelerant/environment.h"
#include "accelerant/launch_options.h"
#include "base/text.h"
#include "launch/agent.h"

namespace accelerant {
namespace {

using detail::str;

std::string cannot_run(const std::string& program, const std::string& why) {
  return str("accelerant launch: cannot run '", program, "': ", why,
             ". Fix: give a path to an executable program (./train), or put it on PATH.");
}

// Whether `path` is a file this process may execute (access() alone says yes to a directory).
bool executable_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0;
}

// A script's interpreter (its "#!" line) that cannot be executed: execve then fails with ENOENT,
// which would read "No such file" about a script that exists. "" when there is no such line or
// its interpreter is there.
std::string interpreter_problem(const std::string& path) {
  std::string first_line;
  if (std::FILE* f = std::fopen(path.c_str(), "rb")) {
    char buffer[256] = {0};
    if (std::fgets(buffer, sizeof buffer, f)) first_line = buffer;
    std::fclose(f);
  }
  if (first_line.compare(0, 2, "#!") != 0) return "";
  const size_t start = first_line.find_first_not_of(" \t", 2);
  if (start == std::string::npos) return "its #! line names no interpreter";
  const size_t end = first_line.find_first_of(" \t\r\n", start);
  const std::string interpreter = first_line.substr(start, end - start);
  if (executable_file(interpreter)) return "";
  return str("its interpreter ", interpreter, " (its #! line) ",
             ::access(interpreter.c_str(), F_OK) == 0 ? "is not executable" : "does not exist",
             "; install it or correct the script's first line");
}

// Why execvp would not run `program` (a path, or a name looked up on PATH); "" when it would.
std::string why_not_runnable(const std::string& program) {
  if (program.find('/') != std::string::npos) {
    if (executable_file(program)) return interpreter_problem(program);
    struct stat st {};
    if (::stat(program.c_str(), &st) != 0)
      return str("no such executable (", std::strerror(errno), ")");
    if (S_ISDIR(st.st_mode)) return "it is a directory";
    if (!S_ISREG(st.st_mode)) return "it is not a regular file";
    return "it is not executable (chmod +x)";
  }
  const std::string dirs = environment_value("PATH").value_or("/usr/bin:/bin");
  for (size_t start = 0; start <= dirs.size();) {
    size_t end = dirs.find(':', start);
    if (end == std::string::npos) end = dirs.size();
    const std::string dir = end > start ? dirs.substr(start, end - start) : ".";
    if (executable_file(dir + "/" + program)) return interpreter_problem(dir + "/" + program);
    start = end + 1;
  }
  return "no such executable on PATH";
}

}  // namespace

void launch_program(const std::vector<std::string>& command, const LaunchOptions& options) {
  if (command.empty()) {
    throw Error(
        "accelerant launch: no program given. Fix: name the program after the options, e.g. "
        "`accelerant launch -n 2 ./train --epochs 3`.");
  }
  const std::string why = why_not_runnable(command[0]);
  if (!why.empty()) throw Error(cannot_run(command[0], why));
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
