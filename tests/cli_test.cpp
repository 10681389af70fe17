// The accelerant command line, run as a real program.
#include <accelerant/accelerant.h>
#include <accelerant/checkpoint.h>
#include <accelerant/config.h>
#include <accelerant/environment.h>
#include <accelerant/version.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include "test_support.h"

using namespace accelerant::testing;

namespace {

int run_cli(const std::vector<std::string>& args, std::string& output) {
  std::vector<std::string> argv{cli_path()};
  argv.insert(argv.end(), args.begin(), args.end());
  auto run = start_program(argv);
  const int status = finish_program(run, output, std::chrono::seconds(30));
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace

TEST(Cli, VersionNamesAccelerantAndLibTorch) {
  std::string out;
  EXPECT_EQ(run_cli({"--version"}, out), 0);
  EXPECT_NE(out.find(std::string("accelerant ") + accelerant::kVersion), std::string::npos) << out;
  EXPECT_NE(out.find("LibTorch "), std::string::npos) << out;
}

TEST(Cli, HelpShowsExamples) {
  std::string out;
  EXPECT_EQ(run_cli({"--help"}, out), 0);
  EXPECT_NE(out.find("Examples:"), std::string::npos) << out;
  EXPECT_NE(out.find("--version"), std::string::npos) << out;
}

TEST(Cli, UnknownOptionIsAnErrorWithNonZeroExit) {
  std::string out;
  EXPECT_NE(run_cli({"--no-such-flag"}, out), 0);
  EXPECT_NE(out.find("--no-such-flag"), std::string::npos) << out;
}

// ---- accelerant config and env ------------------------------------------------------------

namespace {

std::string file_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Runs the CLI through sh, so that a test can pipe answers into it.
int run_shell(const std::string& command, std::string& output) {
  auto run = start_program({"/bin/sh", "-c", command});
  const int status = finish_program(run, output, std::chrono::seconds(30));
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace

TEST(CliConfig, DefaultWritesEveryKeyWithTheChosenPrecision) {
  ScratchDir dir;
  const std::string file = dir.path + "/c.yaml";
  std::string out;
  ASSERT_EQ(run_cli({"config", "default", "--mixed_precision", "bf16", "--config_file", file}, out),
            0)
      << out;
  const std::string text = file_text(file);
  EXPECT_NE(text.find("mixed_precision: \"bf16\""), std::string::npos) << text;
  EXPECT_NE(text.find("world_size: 1"), std::string::npos) << text;
  // Written with the one names only (docs/names.md); Accelerate's are read, never written.
  EXPECT_EQ(text.find("num_processes"), std::string::npos) << text;
  EXPECT_NE(text.find("config_version: 1"), std::string::npos) << text;
  // A free port by default: a fixed one collided with other jobs on a shared machine.
  EXPECT_NE(text.find("master_port: 0"), std::string::npos) << text;
  EXPECT_NE(text.find("collective_timeout: 1800"), std::string::npos) << text;
  auto loaded = accelerant::load_config(file);
  EXPECT_EQ(loaded.mixed_precision, accelerant::MixedPrecision::kBf16);
}

TEST(CliConfig, DefaultLocationFollowsXdgCacheHome) {
  ScratchDir dir;
  ::unsetenv("ACCELERANT_CONFIG_FILE");
  ::setenv("XDG_CACHE_HOME", dir.path.c_str(), 1);  // inherited by the CLI
  std::string out;
  ASSERT_EQ(run_cli({"config", "default"}, out), 0) << out;
  EXPECT_NE(file_text(dir.path + "/accelerant/default_config.yaml").find("num_nodes: 1"),
            std::string::npos);
  ASSERT_EQ(run_cli({"config", "show"}, out), 0) << out;
  EXPECT_NE(out.find(dir.path + "/accelerant/default_config.yaml"), std::string::npos) << out;
}

TEST(CliConfig, QuestionsReadPipedAnswersAndAskAgainAfterABadOne) {
  ScratchDir dir;
  const std::string file = dir.path + "/q.yaml";
  // machines 2, rank 1, address, port, processes: "lots" (refused) then 4, bf16, downcast yes,
  // debug: default, restarts 2, threads: default.
  std::string out;
  ASSERT_EQ(run_shell("printf '2\\n1\\n10.1.2.3\\n29501\\nlots\\n4\\nbf16\\nyes\\n\\n2\\n\\n' | " +
                          cli_path() + " config --config_file " + file,
                      out),
            0)
      << out;
  EXPECT_NE(out.find("'lots' is not a whole number"), std::string::npos) << out;
  auto c = accelerant::load_config(file);
  EXPECT_EQ(c.num_nodes, 2);
  EXPECT_EQ(c.node_rank, 1);
  EXPECT_EQ(c.master_addr, "10.1.2.3");
  EXPECT_EQ(c.master_port, 29501);
  EXPECT_EQ(c.world_size, 4);
  EXPECT_EQ(c.mixed_precision, accelerant::MixedPrecision::kBf16);
  EXPECT_TRUE(c.downcast_bf16);
  EXPECT_FALSE(c.debug);
  EXPECT_EQ(c.max_restarts, 2);
}

TEST(CliConfig, AnswersEndingEarlyAreAnErrorNotAHalfWrittenFile) {
  ScratchDir dir;
  std::string out;
  EXPECT_NE(
      run_shell("printf '1\\n' | " + cli_path() + " config --config_file " + dir.path + "/q.yaml",
                out),
      0);
  EXPECT_NE(out.find("input ended"), std::string::npos) << out;
  EXPECT_FALSE(std::ifstream(dir.path + "/q.yaml").good());
}

TEST(CliConfig, AGoodFileIsValidAndSaysSo) {
  ScratchDir dir;
  const std::string file = dir.path + "/good.yaml";
  std::ofstream(file) << "num_processes: 2\nmixed_precision: bf16\ncollective_timeout: 60\n";
  std::string out;
  EXPECT_EQ(run_cli({"config", "validate", "--config_file", file}, out), 0) << out;
  EXPECT_TRUE(out.find(file + ": valid") != std::string::npos) << out;
}

TEST(CliConfig, BadFilesAreRefusedWithWhatAndWhere) {
  ScratchDir dir;
  struct Case {
    const char* content;
    std::vector<std::string> expected;
  };
  const std::vector<Case> cases = {
      {"num_procesess: 2\n", {"unknown key 'num_procesess'", "did you mean 'num_processes'"}},
      {"num_machines: two\n", {"'num_machines' is 'two'", "line 1", "a whole number"}},
      {"num_processes: [1\n", {"not valid YAML", "line "}},
      {"world_size: -1\n", {"world_size is -1", "1 or more"}},
      {"num_processes: -1\n", {"world_size is -1", "1 or more"}},
      {"num_processes: 2\nworld_size: 2\n", {"'world_size' at line 2", "sets world_size again"}},
      {"nproc_per_node: 2\n", {"unknown key 'nproc_per_node'"}},
      {"config_version: 9\n", {"config_version 9", "newer Accelerant"}},
      {"num_machines: 2\nnum_processes: 3\n", {"cannot be split evenly over 2"}},
  };
  for (const auto& c : cases) {
    const std::string file = dir.path + "/bad.yaml";
    std::ofstream(file) << c.content;
    std::string out;
    EXPECT_EQ(run_cli({"config", "validate", "--config_file", file}, out), 1) << c.content;
    for (const auto& e : c.expected)
      EXPECT_NE(out.find(e), std::string::npos) << "expected '" << e << "' in: " << out;
  }
  std::string out;
  EXPECT_EQ(run_cli({"config", "show", "--config_file", dir.path + "/missing.yaml"}, out), 1);
  EXPECT_NE(out.find("accelerant config"), std::string::npos) << out;
}

// The one names and their values for the config-file alias test: each differs from Config's
// default, so that a key the reader dropped shows.
const std::map<std::string, std::string>& one_name_values() {
  static const std::map<std::string, std::string> values = {
      {"world_size", "4"},      {"num_nodes", "2"}, {"node_rank", "1"}, {"master_addr", "10.0.0.9"},
      {"master_port", "29511"}, {"cpu", "true"},    {"debug", "true"},
  };
  return values;
}

std::string yaml_of(const std::map<std::string, std::string>& values) {
  std::string text;
  for (const auto& [key, value] : values) text += key + ": " + value + "\n";
  return text;
}

// A file written for Accelerate (num_processes, machine_rank, ...) loads into the same Config as
// one with the one names; an alias for a quantity the file does not hold is refused as unknown.
TEST(CliConfig, EveryAliasLoadsAsItsOneName) {
  ScratchDir dir;
  const std::string reference = dir.path + "/one_names.yaml";
  std::ofstream(reference) << yaml_of(one_name_values());
  const std::string expected = accelerant::to_yaml(accelerant::load_config(reference));
  ASSERT_NE(expected, accelerant::to_yaml(accelerant::Config{})) << "the values are the defaults";
  const auto& keys = accelerant::config_keys();
  for (const auto& a : accelerant::key_aliases()) {
    const std::string file = dir.path + "/" + a.alias + ".yaml";
    if (std::find(keys.begin(), keys.end(), a.name) == keys.end()) {
      std::ofstream(file) << a.alias << ": 1\n";
      EXPECT_TRUE(contains(error_message([&] { accelerant::load_config(file); }),
                           std::string("unknown key '") + a.alias + "'"))
          << a.alias;
      continue;
    }
    ASSERT_TRUE(one_name_values().count(a.name)) << "add a value for " << a.name << " above";
    auto values = one_name_values();
    std::map<std::string, std::string> with_alias;
    for (const auto& [key, value] : values) with_alias[key == a.name ? a.alias : key] = value;
    std::ofstream(file) << yaml_of(with_alias);
    EXPECT_EQ(accelerant::to_yaml(accelerant::load_config(file)), expected) << a.alias;
  }
}

// Durations are seconds in the file and std::chrono in Config: converted once each way, without
// losing a millisecond or writing exponent notation another reader might not take.
TEST(CliConfig, DurationsAreSecondsInTheFileAndChronoInTheConfig) {
  ScratchDir dir;
  const std::string file = dir.path + "/d.yaml";
  std::ofstream(file) << "monitor_interval: 0.25\njoin_timeout: 2592000\ncollective_timeout: 1.5\n";
  const auto config = accelerant::load_config(file);
  EXPECT_EQ(config.monitor_interval, std::chrono::milliseconds(250));
  EXPECT_EQ(config.join_timeout, std::chrono::hours(24 * 30));
  EXPECT_EQ(config.collective_timeout, std::chrono::milliseconds(1500));
  const std::string text = accelerant::to_yaml(config);
  for (const char* line :
       {"monitor_interval: 0.25\n", "join_timeout: 2592000\n", "collective_timeout: 1.5\n"})
    EXPECT_NE(text.find(line), std::string::npos) << line << " in:\n" << text;
  accelerant::Config in_code;
  in_code.join_timeout = std::chrono::milliseconds(0);
  EXPECT_TRUE(contains(error_message([&] { accelerant::validate_config(in_code); }),
                       "join_timeout is 0 ms"));
}

// docs/names.md lists every alias with the name it stands for and whose it is; the table in the
// code is the one the reader and the CLI use, so the two must not drift.
TEST(Names, TheDocsTableListsTheAliasesInTheCode) {
  std::ifstream doc(ACCELERANT_SOURCE_DIR "/docs/names.md");
  ASSERT_TRUE(doc) << "docs/names.md missing";
  std::set<std::string> documented, in_code;
  const std::regex alias_cell("`([a-z_]+)` \\(([A-Za-z]+)\\)");
  for (std::string line; std::getline(doc, line);) {
    if (line.rfind("| ", 0) != 0) continue;
    std::vector<std::string> cells;
    std::stringstream row(line.substr(1));
    for (std::string cell; std::getline(row, cell, '|');) cells.push_back(cell);
    if (cells.size() < 7) continue;
    std::smatch name;
    const std::regex backticked("`([a-z_]+)`");
    if (!std::regex_search(cells[1], name, backticked)) continue;
    const std::string& aliases = cells[6];
    for (std::sregex_iterator it(aliases.begin(), aliases.end(), alias_cell), end; it != end; ++it)
      documented.insert((*it)[1].str() + " -> " + name[1].str() + " (" + (*it)[2].str() + ")");
  }
  for (const auto& a : accelerant::key_aliases())
    in_code.insert(std::string(a.alias) + " -> " + a.name + " (" + a.origin + ")");
  EXPECT_FALSE(in_code.empty());
  EXPECT_EQ(documented, in_code);
}

// The flags take the config file's aliases, from the same table: the CLI and the examples name
// their flags with flag_names.
TEST(Names, FlagNamesCarryEveryAliasOfTheirName) {
  EXPECT_EQ(accelerant::flag_names("world_size", "-n"), "-n,--world_size,--num_processes");
  EXPECT_EQ(accelerant::flag_names("num_nodes"), "--num_nodes,--num_machines,--nnodes");
  EXPECT_EQ(accelerant::flag_names("seed"), "--seed");
}

// Files that are no config file (note "Bounded input" in src/base/bounded_input.h): before, a
// directory aborted the CLI (std::ios_base::failure, exit 134), 2 MB were parsed and 100,000
// nested brackets were reported as a YAML syntax error.
TEST(CliConfig, ADirectoryAHugeOrADeeplyNestedFileIsRefusedWithTheReason) {
  ScratchDir dir;
  std::string out;
  EXPECT_EQ(run_cli({"config", "validate", "--config_file", dir.path}, out), 1) << out;
  EXPECT_NE(out.find("Config file " + dir.path + " is a directory, not a file"), std::string::npos)
      << out;
  EXPECT_EQ(run_cli({"launch", "--config_file", dir.path, "/bin/true"}, out), 1) << out;
  EXPECT_NE(out.find("is a directory, not a file"), std::string::npos) << out;

  const std::string huge = dir.path + "/huge.yaml";
  {
    std::ofstream file(huge);
    file << "num_processes: 1\n";
    for (int i = 0; i < 40000; ++i) file << "# a comment line of fifty bytes, give or take...\n";
  }
  EXPECT_EQ(run_cli({"config", "validate", "--config_file", huge}, out), 1) << out;
  EXPECT_NE(out.find("bytes, more than the limit of 1048576"), std::string::npos) << out;

  const std::string deep = dir.path + "/deep.yaml";
  std::ofstream(deep) << "num_processes: " << std::string(100000, '[') << std::string(100000, ']')
                      << "\n";
  EXPECT_EQ(run_cli({"config", "validate", "--config_file", deep}, out), 1) << out;
  EXPECT_NE(out.find("nests lists and mappings more than 64 deep"), std::string::npos) << out;
}

// A default config file that is there but cannot be read is an error with the system's reason;
// before, launch skipped it without a word and ran with the defaults. A missing one is still fine.
TEST(CliConfig, ADefaultConfigThatCannotBeReadIsAnErrorNotSkipped) {
  ScratchDir dir;
  std::ofstream(dir.path + "/file") << "x";
  std::string out;
  ::setenv("ACCELERANT_CONFIG_FILE", (dir.path + "/file/default_config.yaml").c_str(), 1);
  EXPECT_EQ(run_cli({"launch", "-n", "1", "/bin/true"}, out), 1) << out;
  EXPECT_NE(out.find("default_config.yaml cannot be opened (Not a directory)"), std::string::npos)
      << out;
  if (::geteuid() != 0) {  // root reads any file
    const std::string locked = dir.path + "/locked.yaml";
    std::ofstream(locked) << "num_processes: 1\n";
    ::chmod(locked.c_str(), 0);
    ::setenv("ACCELERANT_CONFIG_FILE", locked.c_str(), 1);
    EXPECT_EQ(run_cli({"launch", "-n", "1", "/bin/true"}, out), 1) << out;
    EXPECT_NE(out.find("cannot be opened (Permission denied)"), std::string::npos) << out;
  }
  ::setenv("ACCELERANT_CONFIG_FILE", (dir.path + "/missing.yaml").c_str(), 1);
  EXPECT_EQ(run_cli({"launch", "-n", "1", "/bin/true"}, out), 0) << out;
  ::unsetenv("ACCELERANT_CONFIG_FILE");
}

// inspect says whether a checkpoint verifies (exit 1 when not); before, it described a corrupt
// checkpoint as if it were good and listed it among the "complete" ones.
TEST(CliCheckpoint, InspectSaysWhetherEachCheckpointVerifies) {
  ScratchDir dir;
  const std::string project = dir.path;
  accelerant::launch(
      [project](int) {
        accelerant::Accelerator acc(accelerant::AcceleratorOptions().project_dir(project));
        auto net = torch::nn::Linear(4, 2);
        acc.prepare(net);
        acc.save_state();
        acc.save_state();
        return 0;
      },
      accelerant::LaunchOptions().processes_per_node(1).verbose(false));
  const std::string checkpoints = project + "/checkpoints";
  const std::string newest = checkpoints + "/checkpoint_1";
  std::string out;
  EXPECT_EQ(run_cli({"checkpoint", "inspect", newest}, out), 0) << out;
  EXPECT_NE(out.find("verified       yes"), std::string::npos) << out;

  {
    std::fstream model(newest + "/model_0.pt", std::ios::in | std::ios::out | std::ios::binary);
    model.seekg(100);
    const char byte = static_cast<char>(model.get() ^ 0x5a);
    model.seekp(100);
    model.put(byte);
  }
  EXPECT_EQ(run_cli({"checkpoint", "inspect", newest}, out), 1) << out;
  EXPECT_NE(out.find("verified       NO: checkpoint " + newest +
                     " is damaged: model_0.pt is corrupted: CRC-32"),
            std::string::npos)
      << out;
  EXPECT_EQ(run_cli({"checkpoint", "inspect", "--json", newest}, out), 1) << out;
  EXPECT_NE(out.find("model_0.pt is corrupted"), std::string::npos) << out;

  ::mkdir((checkpoints + "/checkpoint_2").c_str(), 0755);  // no manifest
  EXPECT_EQ(run_cli({"checkpoint", "inspect", project}, out), 1) << out;
  EXPECT_NE(out.find("3 checkpoint(s) in " + checkpoints + ", 1 verified"), std::string::npos)
      << out;
  EXPECT_NE(out.find(checkpoints + "/checkpoint_0  step 0"), std::string::npos) << out;
  EXPECT_NE(out.find(newest + "  DAMAGED: checkpoint " + newest + " is damaged"), std::string::npos)
      << out;
  EXPECT_NE(out.find(checkpoints + "/checkpoint_2  INCOMPLETE: no manifest.json"),
            std::string::npos)
      << out;
}

TEST(CliEnv, PrintsVersionsHardwareAndTheConfig) {
  ScratchDir dir;
  const std::string file = dir.path + "/c.yaml";
  std::string out;
  ASSERT_EQ(run_cli({"config", "default", "--config_file", file}, out), 0);
  ASSERT_EQ(run_cli({"env", "--config_file", file}, out), 0) << out;
  for (const char* expected : {"Accelerant: ", "LibTorch: ", "Gloo: ", "Compiler: ", "CPU: ",
                               "BLAS: ", "Threads: ", "MiB free in /dev/shm", "GPUs: ",
                               "Environment variables (docs/environment.md):", "world_size: 1"}) {
    EXPECT_NE(out.find(expected), std::string::npos) << "missing '" << expected << "' in:\n" << out;
  }
  // Every variable of the table, with its value here (the table is the list).
  for (const auto& v : accelerant::environment_variables()) {
    EXPECT_NE(out.find(std::string("\n    ") + v.name + "="), std::string::npos)
        << v.name << " missing in:\n"
        << out;
  }
  ASSERT_EQ(run_shell("ACCELERANT_METRICS=yes " + cli_path() + " env", out), 0) << out;
  EXPECT_NE(out.find("\n    ACCELERANT_METRICS=yes\n"), std::string::npos) << out;
}

TEST(CliHelp, EverySubcommandShowsExamples) {
  for (std::vector<std::string> args : {std::vector<std::string>{"config", "--help"},
                                        {"config", "default", "--help"},
                                        {"config", "show", "--help"},
                                        {"config", "validate", "--help"},
                                        {"env", "--help"},
                                        {"launch", "--help"},
                                        {"test", "--help"}}) {
    std::string out;
    EXPECT_EQ(run_cli(args, out), 0);
    EXPECT_NE(out.find("Examples:"), std::string::npos) << args[0] << ": " << out;
  }
}
