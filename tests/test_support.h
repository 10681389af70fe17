// Helpers shared by the tests: process liveness checks, running a helper program, comparing
// trainings.
#pragma once

#include <sys/types.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/types.h>

#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace accelerant::testing {

/// Paths of the programs the tests start, found next to the running test binary (build/tests/)
/// rather than compiled in, so that ccache can reuse test objects across checkouts.
std::string launch_helper_path();
std::string cli_path();
/// A file the build copied next to the test binaries (e.g. a Python script).
std::string test_file_path(const std::string& name);

/// True while `pid` exists and is not a zombie.
bool process_alive(pid_t pid);

/// Waits until none of `pids` is alive, up to `limit`. Returns the ones still alive.
std::vector<pid_t> wait_until_dead(const std::vector<pid_t>& pids, std::chrono::milliseconds limit);

/// A fresh empty directory under /tmp, removed by the caller with remove_tree.
std::string make_temp_dir();
void remove_tree(const std::string& dir);
/// A fresh temporary directory for one test, removed when it goes out of scope.
struct ScratchDir {
  std::string path = make_temp_dir();
  ScratchDir() = default;
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  ~ScratchDir() { remove_tree(path); }
};

/// Reads the integers written one per file (named "pid.*") in `dir`.
std::vector<pid_t> read_pid_files(const std::string& dir);

struct ProgramRun {
  pid_t pid = -1;
  int out_fd = -1;  // read end of its stdout+stderr
};
/// Starts `argv` with stdout and stderr captured.
ProgramRun start_program(const std::vector<std::string>& argv);
/// Reads all output and reaps; returns the wait status, or -1 after killing it at `limit`.
int finish_program(ProgramRun& run, std::string& output, std::chrono::milliseconds limit);

/// The processes whose parent is `parent` (from /proc).
std::vector<pid_t> children_of(pid_t parent);
/// The value of `name` in a process's environment, "" when absent.
std::string environment_of(pid_t pid, const std::string& name);

/// An environment of exactly `vars`, for the readers that take an EnvLookup (launch_contract.h).
std::function<std::optional<std::string>(const std::string&)> env_of(
    std::map<std::string, std::string> vars);

/// A TCP port that was free a moment ago (bind to 0, read, close).
int free_port();

/// Debian's torchrun (python3-torch 1.13) starting `nproc` local workers of a program that
/// follows (append it and its arguments). Not `--standalone`: that fixes the rendezvous port at
/// 29400, so two tests running torchrun at once collide ("Address already in use"); this takes a
/// free port instead. `--redirects`/`--tee` because 1.13 crashes on Python 3.11 without them.
std::vector<std::string> torchrun_argv(int nproc);

/// The message of the accelerant::Error that `f` throws, or "" when it throws none.
std::string error_message(const std::function<void()>& f);

/// Whether `text` contains `what`.
bool contains(const std::string& text, const std::string& what);

/// The whole file at `path`, as bytes ("" when it cannot be read).
std::string slurp(const std::string& path);

/// Every parameter of `module`, flattened and concatenated into one CPU copy: two trainings
/// compare as one tensor.
torch::Tensor flat_parameters(const torch::nn::Module& module);

/// The small classifier the graph-mode tests train (8 -> 16, tanh, -> 3), seeded so that every
/// call builds the same one.
torch::nn::Sequential small_mlp();

}  // namespace accelerant::testing
