// A stream loader's position in a checkpoint: rank_<r>/stream_<i>.json, written by every rank
// for each prepared stream loader (each rank is somewhere else in its own shards). Absent in
// checkpoints of runs without stream loaders, and in those older than stream loaders, which
// therefore still load.
#pragma once
#include <cstddef>
#include <string>

#include "accelerant/stream_loader.h"

namespace accelerant::detail {

/// One rank's saved position, with what it is only valid for.
struct SavedStreamPosition {
  StreamPosition position;
  int rank = 0;
  int world_size = 1;
  /// The shards of the stream it was saved over.
  size_t shards = 0;
};

/// `saved` as the JSON text of rank_<r>/stream_<i>.json.
std::string format_stream_position(const SavedStreamPosition& saved);
/// Parses that text; `where` names the file in errors. Throws CheckpointError for malformed
/// JSON or a missing or mistyped field.
SavedStreamPosition parse_stream_position(const std::string& text, const std::string& where);

}  // namespace accelerant::detail
