#include "accelerant/error.h"
#include "accelerant/tracker.h"
#include "track/builtin_trackers.h"

namespace accelerant {

std::shared_ptr<Tracker> make_tracker(const std::string& name) {
  if (name == "csv") return detail::make_csv_tracker();
  if (name == "jsonl") return detail::make_jsonl_tracker();
  if (name == "tensorboard") return detail::make_tensorboard_tracker();
  throw Error(
      "unknown tracker \"" + name +
      "\" (AcceleratorOptions::log_with). Use \"tensorboard\", \"csv\" or \"jsonl\", or add "
      "your own with Accelerator::add_tracker.");
}

}  // namespace accelerant
