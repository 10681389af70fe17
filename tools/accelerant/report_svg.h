// The report's charts as inline SVG, drawn here rather than by a JavaScript library so that the
// page is one file that opens anywhere, offline, and shows the same thing in every browser.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "report_run.h"

namespace accelerant::cli {

/// A line chart of one scalar tag against the step, with axes, ticks and labels; NaN values are
/// gaps. Steps in `marks` (the checkpoints) are drawn as dashed vertical lines.
std::string line_chart_svg(const std::string& tag, const ScalarSeries& series,
                           const std::vector<int64_t>& marks);

/// One horizontal bar per rank, its phases stacked in step_time_phases() order, the ranks'
/// median as a dashed line and stragglers outlined and labelled.
std::string step_time_svg(const std::vector<RankStepTime>& ranks, double median_ms);

/// The colour a phase is drawn in (shared by the bars and the page's legend).
std::string phase_colour(const std::string& phase);

/// `value` in at most `digits` significant digits (axis ticks, table cells).
std::string short_number(double value, int digits = 4);

}  // namespace accelerant::cli
