// accelerant-libtorch: the helper that runs the sub-commands needing LibTorch (`env`, `test`,
// `checkpoint merge`, and `checkpoint verify`'s look into the files).
// Users do not call it: the `accelerant` front end, which does not load LibTorch, execs it with
// its own command line (libtorch_commands.cpp), so its help and errors read as the front end's.
#include <accelerant/error.h>

#include <CLI/CLI.hpp>
#include <iostream>

#include "commands.h"

int main(int argc, char** argv) {
  CLI::App app{"accelerant: the sub-commands that need LibTorch (started by `accelerant`).",
               "accelerant"};
  accelerant::cli::Action action;
  accelerant::cli::add_env_command(app, action);
  accelerant::cli::add_test_command(app, action);
  accelerant::cli::add_checkpoint_merge_command(app, action);
  accelerant::cli::add_checkpoint_contents_command(*app.get_subcommand("checkpoint"), action);
  app.require_subcommand(1);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    return action();
  } catch (const accelerant::Error& e) {  // LaunchError included: the failure report
    std::cerr << "accelerant: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {  // LibTorch's c10::Error, std::bad_alloc, ...
    std::cerr << "accelerant: " << e.what() << "\n";
    return 1;
  }
}
