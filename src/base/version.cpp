#include "accelerant/version.h"

#include <torch/version.h>

#include "base/torch_version.h"

namespace accelerant {

const char* torch_version() { return TORCH_VERSION; }

namespace detail {

// LibTorch 1.10 to 1.13 speak the protocol job_store.h describes (earlier 1.x releases too, as far
// as the workers' calls go); 2.x added a magic number and a version check on connection.
bool workers_speak_agent_store_protocol() { return TORCH_VERSION_MAJOR == 1; }

}  // namespace detail
}  // namespace accelerant
