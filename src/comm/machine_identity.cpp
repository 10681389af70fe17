#include "comm/machine_identity.h"

#include <limits.h>
#include <unistd.h>

#include <fstream>

#include "accelerant/environment.h"
#include "base/text.h"

namespace accelerant::detail {

std::string machine_identity() {
  std::string boot_id;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot_id;
  char host[HOST_NAME_MAX + 1] = {0};
  ::gethostname(host, sizeof host - 1);
  char netns[128] = {0};
  const ssize_t length = ::readlink("/proc/self/ns/net", netns, sizeof netns - 1);
  const std::string group = environment_value("ACCELERANT_SHM_GROUP").value_or("");
  return str(boot_id, "|", host, "|",
             length > 0 ? std::string(netns, static_cast<size_t>(length)) : "",
             group.empty() ? std::string() : str("|group ", group));
}

bool shm_all_reduce_enabled() {
  // Unset: on (false: all-reduce through Gloo only).
  return environment_flag("ACCELERANT_SHM_ALLREDUCE").value_or(true);
}

}  // namespace accelerant::detail
