// The built-in trackers behind make_tracker (private to src/track).
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "accelerant/tracker.h"

namespace accelerant::detail {

/// How often a tracker's log() makes its file durable; end_training() flushes at once.
constexpr std::chrono::seconds kTrackerFlushInterval{5};

/// Throws Error when a line the CSV or JSON Lines tracker would write for this log call, or for
/// this config, exceeds kMaxTrackerLineBytes (measured on the very lines they write). `who` starts
/// the message ("[rank 0/2] log(step 7)").
void check_tracker_record(const TrackerScalars& values, int64_t step, const std::string& who);
void check_tracker_config(const TrackerConfig& config, const std::string& who);

std::shared_ptr<Tracker> make_csv_tracker();
std::shared_ptr<Tracker> make_jsonl_tracker();
std::shared_ptr<Tracker> make_tensorboard_tracker();

}  // namespace accelerant::detail
