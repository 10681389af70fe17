// accelerant env: what a bug report needs about this machine and this installation.
#include <accelerant/accelerant.h>
#include <accelerant/environment.h>
#include <dlfcn.h>
#include <gloo/config.h>
#include <sched.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <torch/cuda.h>

#include <cerrno>
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
  const auto value = environment_value(name);
  // Output like this is pasted into bug reports: the job's secret is worth nothing once shown.
  if (value && std::string(name) == "ACCELERANT_JOB_SECRET") return "(set, not shown)";
  return value.value_or("(unset)");
}

// Every variable of the table with its value here (the table is the list: nothing is left out).
void print_environment() {
  std::cout << "- Environment variables (docs/environment.md):\n";
  for (const auto& v : environment_variables())
    std::cout << "    " << v.name << "=" << variable(v.name) << "\n";
}

std::string cell(const std::string& text) {
  std::string out;
  for (char c : text) out += c == '|' ? std::string("\\|") : std::string(1, c);
  return out;
}

// docs/environment.md, generated from the table (ctest environment.doc_matches_table compares).
void print_markdown() {
  std::cout
      << "# Environment variables\n\n"
         "<!-- Generated from the table in src/base/environment.cpp by `accelerant env "
         "--markdown`;\n"
         "     ctest environment.doc_matches_table fails when they differ. -->\n\n"
         "Every environment variable Accelerant reads, and only those: the library reads them "
         "through one\n"
         "accessor that refuses a name missing from the table, and ctest `environment` fails on a\n"
         "variable read anywhere else. `accelerant env` prints each with its value. Precedence for "
         "a\n"
         "setting that also has an option: option or command-line flag > environment > config file "
         ">\n"
         "default. An empty variable counts as unset.\n\n"
         "- **bool**: `1`, `true`, `yes`, `y`, `on` or `0`, `false`, `no`, `n`, `off`, in any case "
         "(the\n"
         "  same parser reads the config file's booleans and `accelerant config`'s answers).\n"
         "- **no | fp16 | bf16** (mixed precision): `no` (full fp32 precision), `fp16` (CUDA only, "
         "with\n"
         "  loss scaling) or `bf16` (CPU and CUDA autocast), in any case. `fp32` and `none` are "
         "refused\n"
         "  everywhere (environment, config file, AcceleratorOptions, LaunchOptions, "
         "`--mixed_precision`):\n"
         "  write `no`.\n\n"
         "| Variable | Type | Default | Meaning | Read by |\n"
         "|---|---|---|---|---|\n";
  for (const auto& v : environment_variables()) {
    std::cout << "| `" << v.name << "` | " << cell(v.type) << " | " << cell(v.default_value)
              << " | " << cell(v.meaning) << " | " << cell(v.read_by) << " |\n";
  }
}

// Room for the shared-memory all-reduce's segments.
std::string dev_shm_free() {
  struct statvfs fs {};
  if (::statvfs("/dev/shm", &fs) != 0) return "no /dev/shm (the all-reduce uses Gloo)";
  return std::to_string(static_cast<unsigned long long>(fs.f_bavail) * fs.f_frsize / (1 << 20)) +
         " MiB free in /dev/shm";
}

}  // namespace

void add_env_command(CLI::App& app, Action& action) {
  auto* env = app.add_subcommand(
      "env",
      "Print versions, hardware, thread settings and the config, ready to paste into a "
      "bug report.\n\nExamples:\n  accelerant env\n  accelerant env --config_file my.yaml");
  auto file = std::make_shared<std::string>();
  env->add_option("--config_file", *file,
                  "The config file to show (default: the default location)");
  auto markdown = std::make_shared<bool>(false);
  // Hidden (no group): it writes docs/environment.md, a maintainer's command.
  env->add_flag("--markdown", *markdown,
                "Print the table of environment variables as docs/environment.md")
      ->group("");
  env->callback([&action, file, markdown] {
    action = [file, markdown] {
      if (*markdown) {
        print_markdown();
        return 0;
      }
      std::cout << "- Accelerant: " << kVersion << "\n"
                << "- LibTorch: " << torch_version() << "\n"
                << "- Gloo: " << GLOO_VERSION_MAJOR << "." << GLOO_VERSION_MINOR << "."
                << GLOO_VERSION_PATCH << "\n"
                << "- Compiler: " << __VERSION__ << ", C++ " << __cplusplus << "\n"
                << "- CPU: " << cpu_model() << ", " << usable_cpus() << " usable cores\n"
                << "- BLAS: " << blas_in_use() << "\n"
                << "- Threads: LibTorch intra-op " << torch::get_num_threads() << ", OpenBLAS "
                << openblas_threads() << "\n"
                << "- Shared memory for the all-reduce on one machine: " << dev_shm_free() << "\n"
                << "- GPUs: "
                << (torch::cuda::is_available() ? std::to_string(torch::cuda::device_count())
                                                : "none (CUDA not available)")
                << "\n";
      print_environment();
      const std::string path = config_path_or_default(*file);
      std::cout << "- Config file: " << path;
      struct stat st {};
      if (::stat(path.c_str(), &st) != 0 && errno == ENOENT) {
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
