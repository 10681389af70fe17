// accelerant env: what a bug report needs about this machine and this installation.
#include <accelerant/accelerant.h>
#include <dlfcn.h>
#include <gloo/config.h>
#include <sched.h>
#include <sys/statvfs.h>

#include <fstream>
#include <iostream>
#include <set>

#include "commands.h"

namespace accelerant::cli {
namespace {

std::string cpu_model() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "unknown";
}

// The BLAS libraries mapped into this process (Debian selects libblas.so.3 by alternatives).
std::string blas_in_use() {
  std::ifstream maps("/proc/self/maps");
  std::set<std::string> libraries;
  std::string line;
  while (std::getline(maps, line)) {
    const auto slash = line.find('/');
    if (slash == std::string::npos) continue;
    const std::string path = line.substr(slash);
    if (path.find("blas") != std::string::npos) libraries.insert(path);
  }
  std::string text;
  for (const auto& l : libraries) text += (text.empty() ? "" : ", ") + l;
  using GetConfig = char* (*)();
  if (auto get = reinterpret_cast<GetConfig>(::dlsym(RTLD_DEFAULT, "openblas_get_config"))) {
    text += std::string(" (") + get() + ")";
  }
  return text.empty() ? "none found" : text;
}

std::string variable(const char* name) {
  const char* value = std::getenv(name);
  return value ? value : "(unset)";
}

// Room for the shared-memory all-reduce's segments.
std::string dev_shm_free() {
  struct statvfs fs {};
  if (::statvfs("/dev/shm", &fs) != 0) return "no /dev/shm (the all-reduce uses Gloo)";
  return std::to_string(static_cast<unsigned long long>(fs.f_bavail) * fs.f_frsize / (1 << 20)) + " MiB free in /dev/shm";
}

}  // namespace

void add_env_command(CLI::App& app, Action& action) {
  auto* env = app.add_subcommand("env",
                                 "Print versions, hardware, thread settings and the config, ready to paste into a "
                                 "bug report.\n\nExamples:\n  accelerant env\n  accelerant env --config_file my.yaml");
  auto file = std::make_shared<std::string>();
  env->add_option("--config_file", *file, "The config file to show (default: the default location)");
  env->callback([&action, file] {
    action = [file] {
      std::cout << "- Accelerant: " << kVersion << "\n"
                << "- LibTorch: " << torch_version() << "\n"
                << "- Gloo: " << GLOO_VERSION_MAJOR << "." << GLOO_VERSION_MINOR << "." << GLOO_VERSION_PATCH << "\n"
                << "- Compiler: " << __VERSION__ << ", C++ " << __cplusplus << "\n"
                << "- CPU: " << cpu_model() << ", " << usable_cpus() << " usable cores\n"
                << "- BLAS: " << blas_in_use() << "\n"
                << "- Threads: LibTorch intra-op " << torch::get_num_threads() << ", OpenBLAS " << openblas_threads()
                << ", OMP_NUM_THREADS=" << variable("OMP_NUM_THREADS")
                << ", OPENBLAS_NUM_THREADS=" << variable("OPENBLAS_NUM_THREADS") << "\n"
                << "- All-reduce on one machine: ACCELERANT_SHM_ALLREDUCE=" << variable("ACCELERANT_SHM_ALLREDUCE")
                << " (unset = shared memory), " << dev_shm_free() << "\n"
                << "- Metrics at exit: ACCELERANT_METRICS=" << variable("ACCELERANT_METRICS") << "\n"
                << "- Graph steps emulate GPU replays: ACCELERANT_EMULATE_REPLAYS="
                << variable("ACCELERANT_EMULATE_REPLAYS") << "\n"
                << "- GPUs: " << (torch::cuda::is_available() ? std::to_string(torch::cuda::device_count()) : "none (CUDA not available)")
                << "\n";
      const std::string path = config_path_or_default(*file);
      std::cout << "- Config file: " << path;
      if (!std::ifstream(path)) {
        std::cout << " (none; `accelerant config` writes one)\n";
      } else {
        std::cout << "\n";
        try {
          std::cout << to_yaml(load_config(path));
        } catch (const Error& e) {
          std::cout << "  (invalid: " << e.what() << ")\n";
        }
      }
      return 0;
    };
  });
}

}  // namespace accelerant::cli
