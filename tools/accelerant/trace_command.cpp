// accelerant trace merge DIR: joins the trace_rank<r>.json files of Accelerator::profile into
// DIR/trace.json, for runs whose ranks wrote their files on different machines (the main process
// merges only the files it can see). LibTorch-free: the files are JSON.
#include <accelerant/trace_files.h>

#include <iostream>
#include <memory>

#include "commands.h"

namespace accelerant::cli {
namespace {

int merge(const std::string& dir, int num_ranks) {
  const TraceMergeResult result = merge_trace_files(dir, num_ranks);
  std::cout << "wrote " << result.merged_file << " (" << result.merged_ranks.size() << " rank"
            << (result.merged_ranks.size() == 1 ? "" : "s") << ")\n";
  // Named one by one up to a screenful; a count after that.
  constexpr size_t kNamed = 10;
  for (size_t i = 0; i < result.missing_files.size() && i < kNamed; ++i) {
    std::cerr << "accelerant trace merge: warning: " << result.missing_files[i]
              << " not found; its rank is left out. Fix: copy it from the machine that ran that "
              << "rank.\n";
  }
  if (result.missing_files.size() > kNamed) {
    std::cerr << "accelerant trace merge: warning: and " << result.missing_files.size() - kNamed
              << " more ranks' files not found.\n";
  }
  return result.missing_files.empty() ? 0 : 1;
}

}  // namespace

void add_trace_command(CLI::App& app, Action& action) {
  auto* trace = app.add_subcommand("trace", "Work with profiler traces (Accelerator::profile)");
  trace->require_subcommand(1);
  auto dir = std::make_shared<std::string>();
  auto num_ranks = std::make_shared<int>(0);
  auto* merge_cmd = trace->add_subcommand(
      "merge", "Merge DIR/trace_rank<r>.json into DIR/trace.json, one process lane per rank");
  merge_cmd->add_option("DIR", *dir, "The folder the ranks wrote their traces to")->required();
  merge_cmd->add_option(flag_names("world_size", "-n"), *num_ranks,
                        "Expect ranks 0..N-1 and exit 1 naming the missing files "
                        "(default: merge the files found)");
  merge_cmd->footer(
      "Examples:\n"
      "  accelerant trace merge runs/exp1/traces\n"
      "  accelerant trace merge -n 8 runs/exp1/traces   fail if a rank's file is missing\n"
      "Open trace.json in ui.perfetto.dev or chrome://tracing.");
  merge_cmd->callback(
      [&action, dir, num_ranks] { action = [dir, num_ranks] { return merge(*dir, *num_ranks); }; });
}

}  // namespace accelerant::cli
