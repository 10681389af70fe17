// The launch contract: what a launcher tells each process it starts (its rank, the world, where to
// meet, and the settings a launcher passes down), read in this one place. Launchers describe a
// process's identity through environment variables; this file turns the variables of every
// launcher Accelerant understands into one typed LaunchContract, and back (for Accelerant's own
// launchers, which write it with to_environment).
//
// Recognised, in this order of precedence:
//   1. torchrun's contract, which Accelerant's launchers also set (RANK, WORLD_SIZE, LOCAL_RANK,
//      LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT), plus ACCELERANT_* extras;
//   2. Slurm's srun (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID, SLURM_NNODES,
//      SLURM_CPUS_PER_TASK); without MASTER_ADDR and MASTER_PORT, the tasks meet on the first
//      machine of SLURM_STEP_NODELIST (else SLURM_JOB_NODELIST, SLURM_NODELIST) at a port derived
//      from SLURM_JOB_ID and SLURM_STEP_ID (docs/launching.md "Slurm");
//   3. Open MPI's mpirun (OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE).
// None of them: one process, no rendezvous.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>

#include "accelerant/environment.h"  // MixedPrecision

namespace accelerant {

/// How long a rendezvous or collective waits for the other processes when neither an option, the
/// launcher (ACCELERANT_TIMEOUT_MS) nor the config file's collective_timeout chose.
inline constexpr std::chrono::milliseconds kDefaultCollectiveTimeout = std::chrono::minutes(30);

/// How long the ranks wait for each other to join (start, reach the store) when no launcher said
/// (ACCELERANT_JOIN_TIMEOUT_MS): start-up is not held to the collective timeout, which may be far
/// shorter than the time a loaded machine takes to start every process. LaunchOptions::join_timeout
/// has the same default.
inline constexpr std::chrono::milliseconds kDefaultJoinTimeout = std::chrono::minutes(10);

/// The most intra-op threads a launcher may give each worker (ACCELERANT_THREADS_PER_PROCESS, the
/// config file's threads_per_process): the launcher refuses more, as the workers would.
inline constexpr int kMaxThreadsPerProcess = 4096;

/// Which launcher's variables described the process: kNone (none set: one process), kAccelerant
/// (torchrun's contract with ACCELERANT_LAUNCHER, set by `accelerant launch` and
/// accelerant::launch), kTorchrun, kSlurm (srun) or kOpenMpi (mpirun).
enum class EnvSource { kNone, kAccelerant, kTorchrun, kSlurm, kOpenMpi };

/// "none", "accelerant", "torchrun", "slurm" or "openmpi".
const char* to_string(EnvSource source);

/// A process's place in the job, as its launcher described it.
struct LaunchContract {
  EnvSource source = EnvSource::kNone;  ///< the launcher whose variables were read
  int rank = 0;                         ///< RANK / SLURM_PROCID / OMPI_COMM_WORLD_RANK
  int world_size = 1;                   ///< WORLD_SIZE / SLURM_NTASKS / OMPI_COMM_WORLD_SIZE
  int local_rank = 0;                   ///< index on this machine
  int local_world_size = 1;             ///< processes on this machine
  int node_rank = 0;                    ///< GROUP_RANK / SLURM_NODEID / rank / local_world_size
  int num_nodes = 1;  ///< machines: SLURM_NNODES, else ⌈world_size / local_world_size⌉
  /// MASTER_ADDR; required when world_size > 1, except under srun (the first machine of the
  /// step's node list) and under mpirun on one machine (127.0.0.1).
  std::string master_addr;
  /// MASTER_PORT. Default: 29500 (torchrun's); under srun 15000 + (SLURM_JOB_ID mod 1000) * 10 +
  /// (SLURM_STEP_ID mod 10).
  int master_port = 29500;
  /// The launcher's agent hosts the TCPStore (TORCHELASTIC_USE_AGENT_STORE or
  /// ACCELERANT_AGENT_STORE); otherwise rank 0 hosts it.
  bool agent_hosts_store = false;
  /// ACCELERANT_JOB_SECRET: the job's keys in the store live under it, so that another process
  /// that reaches the store cannot read or overwrite them (docs/security.md). Set by
  /// `accelerant launch` on one machine; empty = keys without a secret (torchrun, srun, mpirun).
  std::string job_secret;
  int restart_count = 0;  ///< ACCELERANT_RESTART_COUNT / TORCHELASTIC_RESTART_COUNT
  /// ACCELERANT_RECOVER_IN_PLACE: the launcher replaces a failed worker alone
  /// (Recovery::kReplaceFailedWorker), so an Accelerator that meets a dead process recovers its
  /// step in place instead of failing.
  bool recovers_in_place = false;
  /// ACCELERANT_JOINS_RUNNING_GROUP: this process replaces a failed worker of a running group; its
  /// Accelerator takes the training state from a survivor instead of starting or resuming.
  bool joins_running_group = false;
  /// ACCELERANT_MACHINES_MAY_JOIN: elastic membership runs this group on fewer machines than it
  /// may have, so a machine may arrive: an Accelerator with auto_resume then stops every process
  /// at the same step boundary, saves a checkpoint, and waits for the launcher to restart the
  /// group with the new machine (docs/launching.md "Elastic membership").
  bool machines_may_join = false;
  /// ACCELERANT_DEBUG_MODE; unset when the launcher did not choose (then the Accelerator's option
  /// or the config file decides, else off).
  std::optional<bool> debug;
  /// ACCELERANT_TIMEOUT_MS: collective timeout chosen by the launcher; unset = the
  /// option, the config file's collective_timeout, else kDefaultCollectiveTimeout.
  std::optional<std::chrono::milliseconds> collective_timeout;
  /// ACCELERANT_JOIN_TIMEOUT_MS: how long the ranks wait for each other to join, set by the
  /// launcher from its join timeout; unset = kDefaultJoinTimeout.
  std::optional<std::chrono::milliseconds> join_timeout;
  /// ACCELERANT_MIXED_PRECISION (parse_mixed_precision); unset = the launcher left it to the
  /// Accelerator's other sources (AcceleratorOptions, then the config file).
  std::optional<MixedPrecision> mixed_precision;
  int threads_per_process = 0;  ///< ACCELERANT_THREADS_PER_PROCESS; 0 = not set
  /// CPUs the launcher allotted to each process: SLURM_CPUS_PER_TASK (srun -c N); 0 = not set.
  /// The Accelerator's CPU defaults size the thread pools from it (cpu_settings.h).
  int cpus_per_process = 0;
  std::string error_file;  ///< ACCELERANT_ERROR_FILE: where to record a fatal error
  /// TORCHELASTIC_ERROR_FILE: torchrun's error file, where a fatal error is recorded as the JSON
  /// its failure summary reads.
  std::string torchelastic_error_file;
  // Accelerator settings the launcher chose for its workers; unset = the launcher left them to the
  // worker's own resolution (accelerator_options.h), which reads them from here.
  std::optional<bool> downcast_bf16;  ///< ACCELERANT_DOWNCAST_BF16
  std::optional<bool> cpu;            ///< ACCELERANT_USE_CPU
  std::optional<int64_t>
      gradient_accumulation_steps;  ///< ACCELERANT_GRADIENT_ACCUMULATION_STEPS, ≥ 1

  /// True when the job has more than one process, which then meet at master_addr:master_port.
  bool distributed() const { return world_size > 1; }
  /// True when a launcher started this process (source is not kNone), even as a group of one:
  /// accelerant::launch then runs its function here as this rank instead of forking a group.
  bool launched() const { return source != EnvSource::kNone; }
};

/// Looks one variable up; std::nullopt when it is unset.
using EnvLookup = std::function<std::optional<std::string>(const std::string&)>;

/// This process's environment as an EnvLookup, through environment_value(): a name missing from
/// the table of variables (environment.h) throws. Tests pass their own EnvLookup instead.
EnvLookup process_environment();

/// Parses and validates. Throws EnvironmentError naming the variable, its value and the fix.
LaunchContract parse_launch_contract(const EnvLookup& lookup);

/// parse_launch_contract over this process's environment.
LaunchContract read_launch_contract();

/// The variables a launcher sets so that a worker's read_launch_contract() returns `env`:
/// torchrun's contract plus ACCELERANT_*.
std::map<std::string, std::string> to_environment(const LaunchContract& env);

}  // namespace accelerant
