// Accelerator's trackers (docs/observability.md): the main process alone starts, writes and closes
// them; the other processes only remember that init_trackers was called, so that a log() before
// it fails on every rank alike. Nothing here is a collective.
#include <exception>
#include <filesystem>
#include <system_error>

#include "accelerant/accelerator.h"
#include "accelerant/error.h"
#include "accelerator/accelerator_impl.h"
#include "track/builtin_trackers.h"

namespace accelerant {

void Accelerator::init_trackers(const std::string& project_name, const TrackerConfig& config) {
  if (!impl_->tracker_dir_.empty()) {
    throw Error(impl_->rank_prefix_ + "init_trackers(\"" + project_name +
                "\") called twice; the trackers write to " + impl_->tracker_dir_ +
                ". Call it once per run (end_training closes them).");
  }
  if (project_name.empty() || project_name.find('/') != std::string::npos || project_name == "." ||
      project_name == "..") {
    throw Error(impl_->rank_prefix_ + "init_trackers: project name \"" + project_name +
                "\" is not a folder name. Give a non-empty name without '/', e.g. \"run1\".");
  }
  const std::string base =
      impl_->options_.project_dir().empty() ? "." : impl_->options_.project_dir();
  // On every rank, before any file: a config no tracker can write fails everywhere alike.
  detail::check_tracker_config(config, impl_->rank_prefix_ + "init_trackers");
  impl_->tracker_dir_ = base + "/" + project_name;
  if (!is_main_process()) {
    impl_->trackers_.clear();  // add_tracker keeps none here either
    return;
  }
  std::error_code error;
  std::filesystem::create_directories(impl_->tracker_dir_, error);
  if (error) {
    throw Error(impl_->rank_prefix_ + "init_trackers: cannot create " + impl_->tracker_dir_ + ": " +
                error.message() + ". Check AcceleratorOptions::project_dir.");
  }
  std::vector<std::shared_ptr<Tracker>> started;
  for (const auto& name : impl_->options_.log_with()) started.push_back(make_tracker(name));
  for (auto& tracker : impl_->trackers_) started.push_back(std::move(tracker));
  impl_->trackers_ = std::move(started);
  impl_->tracker_config_ = config;
  for (auto& tracker : impl_->trackers_) tracker->init(impl_->tracker_dir_, config);
}

void Accelerator::add_tracker(std::shared_ptr<Tracker> tracker) {
  if (!tracker) throw Error(impl_->rank_prefix_ + "add_tracker: the tracker is null.");
  if (!is_main_process()) return;
  // Added after init_trackers: started at once, with the run's hyper-parameters like the others.
  if (!impl_->tracker_dir_.empty()) tracker->init(impl_->tracker_dir_, impl_->tracker_config_);
  impl_->trackers_.push_back(std::move(tracker));
}

void Accelerator::log(const TrackerScalars& values, int64_t step) {
  if (impl_->tracker_dir_.empty()) {
    throw Error(impl_->rank_prefix_ +
                "log() before init_trackers(): no tracker has been started. Call "
                "init_trackers(\"<project name>\", config) once before the training loop.");
  }
  if (!is_main_process()) return;
  detail::check_tracker_record(values, step,
                               impl_->rank_prefix_ + "log(step " + std::to_string(step) + ")");
  for (auto& tracker : impl_->trackers_) tracker->log(values, step);
}

void Accelerator::close_trackers() {
  auto trackers = std::move(impl_->trackers_);
  impl_->trackers_.clear();
  if (impl_->tracker_dir_.empty()) return;  // added but never started: nothing to close
  std::exception_ptr first_error;
  for (auto& tracker : trackers) {
    try {
      tracker->close();
    } catch (...) {
      if (!first_error) first_error = std::current_exception();
    }
  }
  if (first_error) std::rethrow_exception(first_error);
}

}  // namespace accelerant
