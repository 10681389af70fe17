// The accelerant command line: a small dispatcher; each sub-command lives in its own file.
#include <accelerant/accelerant.h>

#include <CLI/CLI.hpp>
#include <iostream>

int main(int argc, char** argv) {
  CLI::App app{
      "accelerant: run one LibTorch training loop on one CPU, many processes, GPUs and machines.\n\n"
      "Examples:\n"
      "  accelerant --version        print Accelerant's and LibTorch's versions\n"
      "  accelerant --help           this text\n\n"
      "Sub-commands (config, launch, env, test) are being added; until then start workers from\n"
      "your program with accelerant::launch (see README.md).",
      "accelerant"};
  bool show_version = false;
  app.add_flag("-V,--version", show_version, "Print the versions and exit");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (show_version) {
    std::cout << "accelerant " << accelerant::kVersion << " (LibTorch " << accelerant::torch_version()
              << ")\n";
    return 0;
  }
  std::cout << app.help();
  return 0;
}
