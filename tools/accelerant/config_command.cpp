// accelerant config: ask the questions and write the config file; `default` writes one without
// questions; `show` prints it; `validate` checks it.
#include <accelerant/config.h>
#include <accelerant/environment.h>
#include <accelerant/error.h>

#include <fstream>
#include <iostream>
#include <optional>

#include "commands.h"

namespace accelerant::cli {
namespace {

// Asks one question on stdout and reads the answer from stdin; an empty answer takes the default
// (shown in brackets). `parse` throws accelerant::Error for an answer it cannot use: the question
// is asked again. End of input is an error (a piped script ran out of answers).
template <class T, class Parse>
T ask(const std::string& question, const T& fallback, Parse parse) {
  for (;;) {
    std::cout << question << " [" << fallback << "]: " << std::flush;
    std::string line;
    if (!std::getline(std::cin, line)) {
      throw Error(
          "accelerant config: the input ended before every question was answered. Fix: answer each "
          "question on its own line (an empty line takes the default in brackets).");
    }
    if (line.empty()) return fallback;
    try {
      return parse(line);
    } catch (const Error& e) {
      std::cout << "  " << e.what() << "\n";
    }
  }
}

int parse_int(const std::string& text, int low, int high) {
  try {
    size_t used = 0;
    const int value = std::stoi(text, &used);
    if (used == text.size() && value >= low && value <= high) return value;
  } catch (const std::exception&) {
  }
  throw Error("'" + text + "' is not a whole number from " + std::to_string(low) + " to " +
              std::to_string(high) + ".");
}

bool parse_yes_no(const std::string& text) { return parse_bool(text, "the answer"); }

Config ask_questions() {
  Config c;
  c.num_nodes = ask("How many machines will take part?", c.num_nodes,
                    [](const std::string& t) { return parse_int(t, 1, 100000); });
  if (c.num_nodes > 1) {
    c.node_rank = ask("Which machine is this one (its rank, 0 = the main machine)?", c.node_rank,
                      [&](const std::string& t) { return parse_int(t, 0, c.num_nodes - 1); });
    c.master_addr = ask("What is the main machine's address?", c.master_addr,
                        [](const std::string& t) { return t; });
  }
  // One machine: a free port (a fixed one collides with other jobs). Several: they must agree.
  c.master_port =
      ask("Which port does the main machine listen on (0 = any free port, one machine only)?",
          c.num_nodes > 1 ? 29500 : 0, [](const std::string& t) { return parse_int(t, 0, 65535); });
  c.world_size = ask("How many processes in total, across all machines?", c.num_nodes,
                     [](const std::string& t) { return parse_int(t, 1, 1000000); });
  c.mixed_precision = parse_mixed_precision(
      ask(std::string("Mixed precision (no, fp16 on CUDA, bf16)?"),
          std::string(to_string(c.mixed_precision)),
          [](const std::string& t) {
            return std::string(to_string(parse_mixed_precision(t, "the answer")));
          }),
      "the answer");
  if (c.mixed_precision == MixedPrecision::kBf16) {
    c.downcast_bf16 = ask(std::string("Store the weights in bf16 too (downcast_bf16)? yes/no"),
                          std::string("no"), [](const std::string& t) {
                            return parse_yes_no(t) ? std::string("yes") : std::string("no");
                          }) == "yes";
  }
  c.debug = ask(std::string("Debug mode: check collectives across ranks before each call? yes/no"),
                std::string("no"), [](const std::string& t) {
                  return parse_yes_no(t) ? std::string("yes") : std::string("no");
                }) == "yes";
  c.max_restarts = ask("How many times may a failed group be restarted?", c.max_restarts,
                       [](const std::string& t) { return parse_int(t, 0, 1000000); });
  c.threads_per_process =
      ask("Threads per process (0 = cores / processes on the machine)?", c.threads_per_process,
          [](const std::string& t) { return parse_int(t, 0, 4096); });
  return c;
}

}  // namespace

std::string config_path_or_default(const std::string& config_file) {
  if (!config_file.empty()) return config_file;
  return default_config_path(process_environment());
}

CLI::Validator mixed_precision_flag() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        try {
          text = to_string(parse_mixed_precision(text, "--mixed_precision"));
          return "";
        } catch (const Error& e) {
          return e.what();
        }
      },
      "no|fp16|bf16");
}

void add_config_command(CLI::App& app, Action& action) {
  auto* config = app.add_subcommand(
      "config",
      "Write the config file that `accelerant launch` and the Accelerator read, by asking "
      "questions.\n\n"
      "Examples:\n"
      "  accelerant config                          answer the questions (Enter takes the "
      "default)\n"
      "  accelerant config default --mixed_precision bf16\n"
      "  accelerant config show                     print the config file in use\n"
      "  accelerant config validate --config_file my.yaml\n\n"
      "Default location: $ACCELERANT_CONFIG_FILE, else "
      "$XDG_CACHE_HOME/accelerant/default_config.yaml,\n"
      "else ~/.cache/accelerant/default_config.yaml.");
  auto file = std::make_shared<std::string>();
  config->add_option("--config_file", *file, "The config file to write (default: see above)");
  config->callback([&action, file, config] {
    if (!config->get_subcommands().empty()) return;  // default, show or validate chose already
    action = [file] {
      const std::string path = config_path_or_default(*file);
      Config c = ask_questions();
      save_config(c, path);
      std::cout << "accelerant config: wrote " << path << "\n";
      return 0;
    };
  });

  auto* defaults = config->add_subcommand(
      "default",
      "Write a basic config without questions (one machine, one process).\n\n"
      "Examples:\n  accelerant config default\n  accelerant config default --mixed_precision bf16");
  auto precision = std::make_shared<std::string>("no");
  defaults->add_option("--mixed_precision", *precision, "no, fp16 or bf16")
      ->transform(mixed_precision_flag())
      ->capture_default_str();
  defaults->add_option("--config_file", *file, "The config file to write");
  defaults->callback([&action, file, precision] {
    action = [file, precision] {
      std::cout << "accelerant config default: wrote "
                << write_basic_config(parse_mixed_precision(*precision, "--mixed_precision"),
                                      config_path_or_default(*file))
                << "\n";
      return 0;
    };
  });

  auto* show = config->add_subcommand("show",
                                      "Print the config file in use, with every key.\n\n"
                                      "Examples:\n  accelerant config show");
  show->add_option("--config_file", *file, "The config file to show");
  show->callback([&action, file] {
    action = [file] {
      const std::string path = config_path_or_default(*file);
      std::cout << "# " << path << "\n" << to_yaml(load_config(path));
      return 0;
    };
  });

  auto* validate =
      config->add_subcommand("validate",
                             "Check a config file; exit status 0 when it is valid.\n\n"
                             "Examples:\n  accelerant config validate --config_file my.yaml");
  validate->add_option("--config_file", *file, "The config file to check");
  validate->callback([&action, file] {
    action = [file] {
      const std::string path = config_path_or_default(*file);
      load_config(path);
      std::cout << path << ": valid\n";
      return 0;
    };
  });
}

}  // namespace accelerant::cli
