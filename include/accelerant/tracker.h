// Trackers: where Accelerator::log() sends a run's scalars (docs/observability.md).
//
// A Tracker receives the run's hyper-parameters once (init), scalars with a step (log), and is
// flushed and closed at the end. Accelerator calls them on the main process only, so a tracker
// never talks to other ranks. The built-in ones (make_tracker) write CSV, JSON Lines and
// TensorBoard event files; a user adds their own with Accelerator::add_tracker.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace accelerant {

/// One hyper-parameter value: a number or a text. Built implicitly from numbers, bools and text,
/// so a config reads `{{"lr", 1e-3}, {"batch_size", 64}, {"optimizer", "adamw"}}`.
class TrackerValue {
 public:
  /// A number (integers are stored as double; exact up to 2^53).
  TrackerValue(double number) : is_number_(true), number_(number) {}  // NOLINT: implicit
  /// An integer, stored as a number.
  TrackerValue(int number) : TrackerValue(static_cast<double>(number)) {}  // NOLINT
  /// An integer, stored as a number.
  TrackerValue(int64_t number) : TrackerValue(static_cast<double>(number)) {}  // NOLINT
  /// A bool, stored as the number 0 or 1.
  TrackerValue(bool flag) : TrackerValue(flag ? 1.0 : 0.0) {}  // NOLINT
  /// A text.
  TrackerValue(std::string text) : text_(std::move(text)) {}  // NOLINT
  /// A text.
  TrackerValue(const char* text) : text_(text) {}  // NOLINT
  /// Whether this holds a number (else a text).
  bool is_number() const { return is_number_; }
  /// The number (0 for a text).
  double number() const { return number_; }
  /// The text (empty for a number).
  const std::string& text() const { return text_; }

 private:
  bool is_number_ = false;
  double number_ = 0;
  std::string text_;
};

/// A run's hyper-parameters, name -> value, in the order given.
using TrackerConfig = std::vector<std::pair<std::string, TrackerValue>>;
/// Scalars of one log call, tag -> value, in the order given.
using TrackerScalars = std::vector<std::pair<std::string, double>>;

/// The longest line the CSV and JSON Lines trackers write, and so the longest `accelerant report`
/// reads back: 1 MiB. Accelerator::log and init_trackers refuse a record or a config that would
/// make a longer line (a tag is a name, e.g. "train/loss", not a payload), before any tracker
/// writes it.
inline constexpr size_t kMaxTrackerLineBytes = size_t{1} << 20;

/// Receives a run's hyper-parameters and scalars. Called from one thread (the caller of
/// Accelerator::log), on the main process only.
class Tracker {
 public:
  virtual ~Tracker() = default;
  /// Starts a run: `run_dir` (`<project_dir>/<project_name>`, already created) is where a tracker
  /// that writes files puts them; `config` holds the hyper-parameters.
  virtual void init(const std::string& run_dir, const TrackerConfig& config) = 0;
  /// Records `values` at `step`.
  virtual void log(const TrackerScalars& values, int64_t step) = 0;
  /// Makes everything logged so far durable (readable after a crash).
  virtual void flush() = 0;
  /// Flushes and releases the tracker's files; log() is not called afterwards.
  virtual void close() = 0;
};

/// A built-in tracker by name: "csv" (scalars.csv in long format, step,tag,value, and
/// config.csv), "jsonl" (scalars.jsonl, one object per log call, the config as the first line) or
/// "tensorboard" (an events.out.tfevents file). Each writes into the run folder init() gets.
/// Throws Error for another name.
std::shared_ptr<Tracker> make_tracker(const std::string& name);

/// The masked CRC32C that TFRecord framing stores (exposed for tests and readers).
uint32_t masked_crc32c(const void* data, size_t size);
/// CRC32C (Castagnoli, the iSCSI polynomial) of `size` bytes.
uint32_t crc32c(const void* data, size_t size);

}  // namespace accelerant
