// The Accelerator's options and where each value comes from. Every setting is taken from the
// first of these that sets it:
//   1. the option set in code (AcceleratorOptions), like a command-line flag;
//   2. the environment a launcher sets (ACCELERANT_MIXED_PRECISION, ...; table in
//      docs/accelerator.md; every variable in docs/environment.md);
//   3. the config file (accelerant config): $ACCELERANT_CONFIG_FILE, else
//      $XDG_CACHE_HOME/accelerant/default_config.yaml, else
//      ~/.cache/accelerant/default_config.yaml;
//   4. the default.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "accelerant/config.h"
#include "accelerant/environment.h"  // MixedPrecision and its parser
#include "accelerant/launch_contract.h"
#include "accelerant/options.h"

namespace accelerant {

/// The Accelerator's options, set in code with chained setters
/// (`AcceleratorOptions().mixed_precision(MixedPrecision::kBf16)`). An unset std::optional option
/// falls back to its environment variable, then the config file, then its default (see the file
/// comment); the others are set in code only. resolve_accelerator_settings() turns them into
/// AcceleratorSettings.
struct AcceleratorOptions {
  /// kNo, kFp16 (CUDA only, with loss scaling) or kBf16 (CPU and CUDA autocast). Text from a
  /// user (a flag) becomes one with parse_mixed_precision. Default: unset
  /// (ACCELERANT_MIXED_PRECISION, then the config file, then kNo).
  ACCELERANT_OPTION(std::optional<MixedPrecision>, mixed_precision) = std::nullopt;
  /// Keep the model's weights in bf16 (converted at prepare) while gradient all-reduces, reduce()
  /// and gather() of bf16 values run in fp32. See docs/mixed_precision.md. Default: false.
  ACCELERANT_OPTION(std::optional<bool>, downcast_bf16) = std::nullopt;
  /// Micro-batches per optimizer step. Default: 1.
  ACCELERANT_OPTION(std::optional<int64_t>, gradient_accumulation_steps) = std::nullopt;
  /// A loader's batch_size is the global batch, split across processes. Default: false.
  ACCELERANT_OPTION(std::optional<bool>, split_batches) = std::nullopt;
  /// Pad the last step so that every process has the same number of batches. Default: true.
  ACCELERANT_OPTION(std::optional<bool>, even_batches) = std::nullopt;
  /// Train on the CPU even when CUDA is available: the process state then makes no CUDA context
  /// and uses Gloo. Default: false.
  ACCELERANT_OPTION(std::optional<bool>, cpu) = std::nullopt;
  /// How long the rendezvous and each collective wait for the other processes before failing with
  /// a diagnosis; handed to ProcessState. Default: ACCELERANT_TIMEOUT_MS, else the config file's
  /// collective_timeout, else kDefaultCollectiveTimeout (30 minutes).
  ACCELERANT_OPTION(std::optional<std::chrono::milliseconds>, collective_timeout) = std::nullopt;
  /// Check op, dtype and shape across the processes before every collective (communicator.h), so
  /// that a mismatch fails at once naming both calls instead of hanging; handed to ProcessState.
  /// Default: ACCELERANT_DEBUG_MODE, else the config file's debug, else false.
  ACCELERANT_OPTION(std::optional<bool>, debug) = std::nullopt;
  /// Seeds every generator at construction (set_seed) and the loaders' shuffling. Default: unset
  /// (generators untouched, loaders shuffle with seed 0).
  ACCELERANT_OPTION(std::optional<uint64_t>, seed) = std::nullopt;
  /// CPU defaults: intra-op and BLAS threads = cores / local processes (unless a launcher or
  /// OMP_NUM_THREADS chose), and malloc thresholds that keep step-sized buffers out of mmap.
  /// Default: true.
  ACCELERANT_OPTION(std::optional<bool>, cpu_defaults) = std::nullopt;
  /// prepare(optimizer) steps torch::optim::SGD, Adam and AdamW with a fused update
  /// (fused_optimizer.h): one pass over a contiguous arena per step instead of several tensor
  /// operations per parameter. Other optimizer types are refused while this is on. Default: false.
  ACCELERANT_OPTION(bool, fused_optimizers) = false;
  /// Gradient bucket size in MiB for the all-reduce during backward. Default: 25.
  ACCELERANT_OPTION(int64_t, bucket_cap_mb) = 25;
  /// Treat trainable parameters that get no gradient as zero gradients instead of an error.
  /// Default: false.
  ACCELERANT_OPTION(bool, allow_unused_parameters) = false;
  /// ZeRO sharding across the processes (docs/zero.md): 1 keeps 1/N of the optimizer state on
  /// each process (each updates its share of every gradient bucket, then the parameters are
  /// all-gathered); 2 also reduce-scatters the gradients during backward instead of all-reducing
  /// them, so that each process receives only the share it updates. Implies the fused update
  /// (fused_optimizers), whose limits apply. 3 shards the parameters of the model's Sharded
  /// blocks (accelerant/sharded.h): prepare keeps each process's share of them, the optimizer
  /// updates the shares, and the rest of the model is trained as with 0; eager steps only;
  /// implies the fused update too, and its checkpoints load on any number of
  /// processes and under any stage (docs/zero.md, "Stage 3"). 0 is plain data parallelism; with one
  /// process every stage is. Default: 0.
  ACCELERANT_OPTION(int, zero_stage) = 0;
  /// Where automatic checkpoints go: save_state() without a directory writes
  /// `<project_dir>/checkpoints/checkpoint_<n>`, and load_state() without one reads the newest.
  /// Trackers (log_with) write under `<project_dir>/<project_name>/`.
  /// Default: none (save_state then needs a directory; trackers write under the current directory).
  ACCELERANT_OPTION(std::string, project_dir) = "";
  /// The built-in trackers that Accelerator::init_trackers starts and log() writes to, on the main
  /// process only: "tensorboard", "csv", "jsonl" (make_tracker, docs/observability.md).
  /// Default: none (log() writes only to trackers added with add_tracker).
  ACCELERANT_OPTION(std::vector<std::string>, log_with) = {};
  /// The step-time breakdown (docs/observability.md): each optimizer step's time split into
  /// waiting for data, forward+backward, the all-reduce wait, the optimizer and the code between
  /// steps. At each optimizer step that is a multiple of this (100, 200, ...) the processes
  /// exchange their medians over the steps since the last exchange (one small all-reduce), the main
  /// process logs them to the trackers as `step_time/rank_<r>/<phase>_ms`, and a process at least
  /// 20 % and 1 ms busier per step than the median of the others at two exchanges in a row is
  /// named once, with the phase it is slow in. metrics_report() shows the breakdown too. 0 turns it
  /// off, timers included (they cost well under 1 % of a step; docs/benchmarks.md). Default: 100.
  ACCELERANT_OPTION(int64_t, step_breakdown_every) = 100;
  /// Automatic checkpoints kept; older ones are removed once a new one is complete. 0 keeps all.
  /// Default: 0.
  ACCELERANT_OPTION(int, checkpoint_total_limit) = 0;
  /// Resume from the newest complete checkpoint in project_dir, if there is one, before the first
  /// batch: at the first begin() of a prepared loader (the start of an epoch's `for`), the only
  /// loader call that may load or talk to other ranks; its getters (epoch, position, size) never
  /// do, and before that begin() they tell the fresh position. Accelerator::auto_resume_now()
  /// resumes earlier, e.g. to read the resumed epoch before the loop. With max_restarts this is
  /// elastic recovery: a restarted group continues where the last checkpoint left it.
  /// Default: false.
  ACCELERANT_OPTION(bool, auto_resume) = false;
  /// The config file to read; unset = the default location (see the file comment).
  ACCELERANT_OPTION(std::optional<std::string>, config_file) = std::nullopt;
};

/// The settings in force, after resolution (Accelerator::settings()). Each field holds the value of
/// the AcceleratorOptions option of the same name, or of the layer below that set it (`sources`
/// says which); the initialisers are the defaults.
struct AcceleratorSettings {
  /// Autocast precision: kNo (fp32), kFp16 (CUDA only, with loss scaling) or kBf16. Also from
  /// ACCELERANT_MIXED_PRECISION or the config file's mixed_precision.
  MixedPrecision mixed_precision = MixedPrecision::kNo;
  /// Weights kept in bf16 while reductions of bf16 values run in fp32. Also from
  /// ACCELERANT_DOWNCAST_BF16 or the config file's downcast_bf16.
  bool downcast_bf16 = false;
  /// Micro-batches per optimizer step, 1 or more. Also from ACCELERANT_GRADIENT_ACCUMULATION_STEPS
  /// or the config file's gradient_accumulation_steps.
  int64_t gradient_accumulation_steps = 1;
  /// A loader's batch_size is the global batch, split across processes. Also from
  /// ACCELERANT_SPLIT_BATCHES.
  bool split_batches = false;
  /// The last step is padded so that every process has the same number of batches. Also from
  /// ACCELERANT_EVEN_BATCHES.
  bool even_batches = true;
  /// Training stays on the CPU even when CUDA is available. Also from ACCELERANT_USE_CPU or the
  /// config file's cpu.
  bool cpu = false;
  /// The collective timeout (the join at start-up has its own, ACCELERANT_JOIN_TIMEOUT_MS). Also
  /// from ACCELERANT_TIMEOUT_MS or the config file's collective_timeout (seconds).
  std::chrono::milliseconds collective_timeout = kDefaultCollectiveTimeout;
  /// Cross-rank checks before every collective. Also from ACCELERANT_DEBUG_MODE or the config
  /// file's debug.
  bool debug = false;
  /// The seed of every generator and of the loaders' shuffling, when an option or ACCELERANT_SEED
  /// chose one; unset leaves the generators untouched (the loaders shuffle with seed 0).
  std::optional<uint64_t> seed;
  /// Intra-op and BLAS thread counts and malloc thresholds sized for the CPU are applied. Also
  /// from ACCELERANT_CPU_DEFAULTS.
  bool cpu_defaults = true;
  /// For each setting that was not the default, where it came from: "option", "ACCELERANT_..."
  /// or "config file <path>".
  std::map<std::string, std::string> sources;
};

/// Resolves `options` over the environment and the config values. The settings a launcher passes
/// (downcast_bf16, cpu, gradient_accumulation_steps, collective_timeout, debug) come from
/// parse_launch_contract(env), the one reader of the launch contract. Throws accelerant::Error
/// (EnvironmentError for a variable) naming the source, the value and the accepted values when one
/// is invalid.
AcceleratorSettings resolve_accelerator_settings(const AcceleratorOptions& options,
                                                 const EnvLookup& env, const ConfigValues& config,
                                                 const std::string& config_path = "config file");

}  // namespace accelerant
