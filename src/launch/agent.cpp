// The agent behind accelerant::launch and `accelerant launch`: validates options, hosts (or joins)
// the job's store, forks the local group, watches it, restarts it on failure up to max_restarts,
// and reports. What the machines of a multi-node job tell each other is in node_group.h; what
// only a LibTorch process adds around a fork comes in as AgentHooks (agent.h).
#include "launch/agent.h"

#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <thread>

#include "accelerant/cpu_settings.h"
#include "accelerant/environment.h"
#include "accelerant/launch_contract.h"
#include "base/text.h"
#include "comm/flight_record.h"
#include "launch/failure_report.h"
#include "launch/node_group.h"
#include "launch/output_relay.h"
#include "launch/signal_guard.h"
#include "launch/worker_process.h"

namespace accelerant::detail {
namespace {

using Clock = std::chrono::steady_clock;

[[noreturn]] void bad_option(const std::string& what, const std::string& fix) {
  throw LaunchError(str("accelerant::launch: ", what, ". Fix: ", fix, "."));
}

// Descriptors the launcher holds per local worker: its stdout and stderr pipes (both ends for a
// moment around the fork), its two log files with log_dir, and up to three connections from its
// c10d client and Gloo's rendezvous to a launcher-hosted store (measured: 14 descriptors with one
// worker, 28 with four).
constexpr long kFdsPerWorker = 8;
// Left for what the launcher opens once (the store's and the node links' sockets, a restart's
// overlap of old and new log files) and for slack.
constexpr long kSpareFds = 32;

long open_fds() {
  std::error_code error;
  long count = 0;
  for (auto it = std::filesystem::directory_iterator("/proc/self/fd", error);
       !error && it != std::filesystem::directory_iterator(); it.increment(error)) {
    ++count;
  }
  return count;
}

// Processes the real user runs now (RLIMIT_NPROC counts them all, threads included).
long user_processes() {
  std::error_code error;
  long count = 0;
  struct stat st {};
  for (auto it = std::filesystem::directory_iterator("/proc", error);
       !error && it != std::filesystem::directory_iterator(); it.increment(error)) {
    const std::string name = it->path().filename().string();
    if (name.empty() || name[0] < '1' || name[0] > '9') continue;
    if (::stat(it->path().c_str(), &st) == 0 && st.st_uid == ::getuid()) ++count;
  }
  return count;
}

// processes_per_node against this process's limits, before anything is started: past them the
// launch failed half-way (pipes or fork refused after some workers had started).
void check_limits(const LaunchOptions& o) {
  const long workers = o.processes_per_node();
  rlimit files{};
  if (::getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur != RLIM_INFINITY) {
    const long needed = open_fds() + workers * kFdsPerWorker + kSpareFds;
    if (needed > static_cast<long>(files.rlim_cur)) {
      bad_option(
          str("processes_per_node ", workers, " needs about ", needed,
              " file descriptors in the launcher (", kFdsPerWorker,
              " per worker), above its limit RLIMIT_NOFILE of ", files.rlim_cur, " (hard limit ",
              files.rlim_max == RLIM_INFINITY ? std::string("unlimited")
                                              : std::to_string(files.rlim_max),
              ")"),
          str("raise the limit (`ulimit -n ", needed,
              "` in the shell that starts the launch) or start fewer processes per machine"));
    }
  }
  rlimit processes{};
  // The kernel does not hold root to RLIMIT_NPROC.
  if (::geteuid() != 0 && ::getrlimit(RLIMIT_NPROC, &processes) == 0 &&
      processes.rlim_cur != RLIM_INFINITY) {
    const long running = user_processes();
    if (running + workers > static_cast<long>(processes.rlim_cur)) {
      bad_option(
          str("processes_per_node ", workers, " workers and the ", running,
              " processes this user already runs exceed its limit RLIMIT_NPROC of ",
              processes.rlim_cur),
          str("raise the limit (`ulimit -u ", running + workers + 64,
              "` in the shell that starts the launch) or start fewer processes per machine"));
    }
  }
}

void validate(const LaunchOptions& o) {
  if (o.processes_per_node() < 1) {
    bad_option(str("processes_per_node is ", o.processes_per_node()), "ask for at least 1 process");
  }
  check_limits(o);
  if (o.num_nodes() < 1) bad_option(str("num_nodes is ", o.num_nodes()), "use 1 or more");
  if (o.min_nodes() && (*o.min_nodes() < 1 || *o.min_nodes() > o.num_nodes())) {
    bad_option(str("min_nodes is ", *o.min_nodes(), " with num_nodes ", o.num_nodes()),
               "use 1 to num_nodes (the fewest machines the job goes on with)");
  }
  if (o.rejoin_timeout().count() <= 0) {
    bad_option(str("rejoin_timeout is ", o.rejoin_timeout().count(), " ms"),
               "give a positive time");
  }
  if (o.threads_per_process() < 0 || o.threads_per_process() > kMaxThreadsPerProcess) {
    bad_option(
        str("threads_per_process is ", o.threads_per_process()),
        str("use 0 (cores / processes) to ", kMaxThreadsPerProcess, ", the most a worker accepts"));
  }
  if (o.node_rank() < 0 || o.node_rank() >= o.num_nodes()) {
    bad_option(str("node_rank ", o.node_rank(), " is outside 0..", o.num_nodes() - 1),
               "number the machines 0 to num_nodes - 1");
  }
  if (o.master_port() < 0 || o.master_port() > 65535) {
    bad_option(str("master_port ", o.master_port(), " is not a TCP port"),
               "use 1..65535, or 0 for a free port on one machine");
  }
  if (o.num_nodes() > 1 && o.master_port() == 0) {
    bad_option(
        "master_port 0 (a free port) cannot be used with several machines, which must all "
        "be told the same port",
        "pick a port, e.g. 29500, and pass it to every machine's launch");
  }
  if (o.max_restarts() < 0) bad_option(str("max_restarts is ", o.max_restarts()), "use 0 or more");
  if (o.gradient_accumulation_steps() && *o.gradient_accumulation_steps() < 1) {
    bad_option(str("gradient_accumulation_steps is ", *o.gradient_accumulation_steps()),
               "use 1 or more micro-batches per optimizer step");
  }
  if (o.monitor_interval().count() <= 0 ||
      (o.collective_timeout() && o.collective_timeout()->count() <= 0) ||
      o.join_timeout().count() <= 0) {
    bad_option("monitor_interval, timeout and join_timeout must be positive",
               "give durations above zero");
  }
}

// See docs/launching.md "Threads and fork".
int choose_threads(const LaunchOptions& o, const AgentHooks& hooks, bool verbose) {
  const int cores = usable_cpus();  // the affinity mask: a Slurm cpuset or taskset, not the machine
  int wanted = o.threads_per_process() > 0 ? o.threads_per_process()
                                           : std::max(1, cores / o.processes_per_node());
  const int others = hooks.fork_unsafe_threads ? hooks.fork_unsafe_threads() : 0;
  if (wanted > 1 && others > 0) {
    if (verbose) {
      std::fprintf(stderr,
                   "accelerant::launch: this process already runs %d other thread(s) (LibTorch's "
                   "or OpenBLAS's pools), which forked workers cannot use, so each worker runs "
                   "single-threaded instead of with %d threads. To give workers more threads, "
                   "call launch before any multi-threaded LibTorch op, or start the job with "
                   "`accelerant launch`.\n",
                   others, wanted);
    }
    wanted = 1;
  }
  return wanted;
}

// Without LibTorch: a CUDA build of it (the workers' LibTorch) and an NVIDIA device the driver
// lists. What the workers' torch::cuda::is_available() will say in all but broken setups.
bool gpu_present() {
#ifdef ACCELERANT_CUDA_LIBTORCH
  std::error_code ignored;
  return std::filesystem::exists("/dev/nvidia0", ignored) ||
         !std::filesystem::is_empty("/proc/driver/nvidia/gpus", ignored);
#else
  return false;
#endif
}

// A worker that exits, even with 0, while others of its group still run has most likely left
// them waiting in a collective it skipped (it returned early), where they would hang silently
// until the collective timeout (30 minutes by default). Ranks of a healthy job finish within
// milliseconds of each other, or the ones still running are busy (rank 0 saving a checkpoint or
// evaluating after the others left). So the agent waits this long after such an exit and ends the
// group only when the workers still running (with what they started) used less than
// kIdleCpuShare of one core and read or wrote less than kIdleIoBytes over it, and no process of
// theirs started or ended, looking again every kEarlyExitGrace while they work: a rank writing a
// checkpoint to a slow disk or uploading it uses little CPU but does I/O. A wait in Gloo or in the
// store sleeps; a busy-waiting one (a CUDA synchronisation spins) is left to the collective
// timeout.
constexpr std::chrono::seconds kEarlyExitGrace{3};
constexpr double kIdleCpuShare = 0.05;
constexpr long long kIdleIoBytes = 1 << 20;

// Why the local group stopped.
enum class Outcome {
  kSucceeded,
  kFailedHere,
  kFailedElsewhere,
  kAborted,
  kInterrupted,
  kMembershipChange,  // elastic: a machine arrived and the workers stopped at a checkpoint
};

class Agent {
 public:
  Agent(const LaunchOptions& o, const WorkerBody& body, const AgentHooks& hooks)
      : o_(o),
        body_(body),
        hooks_(hooks),
        relay_(o.prefix_output(), o.processes_per_node() * o.num_nodes(),
               static_cast<size_t>(std::max(0, o.stderr_tail_lines())), o.log_dir(), o.tee()) {}

  std::vector<std::vector<char>> run() {
    validate(o_);
    relay_.check_log_dir();  // before any worker starts, or their output would be lost
    if (hooks_.check_before_fork) hooks_.check_before_fork();
    debug_ = o_.debug().value_or(read_launch_contract().debug.value_or(false));
    threads_ = choose_threads(o_, hooks_, o_.verbose());
    timeout_ = resolved_timeout(o_);
    if (debug_ && hooks_.dry_fork) {
      hooks_.dry_fork(threads_, std::min(timeout_, std::chrono::milliseconds(60000)));
    }
    workdir_ = make_workdir();
    nodes_ = std::make_unique<NodeGroup>(o_);  // on several machines: waits for all of them
    port_ = nodes_->store_port();
    if (o_.verbose()) print_banner();
    SignalGuard signals;
    auto interrupted = [&signals] { return signals.caught() != 0; };
    // Machine 0: a lost machine's workers are replaced in place like a failed worker's.
    nodes_->on_lost_machine(
        [this](int attempt) { return claim_replacement(attempt, /*one_failure=*/true); });
    // A launcher started again for a lost machine whose workers are replaced in place joins the
    // running attempt, its workers as replacements.
    std::optional<int> rejoining = nodes_->rejoin_running_attempt();
    for (int attempt = rejoining ? *rejoining : nodes_->first_attempt();; ++attempt) {
      NodeEvent ready{NodeEvent::kGo, ""};
      if (!rejoining) {
        // A whole restart forms the next generation, after any replacement on another machine.
        // Machine 0's proposal is the one taken: a launcher that joined later knows none.
        const int proposed = attempt > 0 ? nodes_->latest_generation(generation_) + 1 : generation_;
        ready = nodes_->start_attempt(attempt, proposed, interrupted);
      }
      generation_ = nodes_->generation();
      if (ready.kind == NodeEvent::kDone) {  // this launcher came too late: nothing to run
        if (o_.verbose()) std::fprintf(stderr, "accelerant::launch: %s.\n", ready.text.c_str());
        nodes_->leave("");
        cleanup();
        return {};
      }
      Outcome outcome = ready.kind == NodeEvent::kGo            ? Outcome::kSucceeded
                        : ready.kind == NodeEvent::kInterrupted ? Outcome::kInterrupted
                                                                : Outcome::kAborted;
      if (outcome == Outcome::kAborted) node_news_ = ready.text;
      if (outcome == Outcome::kSucceeded) {
        if (rejoining && o_.verbose()) {
          std::fprintf(stderr,
                       "accelerant::launch: this machine's workers join the running group "
                       "(attempt %d, generation %d) in place of the lost ones.\n",
                       attempt + 1, generation_);
        }
        start_group(attempt, rejoining.has_value());
        rejoining.reset();
        outcome = monitor(attempt, signals);
      }
      if (outcome == Outcome::kSucceeded) {
        relay_.drain(1000);
        NodeEvent verdict = nodes_->finish(attempt, interrupted);  // every machine's group
        if (verdict.kind == NodeEvent::kDone) {
          nodes_->leave("");
          auto results = collect_results();
          cleanup();
          return results;
        }
        outcome = outcome_of(verdict);
      }
      if (outcome == Outcome::kFailedHere) {
        nodes_->report_failure(attempt, report(attempt));
      }
      stop_group(outcome == Outcome::kInterrupted && signals.caught() != 0 ? signals.caught()
                                                                           : SIGTERM);
      if (outcome == Outcome::kInterrupted) {
        nodes_->leave(
            str("its launcher was stopped by signal ", signals.caught(), " (",
                strsignal(signals.caught()),
                "), so the job cannot go on. Fix: restart the job on every machine (from the last "
                "checkpoint)."));
        cleanup();
        signals.reraise();
        throw LaunchError(str("accelerant::launch: stopped by signal ", signals.caught(),
                              "; every worker was stopped."));
      }
      if (outcome == Outcome::kAborted) {
        nodes_->leave(node_news_);
        cleanup();
        throw LaunchError("accelerant::launch: " + node_news_, first_failure_,
                          restarts_used(attempt));
      }
      if (outcome == Outcome::kMembershipChange) {
        if (o_.verbose()) std::fprintf(stderr, "accelerant::launch: %s\n", node_news_.c_str());
        continue;
      }
      const std::string why = outcome == Outcome::kFailedHere ? report(attempt) : node_news_;
      if (restarts_used(attempt) < o_.max_restarts()) {
        if (o_.verbose()) {
          // Said when in-place recovery was asked for and the workers declined it.
          const std::string fallback =
              in_place_refusal_.empty()
                  ? ""
                  : str("\nThe failed worker is not replaced in place: ", in_place_refusal_,
                        " The group restarts from the last checkpoint instead.");
          std::fprintf(
              stderr, "accelerant::launch: %s%s\nRestarting the group (restart %d of %d).\n",
              why.c_str(), fallback.c_str(), restarts_used(attempt) + 1, o_.max_restarts());
        }
        continue;
      }
      nodes_->leave(why);
      cleanup();
      throw LaunchError("accelerant::launch: " + why, first_failure_, restarts_used(attempt));
    }
  }

  ~Agent() {
    stop_group();
    cleanup();
  }

 private:
  Outcome outcome_of(const NodeEvent& event) {
    node_news_ = event.text;
    switch (event.kind) {
      case NodeEvent::kRestart:
        return Outcome::kFailedElsewhere;
      case NodeEvent::kRegroup:
        return Outcome::kMembershipChange;
      case NodeEvent::kInterrupted:
        return Outcome::kInterrupted;
      default:
        return Outcome::kAborted;
    }
  }

  // The report of this machine's first failure in `attempt`.
  std::string report(int attempt) const {
    if (first_failure_.rank >= 0 && !is_failure(first_failure_)) {
      return early_exit_report(first_failure_, early_exit_.waiting, kEarlyExitGrace, o_.node_rank(),
                               attempt, o_.max_restarts());
    }
    std::string text =
        failure_report(first_failure_, o_.node_rank(), attempt, o_.max_restarts(), flight_records_);
    if (early_exit_.exit.rank >= 0) {
      text += str("\nBefore that, worker rank ", early_exit_.exit.rank, " exited with ",
                  describe_exit(early_exit_.exit),
                  " while the others still ran: it most likely returned before them and skipped "
                  "a collective they waited in. Fix: make every rank run the same collectives "
                  "and return together.");
    }
    return text;
  }

  std::string make_workdir() {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "accelerant-launch-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) {
      throw LaunchError(str("accelerant::launch could not create a temporary directory from ",
                            pattern, ": ", std::strerror(errno),
                            ". Fix: set TMPDIR to a writable directory."));
    }
    return pattern;
  }

  void print_banner() {
    const bool gpu = hooks_.gpu_available ? hooks_.gpu_available() : gpu_present();
    const int world = o_.processes_per_node() * o_.num_nodes();
    std::string line = str("Launching training on ", o_.processes_per_node(), gpu ? " GPU" : " CPU",
                           o_.processes_per_node() == 1 ? "" : "s");
    if (o_.num_nodes() > 1) {
      line +=
          str(" (node ", o_.node_rank(), " of ", o_.num_nodes(), ", ", world, " processes in all)");
    }
    std::printf("%s.\n", line.c_str());
    std::fflush(stdout);
  }

  // `replacing`: the workers replace those of this machine, lost with its launcher, in a running
  // group (rejoin_running_attempt).
  void start_group(int attempt, bool replacing) {
    relay_.reset(attempt);
    workers_.clear();
    failures_seen_ = 0;
    first_failure_ = WorkerExit{};
    flight_records_.clear();
    in_place_refusal_.clear();
    if (nodes_->elastic() && o_.verbose() && o_.node_rank() == 0) say_membership(attempt);
    for (int local = 0; local < o_.processes_per_node(); ++local)
      workers_.push_back(start_worker(worker_spec(local, replacing), body_, hooks_, relay_));
  }

  // The restarts max_restarts counts by `attempt`: whole restarts after failures and workers
  // replaced in place, not the membership changes of elastic membership.
  int restarts_used(int attempt) {
    return attempt - nodes_->free_restarts() + nodes_->replacements();
  }

  // The attempt's workers on every machine.
  int world_size() const {
    return o_.processes_per_node() * static_cast<int>(nodes_->members().size());
  }

  // The micro-batches per optimizer step for the attempt's workers: under elastic membership with
  // fewer machines than num_nodes, scaled so that the global batch stays that of num_nodes
  // machines, where it divides (say_membership says what became of it).
  std::optional<int64_t> accumulation_steps() const {
    const int present = static_cast<int>(nodes_->members().size());
    // In-place recovery needs one micro-batch per step (say_membership says so).
    if (!nodes_->elastic() || present == o_.num_nodes() ||
        o_.recovery() == Recovery::kReplaceFailedWorker) {
      return o_.gradient_accumulation_steps();
    }
    const int64_t full = o_.gradient_accumulation_steps().value_or(1) * o_.num_nodes();
    if (full % present != 0) return o_.gradient_accumulation_steps();
    return full / present;
  }

  // Machine 0, under elastic membership, at each attempt: who takes part, and the global batch.
  void say_membership(int attempt) const {
    const int present = static_cast<int>(nodes_->members().size());
    const int64_t base = o_.gradient_accumulation_steps().value_or(1);
    const int64_t now = accumulation_steps().value_or(1);
    std::string batch;
    if (present < o_.num_nodes()) {
      const std::string why =
          o_.recovery() == Recovery::kReplaceFailedWorker
              ? std::string(
                    "in-place recovery (replace_failed_worker) trains one micro-batch "
                    "per step")
              : str("its ", base * o_.num_nodes(), " micro-batches per step do not divide among ",
                    present, " machines");
      batch = now != base ? str("; gradient_accumulation_steps ", base, " -> ", now,
                                " keeps the global batch of ", o_.num_nodes(), " machines")
                          : str("; the global batch is ", present, "/", o_.num_nodes(),
                                " of the full job's: ", why);
    }
    std::fprintf(stderr,
                 "accelerant::launch: attempt %d runs on machine(s) %s of %d (%d processes)%s.\n",
                 attempt + 1, join(nodes_->members(), ", ").c_str(), o_.num_nodes(), world_size(),
                 batch.c_str());
  }

  // What local worker `local` of this machine is started with, in the current generation.
  // `replacement`: it joins a running group in place of a failed worker.
  WorkerSpec worker_spec(int local, bool replacement) const {
    LaunchContract env;
    env.source = EnvSource::kAccelerant;
    // Under elastic membership the attempt's machines, numbered among themselves.
    env.rank = nodes_->member_index() * o_.processes_per_node() + local;
    env.world_size = world_size();
    env.local_rank = local;
    env.local_world_size = o_.processes_per_node();
    env.node_rank = nodes_->member_index();
    env.num_nodes = static_cast<int>(nodes_->members().size());
    env.master_addr = nodes_->workers_store_addr();
    env.job_secret = nodes_->job_secret();
    env.master_port = port_;
    env.agent_hosts_store = nodes_->hosts_workers_store();
    env.restart_count = generation_;
    env.recovers_in_place = o_.recovery() == Recovery::kReplaceFailedWorker;
    env.joins_running_group = replacement;
    env.machines_may_join = nodes_->machines_may_join();
    env.debug = debug_;
    env.collective_timeout = timeout_;
    env.join_timeout = o_.join_timeout();
    env.mixed_precision = o_.mixed_precision();
    env.threads_per_process = threads_;
    env.downcast_bf16 = o_.downcast_bf16();
    env.cpu = o_.cpu();
    env.gradient_accumulation_steps = accumulation_steps();
    WorkerSpec spec;
    spec.rank = env.rank;
    spec.world_size = env.world_size;
    spec.local_rank = local;
    spec.threads = threads_;
    spec.result_path = str(workdir_, "/result.", local);
    spec.error_path = str(workdir_, "/error.", local);
    env.error_file = spec.error_path;
    spec.environment = to_environment(env);
    // A worker's output is a pipe to this relay, so only the relay knows whether a terminal is
    // at its end; a ProgressBar reads this to redraw its line there instead of printing lines.
    spec.environment["ACCELERANT_CONSOLE_TERMINAL"] = relay_.console_terminal();
    std::remove(spec.result_path.c_str());
    std::remove(spec.error_path.c_str());
    std::remove((spec.error_path + kFlightRecordSuffix).c_str());
    return spec;
  }

  // Recovery::kReplaceFailedWorker: claims the next generation for a replacement in place, once
  // the group had formed its current generation (every worker joined it), no worker declined
  // (in_place_refusal_, read first so that a restart can say why it is not done in place),
  // restarts are left and no other machine claimed it first: otherwise the survivors could wait
  // for a generation that never forms (a replacement that died before joining, a second worker
  // failing while the group re-forms), so the whole group restarts instead. The store must be the
  // launchers': rank 0's would die with rank 0. Returns the claimed generation (counted as a
  // restart, and this launcher's generation from now on), or -1.
  int claim_replacement(int attempt, bool one_failure) {
    if (o_.recovery() != Recovery::kReplaceFailedWorker) return -1;
    try {
      generation_ = nodes_->latest_generation(generation_);  // another machine's replacements
      in_place_refusal_ = nodes_->in_place_refusal(generation_);
      if (!in_place_refusal_.empty() || restarts_used(attempt) >= o_.max_restarts() ||
          !one_failure || !nodes_->generation_formed(generation_, world_size()) ||
          !nodes_->claim_generation(generation_ + 1)) {
        return -1;
      }
    } catch (const std::exception&) {
      return -1;  // the store is gone: the whole-group path reports why
    }
    nodes_->count_replacement();
    return ++generation_;
  }

  // Whether the failure at hand (a worker that failed, not one that returned early; the only one
  // since the group formed) is replaced in place (claim_replacement).
  bool replaces_in_place(int attempt) {
    return is_failure(first_failure_) &&
           claim_replacement(attempt, /*one_failure=*/failures_seen_ == 1) >= 0;
  }

  // Starts a replacement for the failed worker in the generation replaces_in_place claimed; the
  // others keep running and form the group again with it (ProcessState::regroup).
  void replace_failed_worker(int attempt) {
    const int local = first_failure_.local_rank;
    if (o_.verbose()) {
      std::fprintf(stderr,
                   "accelerant::launch: worker rank %d (pid %d) failed with %s; starting a "
                   "replacement in its place (generation %d; restart %d of %d); the other workers "
                   "keep running.\n",
                   first_failure_.rank, static_cast<int>(first_failure_.pid),
                   describe_exit(first_failure_).c_str(), generation_, restarts_used(attempt),
                   o_.max_restarts());
    }
    workers_[static_cast<size_t>(local)] =
        start_worker(worker_spec(local, /*replacement=*/true), body_, hooks_, relay_);
    failures_seen_ = 0;
    first_failure_ = WorkerExit{};
    flight_records_.clear();
  }

  // Reaps exited workers; records the first failure and, while monitoring (`note_returns`; not
  // while stopping them, when a worker ends however its signal handler says), the first rank that
  // returned. True when every worker has exited.
  bool reap(bool note_returns = false) {
    bool all_done = true;
    for (auto& w : workers_) {
      if (!w.running) continue;
      int status = 0;
      if (::waitpid(w.pid, &status, WNOHANG) == w.pid) {
        w.running = false;
        w.wait_status = status;
        auto exit = worker_exit_from_status(w.spec.rank, w.spec.local_rank, w.pid, status);
        if (is_failure(exit)) ++failures_seen_;
        if (is_failure(exit) && first_failure_.rank < 0) first_failure_ = exit;
        // The first rank that returned: the report names it even when the rank it left waiting
        // failed in the same instant (both reaped here at once, under load).
        if (note_returns && !is_failure(exit) && early_exit_.exit.rank < 0) early_exit_.exit = exit;
      } else {
        all_done = false;
      }
    }
    return all_done;
  }

  Outcome monitor(int attempt, const SignalGuard& signals) {
    const int interval = static_cast<int>(o_.monitor_interval().count());
    early_exit_ = EarlyExit{};
    while (true) {
      if (relay_.pump(interval, signals.wake_fd()) || signals.caught() != 0)
        return Outcome::kInterrupted;
      const bool all_done = reap(/*note_returns=*/true);
      if (first_failure_.rank < 0 && !all_done && early_exit_found_idle()) {
        first_failure_ = early_exit_.exit;
      }
      // What the other machines said first: a lost machine also breaks our workers' connections
      // (then the loss is the real cause), and a machine 0 gone without a word would leave the
      // store's calls of replaces_in_place waiting.
      NodeEvent news = first_failure_.rank >= 0 ? nodes_->poll(attempt) : NodeEvent{};
      if (first_failure_.rank >= 0 && news.kind == NodeEvent::kNone && replaces_in_place(attempt)) {
        // Not drained: that would close the survivors' output too, which goes on.
        replace_failed_worker(attempt);
        continue;
      }
      if (first_failure_.rank >= 0) {
        relay_.drain(500);  // the failed worker's last words belong in the report
        first_failure_.stderr_tail = relay_.stderr_tail(first_failure_.rank);
        first_failure_.error_text = read_file(workers_[first_failure_.local_rank].spec.error_path);
        // Written by each worker whose collective failed, before it tells the others.
        flight_records_.clear();
        for (const auto& w : workers_) {
          flight_records_.push_back(read_file(w.spec.error_path + kFlightRecordSuffix));
        }
        // An elastic loss (kRestart under elastic membership) is the cause too; another machine's
        // failure report beside ours is not: each machine reports its own.
        if (news.kind == NodeEvent::kAbort ||
            (news.kind == NodeEvent::kRestart && nodes_->elastic())) {
          node_news_ =
              str(news.text, "\nOn this machine, as a consequence, worker rank ",
                  first_failure_.rank, " failed with ", describe_exit(first_failure_), ".");
          return news.kind == NodeEvent::kAbort ? Outcome::kAborted : Outcome::kFailedElsewhere;
        }
        return Outcome::kFailedHere;
      }
      if (all_done) return Outcome::kSucceeded;
      news = nodes_->poll(attempt);
      if (news.kind != NodeEvent::kNone) return outcome_of(news);
    }
  }

  // See kEarlyExitGrace. True once a worker exited successfully while others still run and those
  // have since been idle for a whole grace period (then early_exit_ says who left and who waits).
  bool early_exit_found_idle() {
    std::vector<pid_t> running;
    for (const auto& w : workers_)
      if (w.running) running.push_back(w.pid);
    if (early_exit_.exit.rank < 0) return false;  // reap() records the first rank that returned
    const auto now = Clock::now();
    if (early_exit_.window_start != Clock::time_point{} &&
        now - early_exit_.window_start < kEarlyExitGrace) {
      return false;
    }
    const auto usage = process_group_usage(running, /*with_io=*/true);
    const bool first_look = early_exit_.window_start == Clock::time_point{};
    long long busy_ticks = 0, io_bytes = 0;  // of the workers running at both looks
    bool members_changed = false;            // a process started or ended: a script at work
    std::map<pid_t, GroupUsage> latest;
    for (size_t i = 0; i < running.size(); ++i) {
      latest[running[i]] = usage[i];
      const auto before = early_exit_.usage.find(running[i]);
      if (before == early_exit_.usage.end()) continue;
      busy_ticks += std::max(0LL, usage[i].cpu_ticks - before->second.cpu_ticks);
      io_bytes += std::max(0LL, usage[i].io_bytes - before->second.io_bytes);
      members_changed = members_changed || usage[i].members != before->second.members;
    }
    const double busy_seconds =
        static_cast<double>(busy_ticks) / static_cast<double>(::sysconf(_SC_CLK_TCK));
    const double window = std::chrono::duration<double>(now - early_exit_.window_start).count();
    early_exit_.window_start = now;
    early_exit_.usage = std::move(latest);
    early_exit_.waiting.clear();
    for (const auto& w : workers_)
      if (w.running) early_exit_.waiting.push_back(w.spec.rank);
    return !first_look && !members_changed && busy_seconds < kIdleCpuShare * window &&
           io_bytes < kIdleIoBytes;
  }

  // `signal` (SIGTERM, or the one the launcher caught: a terminal's ^C reaches only the
  // launcher's process group, so the launcher forwards it), a grace period, then SIGKILL, each to
  // every worker's whole process group, so that what a worker started in the background goes too;
  // every worker reaped before returning. SIGCONT after the signal: a stopped worker (SIGSTOP, a
  // debugger's ^Z) would otherwise hold it until the SIGKILL, and its clean-up would never run.
  void stop_group(int signal = SIGTERM) {
    std::vector<pid_t> groups;
    for (auto& w : workers_) groups.push_back(w.pid);
    if (groups.empty()) return;
    auto gone = [&] {
      for (const auto& g : process_group_usage(groups))
        if (g.alive > 0) return false;
      return true;
    };
    if (reap() && gone()) {  // the usual end of a job that succeeded: nothing to stop
      workers_.clear();
      return;
    }
    for (pid_t group : groups) {
      signal_worker(group, signal);
      signal_worker(group, SIGCONT);
    }
    const auto deadline = Clock::now() + o_.stop_grace_period();
    while (!(reap() && gone()) && Clock::now() < deadline) relay_.pump(20);
    for (auto& w : workers_) {
      signal_worker(w.pid, SIGKILL);
      if (!w.running) continue;
      ::waitpid(w.pid, &w.wait_status, 0);
      w.running = false;
    }
    relay_.drain(500);
    workers_.clear();  // their group ids may be reused from now on
  }

  std::vector<std::vector<char>> collect_results() {
    std::vector<std::vector<char>> results;
    for (auto& w : workers_) {
      std::string bytes = read_file(w.spec.result_path);
      results.emplace_back(bytes.begin(), bytes.end());
    }
    return results;
  }

  void cleanup() {
    if (workdir_.empty()) return;
    std::error_code ignored;
    std::filesystem::remove_all(workdir_, ignored);
    workdir_.clear();
  }

  const LaunchOptions& o_;
  const WorkerBody& body_;
  const AgentHooks& hooks_;
  OutputRelay relay_;
  int threads_ = 1;
  bool debug_ = false;
  // The workers' generation (ProcessState::restart_count): one more at each whole restart and at
  // each worker replaced in place (NodeGroup::replacements counts those, as restarts).
  int generation_ = 0;
  int failures_seen_ = 0;  // failed workers reaped since the group (re)formed
  // Why the workers declined in-place recovery in this attempt ("" when none did), for the
  // restart's message.
  std::string in_place_refusal_;
  std::chrono::milliseconds timeout_{0};
  std::string workdir_;
  std::unique_ptr<NodeGroup> nodes_;
  int port_ = 0;
  std::vector<WorkerProcess> workers_;
  WorkerExit first_failure_;
  std::vector<std::string> flight_records_;  // this machine's workers', at the first failure
  struct EarlyExit {
    WorkerExit exit;                    // the first worker that exited successfully (rank -1: none)
    Clock::time_point window_start;     // when the running workers' CPU time was last read
    std::map<pid_t, GroupUsage> usage;  // what they had used by then, by worker
    std::vector<int> waiting;           // the ranks still running then
  } early_exit_;
  std::string node_news_;  // what the other machines said, when that ended the attempt
};

}  // namespace

std::chrono::milliseconds resolved_timeout(const LaunchOptions& options) {
  if (options.collective_timeout()) return *options.collective_timeout();
  return read_launch_contract().collective_timeout.value_or(kDefaultCollectiveTimeout);
}

std::vector<std::vector<char>> run_agent(const LaunchOptions& options, const WorkerBody& body,
                                         const AgentHooks& hooks) {
  Agent agent(options, body, hooks);
  return agent.run();
}

}  // namespace accelerant::detail
