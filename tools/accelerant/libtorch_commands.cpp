// The front end's `env`, `test` and `checkpoint merge`. They need LibTorch (versions and devices;
// collectives and training steps; LibTorch archives), which the front end does not load, so they
// run in the helper program accelerant-libtorch: the front end finds it next to itself and execs it
// with the same command line. The helper lives at ACCELERANT_HELPER_PATH relative to the front
// end's own directory (found through /proc/self/exe, not PATH): <prefix>/bin/accelerant and
// <prefix>/libexec/accelerant/accelerant-libtorch when installed; build/bin and
// build/libexec/accelerant in the build tree.
#include <accelerant/error.h>
#include <limits.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "commands.h"

namespace accelerant::cli {
namespace {

std::string helper_path() {
  char self[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) {
    throw Error(
        "accelerant: cannot find its own executable (/proc/self/exe is unreadable), and with it "
        "the helper that runs `env`, `test` and `checkpoint merge`. Fix: mount /proc.");
  }
  std::string dir(self, static_cast<size_t>(n));
  dir.erase(dir.rfind('/'));
  return dir + "/" ACCELERANT_HELPER_PATH;
}

[[noreturn]] void exec_helper(int argc, char** argv) {
  const std::string helper = helper_path();
  std::vector<char*> args{const_cast<char*>(helper.c_str())};
  for (int i = 1; i < argc; ++i) args.push_back(argv[i]);
  args.push_back(nullptr);
  ::execv(helper.c_str(), args.data());
  throw Error(
      "accelerant: `env`, `test` and `checkpoint merge` need LibTorch and run in the "
      "helper " +
      helper + ", which cannot be run: " + std::strerror(errno) +
      ". Likely cause: an incomplete installation. Fix: reinstall Accelerant (the package "
      "installs bin/accelerant and libexec/accelerant/accelerant-libtorch together), or "
      "build the accelerant_libtorch target.");
}

}  // namespace

int run_helper(const std::vector<std::string>& args) {
  const std::string helper = helper_path();
  std::vector<char*> argv{const_cast<char*>(helper.c_str())};
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::fflush(nullptr);
  pid_t pid = 0;
  const int error = ::posix_spawn(&pid, helper.c_str(), nullptr, nullptr, argv.data(), environ);
  if (error != 0) {
    throw Error("accelerant: the LibTorch helper " + helper +
                " cannot be run: " + std::strerror(error) +
                ". Likely cause: an incomplete installation. Fix: reinstall Accelerant, or build "
                "the accelerant_libtorch target.");
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

namespace {

// A sub-command whose arguments, --help included, all go to the helper.
void add_forwarded(CLI::App& app, Action& action, const std::string& name,
                   const std::string& description, int argc, char** argv) {
  auto* sub = app.add_subcommand(name, description);
  sub->set_help_flag();  // the helper prints the sub-command's real help
  sub->prefix_command();
  sub->allow_extras();
  sub->callback(
      [&action, argc, argv] { action = [argc, argv]() -> int { exec_helper(argc, argv); }; });
}

}  // namespace

// The descriptions are env_command.cpp's and test_command.cpp's, with where they run.
void add_libtorch_commands(CLI::App& app, Action& action, int argc, char** argv) {
  add_forwarded(app, action, "env",
                "Print versions, hardware, thread settings and the config, ready to paste into a "
                "bug report. Runs in the LibTorch helper.\n\nExamples:\n  accelerant env\n  "
                "accelerant env --config_file my.yaml",
                argc, argv);
  add_forwarded(
      app, action, "test",
      "Self-test: launch workers with the current config and check the collectives (and say which\n"
      "all-reduce path they take), the fused AdamW, and a few training steps against one process.\n"
      "Under a launcher each process is one worker of a single group. Exit status 0 when every\n"
      "check passes. Runs in the LibTorch helper.\n\n"
      "Examples:\n"
      "  accelerant test                 with the config file's settings\n"
      "  accelerant test -n 4            4 processes\n"
      "  srun -n 2 accelerant test       the 2 tasks of a Slurm job as one group (also torchrun,\n"
      "                                  mpirun, accelerant launch)",
      argc, argv);
}

// The description is checkpoint_merge_command.cpp's first line, with where it runs.
void add_libtorch_checkpoint_commands(CLI::App& checkpoint, Action& action, int argc, char** argv) {
  add_forwarded(checkpoint, action, "merge",
                "Consolidate a checkpoint (sharded by ZeRO or not) into OUT/model.safetensors and, "
                "with --optimizer, whole optimizer state. Runs in the LibTorch helper; see "
                "`accelerant checkpoint merge --help`.\n\nExample:\n  accelerant checkpoint merge "
                "--optimizer runs/exp1/checkpoints/checkpoint_3 runs/exp1/merged",
                argc, argv);
}

}  // namespace accelerant::cli
