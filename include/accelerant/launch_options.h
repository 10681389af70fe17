// The options of accelerant::launch and launch_program, and launch_program itself: what a
// launcher needs without LibTorch. `accelerant launch` (which does not load LibTorch) is built on
// this header alone; launch.h adds the in-program launcher, whose results travel as LibTorch
// pickles.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "accelerant/environment.h"  // MixedPrecision, Recovery
#include "accelerant/error.h"
#include "accelerant/options.h"

namespace accelerant {

/// Options of launch() and launch_program(), set with chained setters
/// (`LaunchOptions().processes_per_node(4)`): the size and shape of the group, its rendezvous,
/// restarts, the settings passed to the workers, and what becomes of their output. Invalid values
/// make launch throw LaunchError before anything is forked.
struct LaunchOptions {
  /// Worker processes on this machine (torchrun: nproc_per_node; each worker sees it as
  /// LOCAL_WORLD_SIZE). Not Config::world_size, which counts across machines. Must fit this
  /// process's RLIMIT_NOFILE (the launcher holds about 8 descriptors per worker) and, below root,
  /// the user's RLIMIT_NPROC; launch checks both before anything starts. Default: 1.
  ACCELERANT_OPTION(int, processes_per_node) = 1;
  /// Address of the machine with node_rank 0, where the job's store listens. A name that does not
  /// resolve makes launch throw LaunchError saying so: at once on machine 0, after join_timeout on
  /// the others. Default: 127.0.0.1.
  ACCELERANT_OPTION(std::string, master_addr) = "127.0.0.1";
  /// Port of the job's store. 0 = a free port chosen by the operating system (one machine only;
  /// with num_nodes > 1 every node must be told the same port). Default: 0.
  ACCELERANT_OPTION(int, master_port) = 0;
  /// This machine's index among num_nodes. Default: 0.
  ACCELERANT_OPTION(int, node_rank) = 0;
  /// Machines in the job, each running its own launch with the same processes_per_node; with
  /// min_nodes, the most it runs on. Default: 1.
  ACCELERANT_OPTION(int, num_nodes) = 1;
  /// Elastic membership (torchrun's --nnodes MIN:MAX, with num_nodes the MAX): the fewest machines
  /// the job goes on with. A machine lost while at least min_nodes remain (machine 0, which hosts
  /// the job's store, excepted) restarts the group on the others, which wait up to rejoin_timeout
  /// for it or another launcher with its node_rank, then go on with the machines there: fewer
  /// processes, the data re-sharded over them, each resuming from the last checkpoint, and the
  /// global batch kept by raising gradient_accumulation_steps where it divides (said otherwise).
  /// At the start the launchers wait for every machine until min_nodes are there, then up to
  /// rejoin_timeout more. Default: unset = num_nodes (a lost machine ends the job).
  ACCELERANT_OPTION(std::optional<int>, min_nodes) = std::nullopt;
  /// With min_nodes below num_nodes: how long the launchers wait for missing machines (a lost one
  /// coming back, one not yet started) before going on without them. Under
  /// Recovery::kReplaceFailedWorker on several machines: how long machine 0 waits for a launcher
  /// to come back for a lost machine, whose workers it starts as replacements while the others go
  /// on (then the loss ends the job, or restarts it on fewer machines). Default: 60 s.
  ACCELERANT_OPTION(std::chrono::milliseconds, rejoin_timeout) = std::chrono::seconds(60);
  /// How often the whole group is restarted after a worker fails (with
  /// Recovery::kReplaceFailedWorker: how many failed workers are replaced, and whole restarts,
  /// together). Default: 0.
  ACCELERANT_OPTION(int, max_restarts) = 0;
  /// What a failure within max_restarts leads to. Default: Recovery::kRestartGroup.
  ACCELERANT_OPTION(Recovery, recovery) = Recovery::kRestartGroup;
  /// How often the agent checks its workers. Default: 100 ms.
  ACCELERANT_OPTION(std::chrono::milliseconds, monitor_interval) = std::chrono::milliseconds(100);
  /// Passed to workers as ACCELERANT_MIXED_PRECISION (no, fp16 or bf16).
  /// Default: MixedPrecision::kNo.
  ACCELERANT_OPTION(MixedPrecision, mixed_precision) = MixedPrecision::kNo;
  /// Passed to workers as ACCELERANT_DOWNCAST_BF16: the Accelerator keeps bf16 weights.
  /// Default: unset (each worker resolves it: its environment, its config file, false).
  ACCELERANT_OPTION(std::optional<bool>, downcast_bf16) = std::nullopt;
  /// Passed to workers as ACCELERANT_USE_CPU: the Accelerator trains on the CPU even when CUDA is
  /// available. Default: unset (each worker resolves it: its environment, its config file, false).
  ACCELERANT_OPTION(std::optional<bool>, cpu) = std::nullopt;
  /// Passed to workers as ACCELERANT_GRADIENT_ACCUMULATION_STEPS: micro-batches per optimizer
  /// step, 1 or more. Default: unset (each worker resolves it: its environment, its config file,
  /// 1).
  ACCELERANT_OPTION(std::optional<int64_t>, gradient_accumulation_steps) = std::nullopt;
  /// Intra-op threads per worker. 0 = cores / processes_per_node (at least 1). When this process
  /// has already started threads (LibTorch's OpenMP pool, OpenBLAS), forked workers cannot use
  /// thread pools safely, so they run single-threaded and launch says so. Default: 0.
  ACCELERANT_OPTION(int, threads_per_process) = 0;
  /// Debug mode: a dry fork first, then cross-rank shape checks before every collective.
  /// Default: ACCELERANT_DEBUG_MODE, else off.
  ACCELERANT_OPTION(std::optional<bool>, debug) = std::nullopt;
  /// With num_nodes > 1: how long the launchers wait for every machine to arrive (and, after a
  /// restart, to be ready again) before giving up, naming the machines that did not come. Also
  /// how long the workers wait for each other at start-up (passed as ACCELERANT_JOIN_TIMEOUT_MS).
  /// Default: 10 minutes (torchrun's join_timeout).
  ACCELERANT_OPTION(std::chrono::milliseconds, join_timeout) = std::chrono::minutes(10);
  /// Collective timeout inside the workers (passed as ACCELERANT_TIMEOUT_MS): a collective that
  /// does not complete within it fails, naming the ranks it waited for. (A hang no collective can
  /// leave is named in seconds by the workers' watchdog: docs/collectives.md.)
  /// Default: unset = this process's ACCELERANT_TIMEOUT_MS when the user set it, else 30 minutes.
  ACCELERANT_OPTION(std::optional<std::chrono::milliseconds>, collective_timeout) = std::nullopt;
  /// When the group is stopped: the time between the stop signal (SIGTERM, or the SIGINT, SIGTERM
  /// or SIGHUP this process caught, passed on) and SIGKILL, both sent to each worker's process
  /// group, so that what a worker started goes too. Default: 5 s.
  ACCELERANT_OPTION(std::chrono::milliseconds, stop_grace_period) = std::chrono::seconds(5);
  /// Prefix every line a worker prints with "[rank r/N] " (rank_prefix). Default: false.
  ACCELERANT_OPTION(bool, prefix_output) = false;
  /// Directory for per-rank logs: `attempt_<n>/rank_<r>.stdout` and `.stderr` (one directory per
  /// restart attempt). Empty = no log files. Created when missing; one that cannot be written
  /// makes launch throw LaunchError before any worker starts. Default: empty.
  ACCELERANT_OPTION(std::string, log_dir) = "";
  /// With log_dir: also show the workers' output on the console (without log_dir it always is).
  /// Default: false.
  ACCELERANT_OPTION(bool, tee) = false;
  /// Lines of a failed worker's stderr kept for the error report. Default: 20.
  ACCELERANT_OPTION(int, stderr_tail_lines) = 20;
  /// Print the "Launching training on N CPUs." banner and restart notices. Default: true.
  ACCELERANT_OPTION(bool, verbose) = true;
};

/// What a forked worker runs: the job's function for the worker with global rank `index`, its
/// result serialised (empty for none).
using WorkerBody = std::function<std::vector<char>(int index)>;

/// Runs `command` (a program and its arguments; no shell) as options.processes_per_node workers on
/// this machine: the agent of launch() (rendezvous variables, watching, restarts, output relay,
/// failure report) with each worker exec'ing the program. Returns once every worker exited 0. A
/// worker that exits, even with 0, while others still run and then sit idle (no CPU, no I/O) for
/// 3 s fails the group like a crash, named in the report (docs/launching.md). Throws Error when
/// the program cannot be run (missing, not executable, a directory), and LaunchError when the
/// group fails after max_restarts restarts. This is `accelerant launch`.
void launch_program(const std::vector<std::string>& command, const LaunchOptions& options);

}  // namespace accelerant
