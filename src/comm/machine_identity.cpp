#include "comm/machine_identity.h"

#include <limits.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>

#include "accelerant/error.h"
#include "base/text.h"

namespace accelerant::detail {

std::string machine_identity() {
  std::string boot_id;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot_id;
  char host[HOST_NAME_MAX + 1] = {0};
  ::gethostname(host, sizeof host - 1);
  char netns[128] = {0};
  const ssize_t length = ::readlink("/proc/self/ns/net", netns, sizeof netns - 1);
  const char* group = std::getenv("ACCELERANT_SHM_GROUP");
  return str(boot_id, "|", host, "|", length > 0 ? std::string(netns, static_cast<size_t>(length)) : "",
             group && *group ? str("|group ", group) : std::string());
}

bool shm_all_reduce_enabled() {
  const char* value = std::getenv("ACCELERANT_SHM_ALLREDUCE");
  if (value == nullptr || *value == '\0' || std::string(value) == "1") return true;
  if (std::string(value) == "0") return false;
  throw Error(str("ACCELERANT_SHM_ALLREDUCE is \"", value, "\"; expected 0 (all-reduce through Gloo only) or 1 ",
                  "(through shared memory between the ranks of one machine, the default). Fix: set it to 0 or 1."));
}

}  // namespace accelerant::detail
