// accelerant launch: starts a program as N workers with fork+exec (never through a shell), each
// with the torchrun variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT, ...) and
// ACCELERANT_* set, watches them, restarts the group up to max_restarts and reports the first
// failure. Settings come from the config file; flags override it.
#include <accelerant/config.h>
#include <accelerant/environment.h>
#include <accelerant/error.h>
#include <accelerant/launch_options.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iostream>

#include "commands.h"

namespace accelerant::cli {
Config resolve_launch_config(const LaunchFlags& f) {
  const std::string path = config_path_or_default(f.config_file);
  Config c;
  // The default file is optional, but one that is there and cannot be read is an error (a
  // path through a file, a directory, no permission): load_config says why.
  struct stat st {};
  if (!f.config_file.empty() || ::stat(path.c_str(), &st) == 0 || errno != ENOENT) {
    c = load_config(path);
  }
  if (f.world_size) c.world_size = *f.world_size;
  if (f.num_nodes) {
    const MachineCount count = parse_machine_count(*f.num_nodes, "--num_nodes");
    c.num_nodes = count.most;
    c.min_nodes = count.fewest == count.most ? 0 : count.fewest;
  }
  if (f.node_rank) c.node_rank = *f.node_rank;
  if (f.master_addr) c.master_addr = *f.master_addr;
  if (f.master_port) c.master_port = *f.master_port;
  if (f.processes_per_node) {
    // torchrun's way to say the size: per machine. The total is then what the config stores.
    const int total = *f.processes_per_node * c.num_nodes;
    if (f.world_size && *f.world_size != total) {
      throw Error("accelerant launch: --world_size " + std::to_string(*f.world_size) +
                  " and --processes_per_node " + std::to_string(*f.processes_per_node) + " on " +
                  std::to_string(c.num_nodes) + " machine(s) (" + std::to_string(total) +
                  " in total) disagree. Fix: give one of them.");
    }
    c.world_size = total;
  }
  if (f.max_restarts) c.max_restarts = *f.max_restarts;
  if (f.recovery) c.recovery = parse_recovery(*f.recovery, "--recovery");
  if (f.threads_per_process) c.threads_per_process = *f.threads_per_process;
  if (f.mixed_precision)
    c.mixed_precision = parse_mixed_precision(*f.mixed_precision, "--mixed_precision");
  // The flags are seconds, as the file's keys: the one converter checks their range.
  if (f.monitor_interval)
    c.monitor_interval = seconds_to_duration(*f.monitor_interval, "monitor_interval");
  if (f.join_timeout) c.join_timeout = seconds_to_duration(*f.join_timeout, "join_timeout");
  if (f.rejoin_timeout) c.rejoin_timeout = seconds_to_duration(*f.rejoin_timeout, "rejoin_timeout");
  if (f.collective_timeout) {
    c.collective_timeout = seconds_to_duration(*f.collective_timeout, "collective_timeout");
  }
  if (f.gradient_accumulation_steps) c.gradient_accumulation_steps = *f.gradient_accumulation_steps;
  if (f.cpu) c.cpu = true;
  if (f.debug) c.debug = true;
  validate_config(c, "accelerant launch (config file " + path + " and flags)");
  return c;
}

int run_launch(const LaunchFlags& flags, const std::vector<std::string>& command) {
  const Config c = resolve_launch_config(flags);
  auto options = LaunchOptions()
                     .processes_per_node(c.world_size / c.num_nodes)
                     .num_nodes(c.num_nodes)
                     .min_nodes(c.min_nodes > 0 ? std::optional<int>(c.min_nodes) : std::nullopt)
                     .rejoin_timeout(c.rejoin_timeout)
                     .node_rank(c.node_rank)
                     .master_addr(c.master_addr)
                     .master_port(c.master_port)
                     .max_restarts(c.max_restarts)
                     .recovery(c.recovery)
                     .monitor_interval(c.monitor_interval)
                     .join_timeout(c.join_timeout)
                     .mixed_precision(c.mixed_precision)
                     .downcast_bf16(c.downcast_bf16)
                     .cpu(c.cpu)
                     .gradient_accumulation_steps(c.gradient_accumulation_steps)
                     .threads_per_process(c.threads_per_process)
                     .debug(c.debug)
                     .prefix_output(flags.prefix_output)
                     .log_dir(flags.log_dir)
                     .tee(flags.tee);
  // The flag beats the user's ACCELERANT_TIMEOUT_MS, which beats the config file's key: with
  // neither flag nor variable the key is passed; with the variable alone the option stays unset
  // and the agent reads the variable (LaunchOptions::collective_timeout), the one place that parses
  // it.
  if (flags.collective_timeout || !environment_value("ACCELERANT_TIMEOUT_MS")) {
    options.collective_timeout(c.collective_timeout);
  }
  launch_program(command, options);
  return 0;
}

void add_launch_command(CLI::App& app, Action& action) {
  auto* launch = app.add_subcommand(
      "launch",
      "Run a program as several worker processes (fork+exec, no shell), with the torchrun "
      "variables\n"
      "and ACCELERANT_* set for each. Reads the config file; flags override it.\n\n"
      "Examples:\n"
      "  accelerant launch -n 2 ./fashion_mnist --epochs 1\n"
      "  accelerant launch -n 4 --max_restarts 2 --mixed_precision bf16 ./train\n"
      "  accelerant launch --num_nodes 2 --node_rank 0 --master_addr 10.0.0.1 \\\n"
      "                    --master_port 29500 -n 8 ./train        (on each machine, its rank)\n"
      "  accelerant launch --num_nodes 1:2 --node_rank 0 --master_addr 10.0.0.1 \\\n"
      "                    --master_port 29500 -n 8 ./train        (elastic: goes on with one)\n\n"
      "Accelerate's and torchrun's flag names are accepted too (--num_processes, "
      "--nproc_per_node,\n"
      "--num_machines, --nnodes, --machine_rank, --main_process_ip, ...): docs/names.md.");
  auto flags = std::make_shared<LaunchFlags>();
  launch->add_option("--config_file", flags->config_file,
                     "Config file (default: accelerant config's location)");
  launch->add_option(flag_names("world_size", "-n"), flags->world_size,
                     "Processes in total, across machines");
  launch->add_option(flag_names("processes_per_node"), flags->processes_per_node,
                     "Processes on each machine (instead of --world_size: the total is this times "
                     "--num_nodes)");
  launch
      ->add_option(flag_names("num_nodes"), flags->num_nodes,
                   "Machines taking part: N, or MIN:MAX to go on with at least MIN when "
                   "machines are lost (elastic; each resumes from the last checkpoint)")
      ->type_name("N|MIN:MAX");
  launch->add_option(flag_names("node_rank"), flags->node_rank, "This machine's rank (0 = main)");
  launch->add_option(flag_names("master_addr"), flags->master_addr, "The main machine's address");
  launch->add_option(flag_names("master_port"), flags->master_port,
                     "Its port (default 0 = a free port, one machine only)");
  launch->add_option("--max_restarts", flags->max_restarts,
                     "Restarts of a failed group (or replacements of failed workers)");
  launch->add_option("--recovery", flags->recovery,
                     "What a failure within --max_restarts leads to: restart_group (default: every "
                     "worker restarts and resumes from the last checkpoint) or "
                     "replace_failed_worker (only the failed worker is replaced; the others keep "
                     "their state and redo at most the step that failed; under ZeRO the group "
                     "restarts from the last checkpoint; "
                     "docs/launching.md)");
  launch->add_option("--monitor_interval", flags->monitor_interval,
                     "Seconds between checks of the workers");
  launch->add_option("--join_timeout", flags->join_timeout,
                     "Seconds the machines' launchers, and the workers at start-up, wait for each "
                     "other (default 600)");
  launch->add_option("--rejoin_timeout", flags->rejoin_timeout,
                     "With --num_nodes MIN:MAX: seconds to wait for a lost or missing machine "
                     "before going on without it; with --recovery replace_failed_worker: for a "
                     "lost machine's launcher to come back and replace its workers (default 60)");
  launch->add_option("--collective_timeout", flags->collective_timeout,
                     "Seconds a collective every rank entered may take before failing (default: "
                     "$ACCELERANT_TIMEOUT_MS / 1000, else the config's, else 1800); ranks in "
                     "different collectives are named in seconds whatever it is");
  launch->add_option("--mixed_precision", flags->mixed_precision, "no, fp16 or bf16")
      ->transform(mixed_precision_flag());
  launch->add_option("--threads_per_process", flags->threads_per_process,
                     "0 = cores / local processes");
  launch->add_option("--gradient_accumulation_steps", flags->gradient_accumulation_steps,
                     "Micro-batches per optimizer step in the workers' Accelerator");
  launch->add_flag(flag_names("cpu"), flags->cpu, "Train on the CPU even when CUDA is available");
  launch->add_flag(flag_names("debug"), flags->debug, "Check collectives across ranks");
  launch->add_flag("--prefix_output", flags->prefix_output,
                   "Prefix every output line with its rank");
  launch->add_option(
      "--log_dir", flags->log_dir,
      "Write each rank's output to DIR/attempt_<n>/rank_<r>.stdout|stderr (not the console)");
  launch->add_flag("--tee", flags->tee, "With --log_dir: show the output on the console too");
  launch->prefix_command();  // the first positional is the program; everything after it is its own
  launch->callback([&action, flags, launch] {
    std::vector<std::string> command = launch->remaining();
    action = [flags, command] { return run_launch(*flags, command); };
  });
}

}  // namespace accelerant::cli
