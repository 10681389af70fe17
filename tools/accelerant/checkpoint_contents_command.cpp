// The helper's `checkpoint verify-contents DIR...`: what the checkpoints' files mean
// (verify_checkpoint_contents). The front end's `checkpoint verify` checks the bytes itself, then
// starts this for the checkpoints whose bytes verify: reading LibTorch archives needs LibTorch,
// which the front end does not load.
#include <accelerant/checkpoint_contents.h>
#include <accelerant/error.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <iostream>
#include <memory>

#include "commands.h"

namespace accelerant::cli {

void add_checkpoint_contents_command(CLI::App& checkpoint, Action& action) {
  auto dirs = std::make_shared<std::vector<std::string>>();
  auto* contents = checkpoint.add_subcommand(
      "verify-contents",
      "Check what each file of the checkpoints holds (started by `accelerant checkpoint verify`).");
  contents->group("");  // not listed: the front end's verify is the command people run
  contents->add_option("DIR", *dirs, "Checkpoint directories (each holds manifest.json)")
      ->required();
  contents->callback([&action, dirs] {
    action = [dirs] {
      int bad = 0;
      for (const auto& dir : *dirs) {
        try {
          const auto m = verify_checkpoint_contents(dir);
          std::cout << "OK  " << dir << " (step " << m.step << ", " << m.files.size()
                    << " files: every size and CRC-32 matches the manifest, and every file holds "
                       "what its name says)\n";
        } catch (const CheckpointError& e) {
          ++bad;
          std::cout << "BAD " << dir << ": " << e.what() << "\n";
        }
      }
      return std::min(bad, 100);
    };
  });
}

}  // namespace accelerant::cli
