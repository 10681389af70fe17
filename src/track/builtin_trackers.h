// The built-in trackers behind make_tracker (private to src/track).
#pragma once

#include <chrono>
#include <memory>

#include "accelerant/tracker.h"

namespace accelerant::detail {

/// How often a tracker's log() makes its file durable; end_training() flushes at once.
constexpr std::chrono::seconds kTrackerFlushInterval{5};

std::shared_ptr<Tracker> make_csv_tracker();
std::shared_ptr<Tracker> make_jsonl_tracker();
std::shared_ptr<Tracker> make_tensorboard_tracker();

}  // namespace accelerant::detail
