// The rules every CTest test keeps (issue 34), read from CTest's own list of the tests and their
// properties (`ctest --show-only=json-v1`), so that a test added later is held to them too:
// - every test has a TIMEOUT (CTest's default is about 10^6 s: a hang would stall CI for days);
// - no test uses PASS_REGULAR_EXPRESSION, which makes CTest ignore the exit status (a program that
//   prints its result line and then crashes passes); tests/expect-output checks both.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <nlohmann/json.hpp>

#include "test_support.h"

using namespace accelerant::testing;

namespace {

// One line per test that breaks a rule: "<name>: <what>, <fix>".
std::vector<std::string> broken_rules(const nlohmann::json& listing) {
  std::vector<std::string> broken;
  for (const auto& test : listing.at("tests")) {
    const std::string name = test.at("name");
    bool timeout = false;
    for (const auto& property : test.value("properties", nlohmann::json::array())) {
      const std::string property_name = property.at("name");
      if (property_name == "TIMEOUT") timeout = property.at("value").get<double>() > 0;
      if (property_name == "PASS_REGULAR_EXPRESSION") {
        broken.push_back(name +
                         ": PASS_REGULAR_EXPRESSION makes CTest ignore the exit status; run the "
                         "command through tests/expect-output (ACCELERANT_EXPECT_OUTPUT) instead");
      }
    }
    if (!timeout) {
      broken.push_back(name + ": no TIMEOUT; set one with set_tests_properties(... TIMEOUT s)");
    }
  }
  return broken;
}

int exit_status(std::vector<std::string> argv, std::string& output) {
  auto program = start_program(argv);
  const int status = finish_program(program, output, std::chrono::seconds(60));
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::string join(const std::vector<std::string>& lines) {
  std::string text;
  for (const auto& line : lines) text += line + "\n";
  return text;
}

}  // namespace

TEST(CtestRules, EveryTestHasATimeoutAndChecksItsExitStatus) {
  std::string listing;
  ASSERT_EQ(
      exit_status({ACCELERANT_CTEST, "--test-dir", ACCELERANT_BINARY_DIR, "--show-only=json-v1"},
                  listing),
      0)
      << listing;
  const auto json = nlohmann::json::parse(listing);
  ASSERT_GT(json.at("tests").size(), 100u) << "CTest listed too few tests to be this build's";
  const auto broken = broken_rules(json);
  EXPECT_TRUE(broken.empty()) << join(broken);
}

TEST(CtestRules, TheCheckNamesATestWithoutTimeoutAndOneThatIgnoresItsExitStatus) {
  const auto listing = nlohmann::json::parse(R"({"tests": [
    {"name": "kept", "properties": [{"name": "TIMEOUT", "value": 60}]},
    {"name": "no_timeout", "properties": []},
    {"name": "regex_only", "properties": [{"name": "TIMEOUT", "value": 60},
      {"name": "PASS_REGULAR_EXPRESSION", "value": ["done"]}]}]})");
  const auto broken = broken_rules(listing);
  ASSERT_EQ(broken.size(), 2u) << join(broken);
  EXPECT_TRUE(contains(broken[0], "no_timeout: no TIMEOUT")) << join(broken);
  EXPECT_TRUE(contains(broken[1], "regex_only: PASS_REGULAR_EXPRESSION")) << join(broken);
}

// What PASS_REGULAR_EXPRESSION let through, expect-output refuses: the line printed, then a
// failing exit.
TEST(CtestRules, ExpectOutputRequiresTheExitStatusAndTheLine) {
  std::string out;
  EXPECT_EQ(
      exit_status({ACCELERANT_EXPECT_OUTPUT, "accuracy: 9[0-9]", "sh", "-c", "echo 'accuracy: 91'"},
                  out),
      0)
      << out;
  EXPECT_EQ(exit_status({ACCELERANT_EXPECT_OUTPUT, "accuracy: 9[0-9]", "sh", "-c",
                         "echo 'accuracy: 91'; exit 3"},
                        out),
            1)
      << out;
  EXPECT_TRUE(contains(out, "exited with status 3; it must exit 0")) << out;
  EXPECT_EQ(
      exit_status({ACCELERANT_EXPECT_OUTPUT, "accuracy: 9[0-9]", "sh", "-c", "echo 'accuracy: 71'"},
                  out),
      1)
      << out;
  EXPECT_TRUE(contains(out, "no line of the output")) << out;
  EXPECT_EQ(exit_status({ACCELERANT_EXPECT_OUTPUT, "--failure", "refused", "sh", "-c",
                         "echo refused; exit 2"},
                        out),
            0)
      << out;
  EXPECT_EQ(
      exit_status({ACCELERANT_EXPECT_OUTPUT, "--failure", "refused", "sh", "-c", "echo refused"},
                  out),
      1)
      << out;
  EXPECT_EQ(exit_status({ACCELERANT_EXPECT_OUTPUT, "x", "sh", "-c", "exit 77"}, out), 77) << out;
}
