// The accelerant command line: a small dispatcher; each sub-command lives in its own file. This
// front end does not link LibTorch (it starts in milliseconds): `env` and `test`, which need
// LibTorch, run in the helper (libtorch_commands.cpp).
#include <accelerant/config.h>
#include <accelerant/error.h>
#include <accelerant/launch_contract.h>
#include <accelerant/version.h>

#include <CLI/CLI.hpp>
#include <cstdlib>
#include <iostream>

#include "commands.h"

int main(int argc, char** argv) {
  CLI::App app{
      "accelerant: run one LibTorch training loop on one CPU, many processes, GPUs and "
      "machines.\n\n"
      "Examples:\n"
      "  accelerant config            answer a few questions, write the config file\n"
      "  accelerant config default    write a basic config without questions\n"
      "  accelerant launch -n 2 ./train --epochs 3\n"
      "                               run ./train as 2 workers (torchrun's variables set)\n"
      "  accelerant env               versions, hardware and config, for bug reports\n"
      "  accelerant test              self-test: collectives and training across processes\n"
      "  accelerant checkpoint verify runs/exp1/checkpoints/checkpoint_3\n"
      "                               check a checkpoint's files against its manifest\n"
      "  accelerant checkpoint merge --optimizer runs/exp1/checkpoints/checkpoint_3 merged\n"
      "                               one model.safetensors and whole optimizer state (ZeRO)\n"
      "  accelerant report runs/exp1/fashion_mnist\n"
      "                               one HTML page: curves, step time per rank, restarts\n"
      "  accelerant trace merge runs/exp1/traces\n"
      "                               merge the ranks' profiler traces into trace.json\n"
      "  accelerant estimate-memory --params 1.3B --precision bf16\n"
      "                               memory per GPU by ZeRO stage and number of GPUs\n"
      "  accelerant --version         print Accelerant's and LibTorch's versions",
      "accelerant"};
  bool show_version = false;
  app.add_flag("-V,--version", show_version, "Print the versions and exit");
  accelerant::cli::Action action;
  accelerant::cli::add_config_command(app, action);
  accelerant::cli::add_launch_command(app, action);
  accelerant::cli::add_libtorch_commands(app, action, argc, argv);
  accelerant::cli::add_checkpoint_command(app, action);
  accelerant::cli::add_libtorch_checkpoint_commands(*app.get_subcommand("checkpoint"), action, argc,
                                                    argv);
  accelerant::cli::add_report_command(app, action);
  accelerant::cli::add_trace_command(app, action);
  accelerant::cli::add_estimate_memory_command(app, action);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (show_version) {
    std::cout << "accelerant " << accelerant::kVersion << " (LibTorch "
              << accelerant::torch_version() << ")\n";
    return 0;
  }
  if (!action) {
    std::cout << app.help();
    return 0;
  }
  try {
    return action();
  } catch (const accelerant::Error& e) {  // LaunchError included: the failure report
    std::cerr << "accelerant: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {  // std::bad_alloc, ...: said, not aborted on
    std::cerr << "accelerant: " << e.what() << "\n";
    return 1;
  }
}
