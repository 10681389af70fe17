// The table of environment variables, its accessor, and the one parser per kind of value
// (environment.h): table tests of the accepted and refused spellings, and of every source of the
// mixed-precision setting taking the same ones.
#include <accelerant/accelerant.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <fstream>
#include <set>

#include "test_support.h"

using namespace accelerant;
using accelerant::testing::contains;
using accelerant::testing::env_of;

TEST(EnvironmentTable, EveryRowIsCompleteAndDeclaredOnce) {
  std::set<std::string> names;
  for (const auto& v : environment_variables()) {
    SCOPED_TRACE(v.name);
    EXPECT_TRUE(names.insert(v.name).second) << "declared twice";
    for (const char* field : {v.type, v.default_value, v.meaning, v.read_by})
      EXPECT_GT(std::string(field).size(), 0u);
    EXPECT_EQ(find_environment_variable(v.name), &v);
  }
  EXPECT_EQ(find_environment_variable("ACCELERANT_NOT_A_VARIABLE"), nullptr);
}

// What a launcher sets is what a worker reads: every variable of the launch contract is declared.
TEST(EnvironmentTable, DeclaresEveryVariableTheLaunchersSet) {
  LaunchContract env;
  env.collective_timeout = std::chrono::milliseconds(5);
  env.threads_per_process = 2;
  env.error_file = "/tmp/e";
  for (const auto& [name, value] : to_environment(env)) {
    EXPECT_NE(find_environment_variable(name), nullptr)
        << name << " is set by the launchers but not declared";
  }
}

TEST(EnvironmentAccessor, RefusesAnUndeclaredNameNamingTheTable) {
  const std::string message =
      accelerant::testing::error_message([] { environment_value("ACCELERANT_NOT_A_VARIABLE"); });
  EXPECT_TRUE(contains(message, "ACCELERANT_NOT_A_VARIABLE")) << message;
  EXPECT_TRUE(contains(message, "table of environment variables")) << message;
  EXPECT_TRUE(contains(message, "Fix:")) << message;
  EXPECT_THROW(environment_flag("NOT_DECLARED"), Error);
  EXPECT_THROW(process_environment()("NOT_DECLARED"), Error);  // the launch contract's reader too
}

TEST(EnvironmentAccessor, ReadsDeclaredVariables) {
  ::setenv("ACCELERANT_SHM_GROUP", "node-a", 1);
  EXPECT_EQ(environment_value("ACCELERANT_SHM_GROUP"), std::optional<std::string>("node-a"));
  EXPECT_EQ(process_environment()("ACCELERANT_SHM_GROUP"), std::optional<std::string>("node-a"));
  ::unsetenv("ACCELERANT_SHM_GROUP");
  EXPECT_EQ(environment_value("ACCELERANT_SHM_GROUP"), std::nullopt);

  ::setenv("ACCELERANT_METRICS", "", 1);
  EXPECT_EQ(environment_flag("ACCELERANT_METRICS"), std::nullopt) << "empty counts as unset";
  ::setenv("ACCELERANT_METRICS", "True", 1);
  EXPECT_EQ(environment_flag("ACCELERANT_METRICS"), std::optional<bool>(true));
  ::setenv("ACCELERANT_METRICS", "maybe", 1);
  EXPECT_THROW(environment_flag("ACCELERANT_METRICS"), EnvironmentError);
  ::unsetenv("ACCELERANT_METRICS");
}

// Fake environments (the launch contract's injectable EnvLookup) keep working.
TEST(EnvironmentAccessor, InjectedLookupsStillWork) {
  auto env = parse_launch_contract(env_of({{"RANK", "1"},
                                           {"WORLD_SIZE", "2"},
                                           {"MASTER_ADDR", "127.0.0.1"},
                                           {"ACCELERANT_DEBUG_MODE", "yes"},
                                           {"ACCELERANT_MIXED_PRECISION", "BF16"}}));
  EXPECT_EQ(env.rank, 1);
  EXPECT_EQ(env.debug, std::optional<bool>(true));
  EXPECT_EQ(env.mixed_precision, MixedPrecision::kBf16);
}

TEST(ParseBool, AcceptsEverySpellingInAnyCase) {
  for (const char* yes : {"1", "true", "TRUE", "True", "yes", "Yes", "y", "Y", "on", "ON"}) {
    EXPECT_TRUE(parse_bool(yes, "ACCELERANT_METRICS")) << yes;
  }
  for (const char* no : {"0", "false", "FALSE", "no", "No", "n", "N", "off", "Off"}) {
    EXPECT_FALSE(parse_bool(no, "ACCELERANT_METRICS")) << no;
  }
}

TEST(ParseBool, RefusesOthersNamingTheVariableTheValueAndTheAcceptedValues) {
  for (const char* bad : {"maybe", "2", "tru", "", " 1", "yess", "-1"}) {
    SCOPED_TRACE(std::string("'") + bad + "'");
    try {
      parse_bool(bad, "ACCELERANT_DEBUG_MODE");
      ADD_FAILURE() << "accepted";
    } catch (const EnvironmentError& e) {
      const std::string message = e.what();
      EXPECT_EQ(e.variable(), "ACCELERANT_DEBUG_MODE");
      EXPECT_EQ(e.value(), bad);
      EXPECT_TRUE(
          contains(message, std::string("ACCELERANT_DEBUG_MODE=") + bad + " is not a boolean"))
          << message;
      EXPECT_TRUE(contains(message, "Accepted: 1, true, yes, y, on or 0, false, no, n, off"))
          << message;
      EXPECT_TRUE(contains(message, "Fix:")) << message;
    }
  }
  // Another source: the message names it and quotes the value.
  const std::string message =
      accelerant::testing::error_message([] { parse_bool("maybe", "my.yaml (key cpu)"); });
  EXPECT_TRUE(contains(message, "\"maybe\" (from my.yaml (key cpu)) is not a boolean")) << message;
}

TEST(ParseMixedPrecision, AcceptsNoFp16Bf16InAnyCase) {
  const std::vector<std::pair<std::string, MixedPrecision>> cases = {
      {"no", MixedPrecision::kNo},     {"NO", MixedPrecision::kNo},
      {"fp16", MixedPrecision::kFp16}, {"FP16", MixedPrecision::kFp16},
      {"bf16", MixedPrecision::kBf16}, {"Bf16", MixedPrecision::kBf16}};
  for (const auto& [text, expected] : cases) {
    EXPECT_EQ(parse_mixed_precision(text, "ACCELERANT_MIXED_PRECISION"), expected) << text;
    EXPECT_EQ(parse_mixed_precision(to_string(expected), "x"), expected);
  }
}

TEST(ParseMixedPrecision, RefusesOthersNamingTheVariableTheValueAndTheAcceptedValues) {
  for (const char* bad : {"fp32", "none", "fp8", "", "bfloat16", "half", "yes"}) {
    SCOPED_TRACE(std::string("'") + bad + "'");
    try {
      parse_mixed_precision(bad, "ACCELERANT_MIXED_PRECISION");
      ADD_FAILURE() << "accepted";
    } catch (const EnvironmentError& e) {
      const std::string message = e.what();
      EXPECT_EQ(e.variable(), "ACCELERANT_MIXED_PRECISION");
      EXPECT_EQ(e.value(), bad);
      EXPECT_TRUE(contains(message, std::string("ACCELERANT_MIXED_PRECISION=") + bad + " is not a"))
          << message;
      EXPECT_TRUE(contains(message, "use no, fp16 or bf16")) << message;
    }
  }
  const std::string message = accelerant::testing::error_message(
      [] { parse_mixed_precision("fp32", "ACCELERANT_MIXED_PRECISION"); });
  EXPECT_TRUE(contains(message, "full precision is written no")) << message;
}

TEST(ParseMachineCount, ReadsAFixedCountAndTorchrunsRange) {
  const MachineCount fixed = parse_machine_count("3", "--num_nodes");
  EXPECT_EQ(fixed.fewest, 3);
  EXPECT_EQ(fixed.most, 3);
  const MachineCount range = parse_machine_count("1:4", "--num_nodes");
  EXPECT_EQ(range.fewest, 1);
  EXPECT_EQ(range.most, 4);
  const MachineCount same = parse_machine_count("2:2", "--num_nodes");
  EXPECT_EQ(same.fewest, 2);
  EXPECT_EQ(same.most, 2);
}

TEST(ParseMachineCount, RefusesOthersNamingTheSourceTheTextAndTheForms) {
  for (const char* bad : {"", "0", "0:2", "3:2", "a", "1:", ":2", "1:2:3", "-1:2", "1.5", "2 "}) {
    SCOPED_TRACE(std::string("'") + bad + "'");
    const std::string message =
        accelerant::testing::error_message([bad] { parse_machine_count(bad, "--num_nodes"); });
    EXPECT_TRUE(contains(message, std::string("\"") + bad + "\" (from --num_nodes) is")) << message;
    EXPECT_TRUE(contains(message, "MIN:MAX")) << message;
  }
  const std::string message =
      accelerant::testing::error_message([] { parse_machine_count("3:2", "--num_nodes"); });
  EXPECT_TRUE(contains(message, "whose fewest machines exceed its most")) << message;
}

// One rule for every source of the setting as text (the code's options take the enum): fp32 is
// refused by each, BF16 accepted by each.
TEST(ParseMixedPrecision, EverySourceTakesTheSameSpellings) {
  auto none = env_of({});
  accelerant::testing::ScratchDir dir;
  const std::string file = dir.path + "/config.yaml";
  EXPECT_THROW(
      resolve_accelerator_settings({}, env_of({{"ACCELERANT_MIXED_PRECISION", "none"}}), {}),
      Error);
  EXPECT_THROW(resolve_accelerator_settings({}, none, {{"mixed_precision", "fp32"}}), Error);
  EXPECT_THROW(parse_launch_contract(env_of({{"ACCELERANT_MIXED_PRECISION", "fp32"}})),
               EnvironmentError);
  std::ofstream(file) << "mixed_precision: fp32\n";
  EXPECT_THROW(load_config(file), Error);

  EXPECT_EQ(resolve_accelerator_settings({}, none, {{"mixed_precision", "Bf16"}}).mixed_precision,
            MixedPrecision::kBf16);
  EXPECT_EQ(parse_launch_contract(env_of({{"ACCELERANT_MIXED_PRECISION", "BF16"}})).mixed_precision,
            MixedPrecision::kBf16);
  std::ofstream(file) << "mixed_precision: BF16\ndowncast_bf16: true\n";
  const Config config = load_config(file);
  EXPECT_EQ(config.mixed_precision, MixedPrecision::kBf16);
  EXPECT_NO_THROW(validate_config(config));
}
