// What the library records into the metrics report (accelerant/metrics.h). Private: users read
// the report, the library writes it.
#pragma once
#include <cstdint>
#include <string>

namespace accelerant::detail {

/// A GraphStep's first step of a new input signature: a capture (or, on the CPU, the eager run).
void record_capture(const std::string& step, const std::string& mode, const std::string& signature,
                    double seconds);
/// One step of a GraphStep, from the cache or not, replayed or not.
void record_step(const std::string& step, bool cache_hit, bool replayed, double seconds);
/// A copy Accelerant made between the host and a device.
void record_transfer(bool to_device, int64_t bytes);
/// Makes sure the report is printed at exit when requested, even if nothing else records (a
/// training loop without graph steps, whose breakdown the report shows).
void arm_metrics_report();
/// Prints the report to stderr when ACCELERANT_METRICS is true (parse_bool), once per process
/// (an exit hook).
void print_metrics_if_requested();

}  // namespace accelerant::detail
