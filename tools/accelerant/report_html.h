// The report page: one self-contained HTML file (inline CSS and SVG, no script, nothing fetched)
// so that it can be mailed, attached to an issue or opened on a machine with no network.
#pragma once
#include <string>

#include "report_run.h"

namespace accelerant::cli {

/// The page for `report`. Elements carry stable ids, classes and data- attributes (documented in
/// docs/observability.md "The report") that the report test checks in the rendered DOM.
std::string report_html(const RunReport& report);

}  // namespace accelerant::cli
