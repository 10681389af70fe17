// accelerant report RUN_DIR: one HTML page showing a training run from the files it left (the
// trackers' scalars and config, the launcher's logs, the checkpoints), without LibTorch and
// without the program that trained.
#include <accelerant/error.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>

#include "commands.h"
#include "report_html.h"
#include "report_run.h"

namespace accelerant::cli {
namespace {

// Written beside the target and renamed over it, so that a browser reloading the page never
// reads half of it.
void write_page(const std::string& path, const std::string& html) {
  const std::string temporary = path + ".tmp";
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    out << html;
    out.close();
    if (!out) {
      const std::string reason = std::strerror(errno);
      std::remove(temporary.c_str());
      throw Error("accelerant report: cannot write " + temporary + ": " + reason +
                  ". Fix: choose a writable place with -o FILE.");
    }
  }
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    const std::string reason = std::strerror(errno);
    std::remove(temporary.c_str());
    throw Error("accelerant report: cannot write " + path + ": " + reason +
                ". Fix: choose a writable place with -o FILE.");
  }
}

int run_report(const ReportInputs& inputs, std::string output) {
  const RunReport report = read_run(inputs);
  if (output.empty()) output = inputs.run_dir + "/report.html";
  write_page(output, report_html(report));
  size_t failures = report.attempts.empty() ? 0 : report.attempts.size() - 1;
  std::cout << "accelerant report: wrote " << output << " (" << report.scalars.size()
            << " scalar tag(s), " << report.step_times.size() << " rank(s) of step times, "
            << report.attempts.size() << " attempt(s), " << failures << " restart(s), "
            << report.checkpoints.size() << " checkpoint(s))\n";
  for (const auto& warning : report.warnings) std::cerr << "accelerant report: " << warning << "\n";
  return 0;
}

}  // namespace

void add_report_command(CLI::App& app, Action& action) {
  auto* report =
      app.add_subcommand("report",
                         "Write one HTML page showing a run: curves, step time per rank, restarts, "
                         "checkpoints, config");
  auto inputs = std::make_shared<ReportInputs>();
  auto output = std::make_shared<std::string>();
  report
      ->add_option("RUN_DIR", inputs->run_dir,
                   "The folder the trackers wrote (<project_dir>/<project_name>); it must hold "
                   "scalars.jsonl or scalars.csv (log_with jsonl or csv)")
      ->required();
  report->add_option("-o,--output", *output,
                     "The HTML file to write. Default: RUN_DIR/report.html");
  report->add_option("--log_dir", inputs->log_dir,
                     "The folder given to `accelerant launch --log_dir` (attempt_<n>/rank_<r>."
                     "stderr), for restarts and failures. Default: RUN_DIR/logs when present");
  report->add_option("--checkpoints", inputs->checkpoints_dir,
                     "The folder of checkpoint_<n> folders, or the project_dir. Default: the "
                     "first of RUN_DIR, RUN_DIR/checkpoints, RUN_DIR/../checkpoints that has any");
  report->footer(
      "The page is one file with inline SVG charts (no script, nothing fetched): a chart per "
      "scalar tag,\nsamples/s, the step-time breakdown per rank with the straggler, the "
      "launcher's attempts and the\nlast lines of failed ranks' stderr, the checkpoints with "
      "their steps, and the config.\n\n"
      "Examples:\n"
      "  fashion_mnist --project_dir runs/a --log_with jsonl --epochs 2\n"
      "  accelerant report runs/a/fashion_mnist\n"
      "                          writes runs/a/fashion_mnist/report.html; checkpoints from "
      "runs/a/checkpoints\n"
      "  accelerant launch -n 2 --max_restarts 2 --log_dir runs/a/logs fashion_mnist "
      "--project_dir runs/a --log_with csv\n"
      "  accelerant report runs/a/fashion_mnist --log_dir runs/a/logs -o /tmp/a.html\n"
      "                          with the restarts and the failed ranks' stderr");
  report->callback([&action, inputs, output] {
    action = [inputs, output] { return run_report(*inputs, *output); };
  });
}

}  // namespace accelerant::cli
