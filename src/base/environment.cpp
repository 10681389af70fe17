// The table of environment variables and the one accessor to the process's environment: the only
// file allowed to call getenv (scripts/check-environment). Rows are one per line and start with
// {"NAME", so that the check can read the declared names without compiling anything.
#include "accelerant/environment.h"

#include <cstdlib>

#include "accelerant/error.h"
#include "base/text.h"

namespace accelerant {
namespace {

constexpr const char* kContract = "settings (launch_contract.cpp: the launch contract)";
constexpr const char* kOptions = "settings (accelerator_options.cpp: AcceleratorOptions)";
constexpr const char* kConfig = "settings (config.cpp: the config file's location)";

const std::vector<EnvVariable> kTable = {
    // torchrun's contract, which Accelerant's launchers also set.
    {"RANK", "integer ≥ 0", "unset (one process)",
     "This process's index in the job, 0 ≤ RANK < WORLD_SIZE.", kContract},
    {"WORLD_SIZE", "integer ≥ 1", "unset (one process)", "The number of processes in the job.",
     kContract},
    {"LOCAL_RANK", "integer ≥ 0", "RANK", "This process's index on its machine.", kContract},
    {"LOCAL_WORLD_SIZE", "integer ≥ 1", "WORLD_SIZE", "The number of processes on this machine.",
     kContract},
    {"GROUP_RANK", "integer ≥ 0", "RANK / LOCAL_WORLD_SIZE", "This machine's index.", kContract},
    {"MASTER_ADDR", "host or address", "127.0.0.1 (required when WORLD_SIZE > 1)",
     "Where the processes meet: the machine that runs rank 0.", kContract},
    {"MASTER_PORT", "integer 1..65535", "29500", "The rendezvous port on MASTER_ADDR.", kContract},
    {"TORCHELASTIC_USE_AGENT_STORE", "bool", "false",
     "torchrun's agent hosts the TCPStore (not rank 0).", kContract},
    {"TORCHELASTIC_RESTART_COUNT", "integer ≥ 0", "0",
     "How many times torchrun restarted the group.", kContract},
    {"TORCHELASTIC_ERROR_FILE", "path", "unset",
     "torchrun's error file: a worker's fatal error is written there as JSON (torchrun's record() "
     "contract), so torchrun's failure summary quotes it.",
     kContract},
    // Slurm's srun.
    {"SLURM_PROCID", "integer ≥ 0", "unset", "srun's rank of this task.", kContract},
    {"SLURM_NTASKS", "integer ≥ 1", "unset", "srun's number of tasks.", kContract},
    {"SLURM_LOCALID", "integer ≥ 0", "0", "srun's index of this task on its machine.", kContract},
    {"SLURM_NODEID", "integer ≥ 0", "0", "srun's index of this machine.", kContract},
    {"SLURM_NNODES", "integer ≥ 1", "1", "srun's number of machines.", kContract},
    {"SLURM_NTASKS_PER_NODE", "integer ≥ 1", "SLURM_NTASKS / SLURM_NNODES, rounded up",
     "srun's tasks per machine.", kContract},
    {"SLURM_STEP_NODELIST", "Slurm hostlist, e.g. node[01-04,07]", "unset",
     "srun's machines of this step: the first is MASTER_ADDR when that is unset.", kContract},
    {"SLURM_JOB_NODELIST", "Slurm hostlist", "unset",
     "The job's machines: the first is MASTER_ADDR when that and SLURM_STEP_NODELIST are unset.",
     kContract},
    {"SLURM_NODELIST", "Slurm hostlist", "unset",
     "Older name of SLURM_JOB_NODELIST, read when neither node list above is set.", kContract},
    {"SLURM_JOB_ID", "integer ≥ 0", "unset",
     "Slurm's job id: MASTER_PORT is 15000 + (SLURM_JOB_ID mod 1000) × 10 + (SLURM_STEP_ID mod "
     "10) when unset.",
     kContract},
    {"SLURM_STEP_ID", "integer ≥ 0", "0",
     "Slurm's step id within the job, so that two steps running at once meet at different ports.",
     kContract},
    {"SLURM_CPUS_PER_TASK", "integer ≥ 1", "unset (usable CPUs / processes on the machine)",
     "srun -c: CPUs per task, the worker's intra-op and OpenBLAS threads (at most its usable "
     "CPUs).",
     kContract},
    // Open MPI's mpirun.
    {"OMPI_COMM_WORLD_RANK", "integer ≥ 0", "unset", "mpirun's rank of this process.", kContract},
    {"OMPI_COMM_WORLD_SIZE", "integer ≥ 1", "unset", "mpirun's number of processes.", kContract},
    {"OMPI_COMM_WORLD_LOCAL_RANK", "integer ≥ 0", "0",
     "mpirun's index of this process on its machine.", kContract},
    {"OMPI_COMM_WORLD_LOCAL_SIZE", "integer ≥ 1", "OMPI_COMM_WORLD_SIZE",
     "mpirun's processes on this machine.", kContract},
    // Accelerant's own part of the launch contract.
    {"ACCELERANT_LAUNCHER", "any non-empty text", "unset",
     "Set by Accelerant's launchers: the job is theirs.", kContract},
    {"ACCELERANT_AGENT_STORE", "bool", "false",
     "The launcher's agent hosts the TCPStore (not rank 0).", kContract},
    {"ACCELERANT_JOB_SECRET", "any text", "unset (keys without a secret)",
     "Set by `accelerant launch` on one machine: the job's store keys live under it "
     "(docs/security.md).",
     kContract},
    {"ACCELERANT_RESTART_COUNT", "integer ≥ 0", "TORCHELASTIC_RESTART_COUNT",
     "The group's generation: how many times it was formed again (restarted, or regrouped "
     "around a replacement).",
     kContract},
    {"ACCELERANT_RECOVER_IN_PLACE", "bool", "false",
     "Set by the launcher under Recovery::kReplaceFailedWorker: a failed process is replaced "
     "alone and the Accelerator recovers its step in place.",
     kContract},
    {"ACCELERANT_JOINS_RUNNING_GROUP", "bool", "false",
     "Set by the launcher on a replacement: it takes its training state from a survivor.",
     kContract},
    {"ACCELERANT_MACHINES_MAY_JOIN", "bool", "false",
     "Set by the launcher under elastic membership while the group runs on fewer machines than "
     "it may: at a machine's arrival the Accelerator (with auto_resume) stops at a step boundary "
     "and saves a checkpoint, and the group restarts with the new machine.",
     kContract},
    {"ACCELERANT_DEBUG_MODE", "bool", "false",
     "Check every collective across ranks (and a dry fork first).", kContract},
    {"ACCELERANT_TIMEOUT_MS", "integer ≥ 1", "unset (the library's default)",
     "Collective timeout in milliseconds.", kContract},
    {"ACCELERANT_JOIN_TIMEOUT_MS", "integer ≥ 1", "600000 (10 minutes)",
     "How long the ranks wait for each other to start and meet, in milliseconds (the launcher's "
     "--join_timeout).",
     kContract},
    {"ACCELERANT_MIXED_PRECISION", "no | fp16 | bf16", "no (then the config file)",
     "Mixed precision: no (fp32), fp16 (CUDA, loss scaling) or bf16 (CPU and CUDA); any case; "
     "fp32 and none are refused.",
     kOptions},
    {"ACCELERANT_THREADS_PER_PROCESS", "integer 0..4096", "0 (cores / processes on the machine)",
     "Intra-op threads per worker, chosen by the launcher.", kContract},
    {"ACCELERANT_ERROR_FILE", "path", "unset",
     "Where a worker records its fatal error for the launcher.", kContract},
    // The Accelerator's settings (option > environment > config file > default).
    {"ACCELERANT_DOWNCAST_BF16", "bool", "false (then the config file)",
     "Keep the model's weights in bf16.", kOptions},
    {"ACCELERANT_GRADIENT_ACCUMULATION_STEPS", "integer ≥ 1", "1 (then the config file)",
     "Micro-batches per optimizer step.", kOptions},
    {"ACCELERANT_SPLIT_BATCHES", "bool", "false", "A loader's batch_size is the global batch.",
     kOptions},
    {"ACCELERANT_EVEN_BATCHES", "bool", "true",
     "Pad the last step so every process has as many batches.", kOptions},
    {"ACCELERANT_USE_CPU", "bool", "false (then the config file)",
     "Train on the CPU even when CUDA is available.", kOptions},
    {"ACCELERANT_CPU_DEFAULTS", "bool", "true",
     "Thread counts and malloc thresholds sized for the CPU.", kOptions},
    {"ACCELERANT_SEED", "integer ≥ 0", "unset (generators untouched)",
     "Seed every generator and the loaders.", kOptions},
    // Where the config file is.
    {"ACCELERANT_CONFIG_FILE", "path", "unset", "The config file to read and write.", kConfig},
    {"XDG_CACHE_HOME", "path", "unset",
     "Without ACCELERANT_CONFIG_FILE: `<it>/accelerant/default_config.yaml`.", kConfig},
    {"HOME", "path", "unset (then .)", "Otherwise: `<it>/.cache/accelerant/default_config.yaml`.",
     kConfig},
    // comm.
    {"GLOO_SOCKET_IFNAME", "comma-separated interface names",
     "unset (the address towards MASTER_ADDR)", "The network interfaces Gloo uses, as in PyTorch.",
     "comm (process_state.cpp)"},
    {"ACCELERANT_SHM_ALLREDUCE", "bool", "true",
     "All-reduce between the ranks of one machine through shared memory (false: through Gloo "
     "only).",
     "comm (machine_identity.cpp)"},
    {"ACCELERANT_SHM_GROUP", "text", "unset",
     "A label added to the machine's identity: ranks with different labels do not share memory "
     "(tests use it "
     "to stand for separate machines).",
     "comm (machine_identity.cpp)"},
    {"ACCELERANT_SHM_CHUNK_BYTES", "integer 4096..1073741824", "the built-in chunk size",
     "Bytes per chunk of the shared-memory all-reduce.", "comm (shm_all_reduce.cpp)"},
    // base.
    {"ACCELERANT_CONSOLE_TERMINAL", "none | stdout | stderr | both", "none",
     "Set by the launchers for their workers: which of the worker's streams they relay to a "
     "terminal, so that a ProgressBar on that pipe redraws its line instead of printing lines.",
     "base (progress_bar.cpp)"},
    // launch.
    {"PATH", "directories separated by :", "/usr/bin:/bin",
     "Where accelerant launch looks for the program.", "launch (launch_program.cpp)"},
    // The Accelerator and the graph layer.
    {"OMP_NUM_THREADS", "integer", "unset",
     "When set, the CPU defaults leave the thread count alone.",
     "accelerator (accelerator.cpp); set by the launchers"},
    {"ACCELERANT_METRICS", "bool", "false",
     "Print the graph-step metrics report when the program exits.", "graph (metrics.cpp)"},
    {"ACCELERANT_EMULATE_REPLAYS", "bool", "false",
     "Graph steps on the CPU emulate GPU replays (GraphStepOptions' default).",
     "graph (graph_step.cpp)"},
    // Shown by accelerant env only.
    {"OPENBLAS_NUM_THREADS", "integer", "unset",
     "OpenBLAS's thread count (read by OpenBLAS itself).", "the CLI (accelerant env shows it)"},
};

}  // namespace

const std::vector<EnvVariable>& environment_variables() { return kTable; }

const EnvVariable* find_environment_variable(const std::string& name) {
  for (const auto& row : kTable) {
    if (name == row.name) return &row;
  }
  return nullptr;
}

std::optional<std::string> environment_value(const std::string& name) {
  if (find_environment_variable(name) == nullptr) {
    throw Error(detail::str(
        "Accelerant read the environment variable ", name,
        ", which the table of environment variables (src/base/environment.cpp, "
        "docs/environment.md) does not declare. Likely cause: a new read was added "
        "without its row. Fix: add the row to the table and regenerate docs/environment.md "
        "with `accelerant env --markdown`."));
  }
  const char* value = std::getenv(name.c_str());
  if (value == nullptr) return std::nullopt;
  return std::string(value);
}

std::optional<bool> environment_flag(const std::string& name) {
  auto value = environment_value(name);
  if (!value || value->empty()) return std::nullopt;
  return parse_bool(*value, name);
}

}  // namespace accelerant
