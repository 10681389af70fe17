// What Accelerator::profile records and where it writes it (docs/observability.md "Profiler
// traces").
#pragma once

#include <cstdint>
#include <string>

#include "accelerant/options.h"

namespace accelerant {

/// Options of Accelerator::profile, set with chained setters:
/// `ProfileOptions().dir("runs/traces").steps(3, 5)`.
struct ProfileOptions {
  /// The folder each process writes `trace_rank<r>.json` into, and the main process the merged
  /// `trace.json`; created when missing. Default: "" = `<project_dir>/traces`, or `traces` when
  /// AcceleratorOptions::project_dir is empty.
  ACCELERANT_OPTION(std::string, dir) = "";
  /// Record each LibTorch operator's input shapes and dtypes. Default: true.
  ACCELERANT_OPTION(bool, record_shapes) = true;
  /// Record LibTorch's allocations and frees (instant events with their byte counts).
  /// Default: false.
  ACCELERANT_OPTION(bool, record_memory) = false;

 public:  // ACCELERANT_OPTION leaves the section private
  /// Records optimizer steps `first` to `last` (counting from 1) instead of the whole scope:
  /// recording starts when step first-1 ends (at once when `first` is 1) and stops, writing the
  /// files, when step `last` ends. Default: no range (the scope is recorded from profile() until
  /// it stops).
  ProfileOptions& steps(int64_t first, int64_t last) {
    first_step_ = first;
    last_step_ = last;
    return *this;
  }
  /// The first step of the range set by steps(); 0 when there is none.
  int64_t first_step() const { return first_step_; }
  /// The last step of the range set by steps(); 0 when there is none.
  int64_t last_step() const { return last_step_; }

 private:
  int64_t first_step_ = 0;
  int64_t last_step_ = 0;
};

}  // namespace accelerant
