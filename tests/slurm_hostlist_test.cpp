// Table tests for Slurm's hostlist expressions (src/settings/slurm_hostlist.h). The expected
// expansions are what `scontrol show hostnames` of Slurm 22.05 printed for the same text, except
// where a comment says otherwise.
#include "settings/slurm_hostlist.h"

#include <accelerant/error.h>
#include <gtest/gtest.h>

using accelerant::EnvironmentError;
using accelerant::detail::expand_slurm_hostlist;

namespace {

struct GoodCase {
  std::string text;
  std::vector<std::string> hosts;
};

struct BadCase {
  std::string text;
  std::string phrase;  // part of the explanation
};

}  // namespace

TEST(SlurmHostlist, ExpandsAsSlurmDoes) {
  const std::vector<GoodCase> cases = {
      {"vm", {"vm"}},
      {"node07", {"node07"}},
      {"node[01-04,07]", {"node01", "node02", "node03", "node04", "node07"}},
      {"n[008-010]", {"n008", "n009", "n010"}},
      {"n[8-10]", {"n8", "n9", "n10"}},
      {"n[099-101]", {"n099", "n100", "n101"}},
      {"n[01-3]", {"n01", "n02", "n03"}},
      {"n[1-010]", {"n1", "n2", "n3", "n4", "n5", "n6", "n7", "n8", "n9", "n10"}},
      {"n[007]", {"n007"}},
      {"a[1-2]-b[3-4]", {"a1-b3", "a1-b4", "a2-b3", "a2-b4"}},
      {"rack[1-2]n[1-2]", {"rack1n1", "rack1n2", "rack2n1", "rack2n2"}},
      {"n[0-2]-[5-6]", {"n0-5", "n0-6", "n1-5", "n1-6", "n2-5", "n2-6"}},
      {"n1,n[3-5],gpu[01-02]", {"n1", "n3", "n4", "n5", "gpu01", "gpu02"}},
      {"a,,b", {"a", "b"}},
      {",n1,", {"n1"}},
      {"n[1,1]", {"n1", "n1"}},
      {"[1-2]", {"1", "2"}},
      {"n[1-3]y[2]", {"n1y2", "n2y2", "n3y2"}},
      // Slurm 22.05 refuses text after the last bracket; later versions accept it, and so do we.
      {"n[1-2]-ib", {"n1-ib", "n2-ib"}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.text);
    EXPECT_EQ(expand_slurm_hostlist(c.text, "SLURM_JOB_NODELIST"), c.hosts);
  }
}

TEST(SlurmHostlist, ExpandsTheLargestAllowedList) {
  auto hosts = expand_slurm_hostlist("n[000000-999999]", "SLURM_JOB_NODELIST");
  ASSERT_EQ(hosts.size(), accelerant::detail::kMaxSlurmHosts);
  EXPECT_EQ(hosts.front(), "n000000");
  EXPECT_EQ(hosts.back(), "n999999");
}

TEST(SlurmHostlist, RejectsBadListsNamingVariableValueAndFix) {
  const std::vector<BadCase> cases = {
      {"", "names no machine"},
      {",", "names no machine"},
      {"n[1-", "'[' at character 2 that is never closed"},
      {"n[1-2", "never closed"},
      {"n[1-2],m[3", "'[' at character 9 that is never closed"},
      {"n1]", "']' at character 3 with no '['"},
      {"n[[1]]", "inside the brackets opened at character 2"},
      {"n[3-1]", "the range 3-1, whose start is above its end"},
      {"n[a-b]", "\"a-b\" in its brackets, which is neither a number"},
      {"n[1-2-3]", "\"1-2-3\""},
      {"n[-2]", "\"-2\""},
      {"n[1-]", "\"1-\""},
      {"n[]", "empty entry in its brackets at character 3"},
      {"n[1,]", "empty entry"},
      {"n[1, 2]", "blank at character 5"},
      {"n[0-1000000]", "more than 1000000 host names"},
      {"a[0-999]b[0-999]c[0-1]", "more than 1000000 host names"},
      {"n[0-999999],m1", "more than 1000000 host names"},
      {"n[1234567890123456789]", "neither a number"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.text);
    try {
      expand_slurm_hostlist(c.text, "SLURM_STEP_NODELIST");
      ADD_FAILURE() << "no error for " << c.text;
    } catch (const EnvironmentError& e) {
      const std::string message = e.what();
      EXPECT_EQ(e.variable(), "SLURM_STEP_NODELIST");
      EXPECT_EQ(e.value(), c.text);
      EXPECT_NE(message.find("SLURM_STEP_NODELIST=" + (c.text.empty() ? "(empty)" : c.text)),
                std::string::npos)
          << message;
      EXPECT_NE(message.find(c.phrase), std::string::npos) << message;
      EXPECT_NE(message.find("Fix:"), std::string::npos) << message;
    }
  }
}
