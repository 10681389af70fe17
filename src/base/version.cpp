#include "accelerant/version.h"

#include <torch/version.h>

namespace accelerant {

const char* torch_version() { return TORCH_VERSION; }

}  // namespace accelerant
