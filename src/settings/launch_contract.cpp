#include "accelerant/launch_contract.h"

#include <cstdlib>
#include <limits>

#include "accelerant/environment.h"
#include "accelerant/error.h"
#include "base/text.h"
#include "settings/slurm_hostlist.h"

namespace accelerant {
namespace {

constexpr const char* kLauncherHint =
    "start the job with `accelerant launch`, accelerant::launch, torchrun, srun or mpirun, "
    "which set these variables consistently";

[[noreturn]] void fail(const std::string& var, const std::string& value, const std::string& what,
                       const std::string& fix) {
  throw EnvironmentError(
      var, value,
      detail::str("Invalid distributed environment: ", var, "=", value.empty() ? "(unset)" : value,
                  " ", what,
                  ". Likely cause: the job script or launcher set it wrongly. Fix: ", fix, "."));
}

class Reader {
 public:
  explicit Reader(const EnvLookup& lookup) : lookup_(lookup) {}

  std::optional<std::string> text(const std::string& var) const {
    auto v = lookup_(var);
    if (v && v->empty()) return std::nullopt;  // an empty variable means "unset", as in shells
    return v;
  }

  std::optional<long long> integer(const std::string& var, long long min, long long max,
                                   const std::string& fix) const {
    auto v = text(var);
    if (!v) return std::nullopt;
    const char* begin = v->c_str();
    char* end = nullptr;
    errno = 0;
    long long parsed = std::strtoll(begin, &end, 10);
    if (errno != 0 || end == begin || *end != '\0') fail(var, *v, "is not an integer", fix);
    if (parsed < min || parsed > max) {
      fail(var, *v,
           detail::str(
               "is out of range (allowed: ", min, " to ",
               max == std::numeric_limits<int>::max() ? std::string("any") : std::to_string(max),
               ")"),
           fix);
    }
    return parsed;
  }

  int required(const std::string& var, long long min, long long max, const std::string& fix) const {
    auto v = integer(var, min, max, fix);
    if (!v) fail(var, "", "is missing", fix);
    return static_cast<int>(*v);
  }

  bool flag(const std::string& var) const {
    auto v = text(var);
    return v && parse_bool(*v, var);
  }

  // flag() for a setting whose absence means "not chosen" rather than "off".
  std::optional<bool> chosen_flag(const std::string& var) const {
    if (!text(var)) return std::nullopt;
    return flag(var);
  }

 private:
  const EnvLookup& lookup_;
};

constexpr long long kIntMax = std::numeric_limits<int>::max();

void read_torchrun(const Reader& r, LaunchContract& env) {
  env.source = r.text("ACCELERANT_LAUNCHER") ? EnvSource::kAccelerant : EnvSource::kTorchrun;
  env.world_size =
      r.required("WORLD_SIZE", 1, kIntMax, "set WORLD_SIZE to the total number of processes (≥ 1)");
  env.rank =
      r.required("RANK", 0, kIntMax, "set RANK to this process's index, 0 ≤ RANK < WORLD_SIZE");
  env.local_rank = static_cast<int>(
      r.integer("LOCAL_RANK", 0, kIntMax, "set LOCAL_RANK to this process's index on its machine")
          .value_or(env.rank));
  env.local_world_size = static_cast<int>(
      r.integer("LOCAL_WORLD_SIZE", 1, kIntMax,
                "set LOCAL_WORLD_SIZE to the number of processes on this machine (≥ 1)")
          .value_or(env.world_size));
  env.node_rank = static_cast<int>(
      r.integer("GROUP_RANK", 0, kIntMax, "set GROUP_RANK to this machine's index (≥ 0)")
          .value_or(env.rank / env.local_world_size));
  env.agent_hosts_store =
      r.flag("ACCELERANT_AGENT_STORE") || r.flag("TORCHELASTIC_USE_AGENT_STORE");
  env.torchelastic_error_file = r.text("TORCHELASTIC_ERROR_FILE").value_or("");
  env.job_secret = r.text("ACCELERANT_JOB_SECRET").value_or("");
  env.recovers_in_place = r.flag("ACCELERANT_RECOVER_IN_PLACE");
  env.joins_running_group = r.flag("ACCELERANT_JOINS_RUNNING_GROUP");
  env.machines_may_join = r.flag("ACCELERANT_MACHINES_MAY_JOIN");
  env.restart_count = static_cast<int>(
      r.integer("ACCELERANT_RESTART_COUNT", 0, kIntMax, "leave it to the launcher")
          .value_or(r.integer("TORCHELASTIC_RESTART_COUNT", 0, kIntMax, "leave it to the launcher")
                        .value_or(0)));
}

void read_slurm(const Reader& r, LaunchContract& env) {
  env.source = EnvSource::kSlurm;
  const std::string fix = "run the program through srun, which sets the SLURM_* variables per task";
  env.world_size = r.required("SLURM_NTASKS", 1, kIntMax, fix);
  env.rank = r.required("SLURM_PROCID", 0, kIntMax, fix);
  env.local_rank = static_cast<int>(r.integer("SLURM_LOCALID", 0, kIntMax, fix).value_or(0));
  env.node_rank = static_cast<int>(r.integer("SLURM_NODEID", 0, kIntMax, fix).value_or(0));
  env.num_nodes = static_cast<int>(r.integer("SLURM_NNODES", 1, kIntMax, fix).value_or(1));
  env.local_world_size =
      static_cast<int>(r.integer("SLURM_NTASKS_PER_NODE", 1, kIntMax, fix)
                           .value_or((env.world_size + env.num_nodes - 1) / env.num_nodes));
  env.cpus_per_process = static_cast<int>(
      r.integer("SLURM_CPUS_PER_TASK", 1, kIntMax, "request CPUs with srun -c N (N ≥ 1)")
          .value_or(0));
}

// Where srun's tasks meet when the job script exported no MASTER_ADDR (docs/launching.md
// "Slurm"): the first machine of the step, where srun's block and cyclic distributions both put
// task 0 (which hosts the TCPStore). The step's list first: a step may use only part of the job.
std::optional<std::string> slurm_master_addr(const Reader& r) {
  for (const char* var : {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"}) {
    if (auto list = r.text(var)) return detail::expand_slurm_hostlist(*list, var).front();
  }
  return std::nullopt;
}

// The rendezvous port of a Slurm step when MASTER_PORT is unset (docs/launching.md "Slurm"):
//   15000 + (SLURM_JOB_ID mod 1000) * 10 + (SLURM_STEP_ID mod 10), in 15000..24999.
// Jobs whose ids differ by less than 1000 never share a port, nor do steps 0-9 of one job that run
// at once. The block lies below Linux's ephemeral ports (32768-60999 by default), so no outgoing
// connection holds it, and away from 29500, which torchrun jobs sharing the machine default to.
constexpr int kSlurmPortBase = 15000;

std::optional<int> slurm_master_port(const Reader& r) {
  const std::string fix = "leave SLURM_JOB_ID and SLURM_STEP_ID to srun, or export MASTER_PORT";
  auto job = r.integer("SLURM_JOB_ID", 0, std::numeric_limits<long long>::max(), fix);
  if (!job) return std::nullopt;
  // Slurm's special steps (batch, interactive, extern) have ids near 2^32.
  const long long step = r.integer("SLURM_STEP_ID", 0, 4294967295LL, fix).value_or(0);
  return kSlurmPortBase + static_cast<int>(*job % 1000) * 10 + static_cast<int>(step % 10);
}

void read_openmpi(const Reader& r, LaunchContract& env) {
  env.source = EnvSource::kOpenMpi;
  const std::string fix = "run the program through Open MPI's mpirun, which sets OMPI_COMM_WORLD_*";
  env.world_size = r.required("OMPI_COMM_WORLD_SIZE", 1, kIntMax, fix);
  env.rank = r.required("OMPI_COMM_WORLD_RANK", 0, kIntMax, fix);
  env.local_rank =
      static_cast<int>(r.integer("OMPI_COMM_WORLD_LOCAL_RANK", 0, kIntMax, fix).value_or(0));
  env.local_world_size = static_cast<int>(
      r.integer("OMPI_COMM_WORLD_LOCAL_SIZE", 1, kIntMax, fix).value_or(env.world_size));
  env.node_rank = env.rank / env.local_world_size;  // mpirun's default block mapping
}

void read_accelerant_extras(const Reader& r, LaunchContract& env) {
  env.debug = r.chosen_flag("ACCELERANT_DEBUG_MODE");
  if (auto ms = r.integer("ACCELERANT_TIMEOUT_MS", 1, std::numeric_limits<long long>::max(),
                          "set a positive number of milliseconds")) {
    env.collective_timeout = std::chrono::milliseconds(*ms);
  }
  if (auto ms = r.integer("ACCELERANT_JOIN_TIMEOUT_MS", 1, std::numeric_limits<long long>::max(),
                          "set a positive number of milliseconds")) {
    env.join_timeout = std::chrono::milliseconds(*ms);
  }
  if (auto mp = r.text("ACCELERANT_MIXED_PRECISION")) {
    env.mixed_precision = parse_mixed_precision(*mp, "ACCELERANT_MIXED_PRECISION");
  }
  env.threads_per_process =
      static_cast<int>(r.integer("ACCELERANT_THREADS_PER_PROCESS", 0, kMaxThreadsPerProcess,
                                 "set the number of threads per worker")
                           .value_or(0));
  env.error_file = r.text("ACCELERANT_ERROR_FILE").value_or("");
  env.downcast_bf16 = r.chosen_flag("ACCELERANT_DOWNCAST_BF16");
  env.cpu = r.chosen_flag("ACCELERANT_USE_CPU");
  env.gradient_accumulation_steps =
      r.integer("ACCELERANT_GRADIENT_ACCUMULATION_STEPS", 1, kIntMax,
                "set a whole number of micro-batches per optimizer step, 1 or more");
}

void validate(const Reader& r, LaunchContract& env) {
  const bool torchrun_like =
      env.source == EnvSource::kAccelerant || env.source == EnvSource::kTorchrun;
  const char* rank_var = torchrun_like                     ? "RANK"
                         : env.source == EnvSource::kSlurm ? "SLURM_PROCID"
                                                           : "OMPI_COMM_WORLD_RANK";
  if (env.rank >= env.world_size) {
    fail(rank_var, std::to_string(env.rank),
         detail::str("is not less than the world size ", env.world_size,
                     " (ranks count from 0 to world size - 1)"),
         kLauncherHint);
  }
  if (env.local_rank >= env.local_world_size) {
    fail(torchrun_like ? "LOCAL_RANK" : "local rank", std::to_string(env.local_rank),
         detail::str("is not less than the local world size ", env.local_world_size),
         kLauncherHint);
  }
  if (env.local_world_size > env.world_size) {
    fail(torchrun_like ? "LOCAL_WORLD_SIZE" : "local world size",
         std::to_string(env.local_world_size),
         detail::str("is larger than the world size ", env.world_size), kLauncherHint);
  }
  if (env.source != EnvSource::kSlurm) {
    env.num_nodes = (env.world_size + env.local_world_size - 1) / env.local_world_size;
  }
  if (env.node_rank >= env.num_nodes) {
    fail(torchrun_like ? "GROUP_RANK" : "node rank", std::to_string(env.node_rank),
         detail::str("is not less than the number of machines ", env.num_nodes), kLauncherHint);
  }

  auto addr = r.text("MASTER_ADDR");
  // mpirun tells each rank how many ranks share its machine: when that is all of them, the job is
  // on this machine and loopback is the right meeting place, so `mpirun -np 4 ./train` just runs.
  // torchrun sets MASTER_ADDR itself; srun names the step's machines, and rank 0 runs on the first.
  if (!addr && env.source == EnvSource::kOpenMpi && env.local_world_size == env.world_size) {
    addr = "127.0.0.1";
  }
  if (!addr && env.source == EnvSource::kSlurm && env.world_size > 1) addr = slurm_master_addr(r);
  if (env.world_size > 1 && !addr) {
    fail("MASTER_ADDR", "",
         detail::str("is missing but the world has ", env.world_size,
                     " processes, which must meet at the main machine's address"),
         env.source == EnvSource::kSlurm
             ? "run the program through srun, which sets SLURM_STEP_NODELIST, or export "
               "MASTER_ADDR=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n 1) in the "
               "batch script before srun"
             : "export MASTER_ADDR to the address of the machine that runs rank 0 (127.0.0.1 on "
               "one machine)");
  }
  env.master_addr = addr.value_or("127.0.0.1");
  auto port = r.integer("MASTER_PORT", 1, 65535,
                        "set MASTER_PORT to a free TCP port between 1 and 65535 on the main "
                        "machine (e.g. 29500)");
  if (!port && env.source == EnvSource::kSlurm) port = slurm_master_port(r);
  env.master_port = static_cast<int>(port.value_or(29500));
}

}  // namespace

const char* to_string(EnvSource source) {
  switch (source) {
    case EnvSource::kNone:
      return "none";
    case EnvSource::kAccelerant:
      return "accelerant";
    case EnvSource::kTorchrun:
      return "torchrun";
    case EnvSource::kSlurm:
      return "slurm";
    case EnvSource::kOpenMpi:
      return "openmpi";
  }
  return "unknown";
}

LaunchContract parse_launch_contract(const EnvLookup& lookup) {
  Reader r(lookup);
  LaunchContract env;
  read_accelerant_extras(r, env);
  if (r.text("RANK") || r.text("WORLD_SIZE")) {
    read_torchrun(r, env);
  } else if (r.text("SLURM_PROCID") && r.text("SLURM_NTASKS")) {
    read_slurm(r, env);
  } else if (r.text("OMPI_COMM_WORLD_RANK") || r.text("OMPI_COMM_WORLD_SIZE")) {
    read_openmpi(r, env);
  } else {
    return env;  // a plain program: one process
  }
  validate(r, env);
  return env;
}

EnvLookup process_environment() {
  return [](const std::string& var) { return environment_value(var); };
}

LaunchContract read_launch_contract() { return parse_launch_contract(process_environment()); }

std::map<std::string, std::string> to_environment(const LaunchContract& env) {
  std::map<std::string, std::string> vars = {
      {"RANK", std::to_string(env.rank)},
      {"WORLD_SIZE", std::to_string(env.world_size)},
      {"LOCAL_RANK", std::to_string(env.local_rank)},
      {"LOCAL_WORLD_SIZE", std::to_string(env.local_world_size)},
      {"GROUP_RANK", std::to_string(env.node_rank)},
      {"MASTER_ADDR", env.master_addr},
      {"MASTER_PORT", std::to_string(env.master_port)},
      {"TORCHELASTIC_RESTART_COUNT", std::to_string(env.restart_count)},
      {"ACCELERANT_LAUNCHER", "1"},
      {"ACCELERANT_AGENT_STORE", env.agent_hosts_store ? "1" : "0"},
      {"ACCELERANT_RESTART_COUNT", std::to_string(env.restart_count)},
  };
  if (env.debug) vars["ACCELERANT_DEBUG_MODE"] = *env.debug ? "1" : "0";
  if (env.mixed_precision) vars["ACCELERANT_MIXED_PRECISION"] = to_string(*env.mixed_precision);
  if (env.collective_timeout)
    vars["ACCELERANT_TIMEOUT_MS"] = std::to_string(env.collective_timeout->count());
  if (env.join_timeout) {
    vars["ACCELERANT_JOIN_TIMEOUT_MS"] = std::to_string(env.join_timeout->count());
  }
  if (env.threads_per_process > 0) {
    vars["ACCELERANT_THREADS_PER_PROCESS"] = std::to_string(env.threads_per_process);
    vars["OMP_NUM_THREADS"] = std::to_string(env.threads_per_process);
  }
  if (!env.error_file.empty()) vars["ACCELERANT_ERROR_FILE"] = env.error_file;
  if (!env.job_secret.empty()) vars["ACCELERANT_JOB_SECRET"] = env.job_secret;
  if (env.recovers_in_place) vars["ACCELERANT_RECOVER_IN_PLACE"] = "1";
  if (env.joins_running_group) vars["ACCELERANT_JOINS_RUNNING_GROUP"] = "1";
  if (env.machines_may_join) vars["ACCELERANT_MACHINES_MAY_JOIN"] = "1";
  if (env.downcast_bf16) vars["ACCELERANT_DOWNCAST_BF16"] = *env.downcast_bf16 ? "1" : "0";
  if (env.cpu) vars["ACCELERANT_USE_CPU"] = *env.cpu ? "1" : "0";
  if (env.gradient_accumulation_steps) {
    vars["ACCELERANT_GRADIENT_ACCUMULATION_STEPS"] =
        std::to_string(*env.gradient_accumulation_steps);
  }
  return vars;
}

}  // namespace accelerant
