#include <string>

#include "accelerant/error.h"

namespace accelerant {

std::string rank_prefix(int rank, int world_size) {
  return "[rank " + std::to_string(rank) + "/" + std::to_string(world_size) + "] ";
}

}  // namespace accelerant
