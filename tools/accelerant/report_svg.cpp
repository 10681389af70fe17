#include "report_svg.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <sstream>

#include "html_text.h"

namespace accelerant::cli {
namespace {

// One chart's frame: the plot area inside the margins that hold the ticks and labels.
struct Frame {
  double width, height, left, right, top, bottom;
  double plot_width() const { return width - left - right; }
  double plot_height() const { return height - top - bottom; }
};

constexpr Frame kLineFrame{380, 230, 62, 22, 12, 40};  // three abreast in a 1280-pixel window

std::string num(double v) {  // SVG coordinates: short, and never in a locale's format
  char text[32];
  std::snprintf(text, sizeof text, "%.1f", v);
  return text;
}

// About `count` round tick values (1, 2 or 5 times a power of ten apart) covering [lo, hi].
std::vector<double> nice_ticks(double lo, double hi, int count) {
  const double span = hi - lo;
  const double raw = span / count;
  const double power = std::pow(10.0, std::floor(std::log10(raw)));
  double step = power;
  for (const double f : {1.0, 2.0, 5.0, 10.0}) {
    step = f * power;
    if (raw <= step) break;
  }
  std::vector<double> ticks;
  for (double t = std::ceil(lo / step) * step; t <= hi + step * 1e-9; t += step) {
    ticks.push_back(std::abs(t) < step * 1e-9 ? 0 : t);
  }
  return ticks;
}

// A range that is never empty, so a constant series is still drawn as a line.
void widen(double& lo, double& hi) {
  if (hi > lo) return;
  const double pad = lo == 0 ? 1 : std::abs(lo) * 0.1;
  lo -= pad;
  hi += pad;
}

// Step ticks of long runs as 150k, so that five fit under a small chart.
std::string step_text(double step) {
  if (std::abs(step) >= 10000 && std::fmod(step, 1000) == 0)
    return short_number(step / 1000, 6) + "k";
  return short_number(step, 6);
}

// A line chart's ranges and how values map to pixels.
struct LineScale {
  Frame f = kLineFrame;
  double x_lo = 0, x_hi = 0, y_lo = INFINITY, y_hi = -INFINITY;
  double x_of(double x) const { return f.left + (x - x_lo) / (x_hi - x_lo) * f.plot_width(); }
  double y_of(double y) const { return f.top + (y_hi - y) / (y_hi - y_lo) * f.plot_height(); }
};

// The steps the series spans and the range of its finite values, each widened to be non-empty.
LineScale scale_of(const ScalarSeries& series) {
  LineScale s;
  if (!series.empty()) {
    s.x_lo = static_cast<double>(series.begin()->first);
    s.x_hi = static_cast<double>(series.rbegin()->first);
  }
  for (const auto& [step, value] : series) {
    if (std::isfinite(value)) {
      s.y_lo = std::min(s.y_lo, value);
      s.y_hi = std::max(s.y_hi, value);
    }
  }
  if (!std::isfinite(s.y_lo)) s.y_lo = s.y_hi = 0;
  widen(s.x_lo, s.x_hi);
  widen(s.y_lo, s.y_hi);
  return s;
}

// The horizontal grid lines, both axes with their ticks, and the axis labels.
void draw_axes(std::ostringstream& svg, const LineScale& s, const std::string& tag) {
  const Frame& f = s.f;
  const std::vector<double> x_ticks = nice_ticks(s.x_lo, s.x_hi, 5),
                            y_ticks = nice_ticks(s.y_lo, s.y_hi, 4);
  svg << "<g class=\"grid\" stroke=\"#e3e3e3\">";
  for (double t : y_ticks) {
    svg << "<line x1=\"" << num(f.left) << "\" x2=\"" << num(f.width - f.right) << "\" y1=\""
        << num(s.y_of(t)) << "\" y2=\"" << num(s.y_of(t)) << "\"/>";
  }
  svg << "</g>\n<g class=\"axis\" font-size=\"11\" fill=\"#333\">";
  for (double t : y_ticks) {
    svg << "<text x=\"" << num(f.left - 6) << "\" y=\"" << num(s.y_of(t) + 4)
        << "\" text-anchor=\"end\">" << short_number(t) << "</text>";
  }
  for (double t : x_ticks) {
    svg << "<line x1=\"" << num(s.x_of(t)) << "\" x2=\"" << num(s.x_of(t)) << "\" y1=\""
        << num(f.height - f.bottom) << "\" y2=\"" << num(f.height - f.bottom + 4)
        << "\" stroke=\"#333\"/><text x=\"" << num(s.x_of(t)) << "\" y=\""
        << num(f.height - f.bottom + 16) << "\" text-anchor=\"middle\">" << step_text(t)
        << "</text>";
  }
  svg << "<line x1=\"" << num(f.left) << "\" x2=\"" << num(f.width - f.right) << "\" y1=\""
      << num(f.height - f.bottom) << "\" y2=\"" << num(f.height - f.bottom)
      << "\" stroke=\"#333\"/><line x1=\"" << num(f.left) << "\" x2=\"" << num(f.left) << "\" y1=\""
      << num(f.top) << "\" y2=\"" << num(f.height - f.bottom) << "\" stroke=\"#333\"/>";
  svg << "<text class=\"x-label\" x=\"" << num(f.left + f.plot_width() / 2) << "\" y=\""
      << num(f.height - 4) << "\" text-anchor=\"middle\">step</text>";
  svg << "<text class=\"y-label\" transform=\"translate(12 " << num(f.top + f.plot_height() / 2)
      << ") rotate(-90)\" text-anchor=\"middle\">" << escape_html(tag) << "</text></g>\n";
}

// A dashed vertical line at each checkpoint step inside the chart.
void draw_marks(std::ostringstream& svg, const LineScale& s, const std::vector<int64_t>& marks) {
  const Frame& f = s.f;
  for (int64_t step : marks) {
    const double x = static_cast<double>(step);
    if (x < s.x_lo || x > s.x_hi) continue;
    svg << "<line class=\"checkpoint-mark\" data-step=\"" << step << "\" x1=\"" << num(s.x_of(x))
        << "\" x2=\"" << num(s.x_of(x)) << "\" y1=\"" << num(f.top) << "\" y2=\""
        << num(f.height - f.bottom)
        << "\" stroke=\"#999\" stroke-dasharray=\"3 3\"><title>checkpoint at step " << step
        << "</title></line>";
  }
}

struct SeriesPoint {
  int64_t step;
  double value;
};

// Appends one half-pixel column's points to the path: only its first, lowest, highest and last,
// which look the same as all of them.
void append_column(std::string& path, bool& pen_down, const std::vector<SeriesPoint>& column,
                   const LineScale& s) {
  if (column.empty()) return;
  auto by_value = [](SeriesPoint a, SeriesPoint b) { return a.value < b.value; };
  std::vector<SeriesPoint> kept = {column.front(), column.back()};
  kept.push_back(*std::min_element(column.begin(), column.end(), by_value));
  kept.push_back(*std::max_element(column.begin(), column.end(), by_value));
  std::sort(kept.begin(), kept.end(), [](SeriesPoint a, SeriesPoint b) { return a.step < b.step; });
  int64_t previous = kept.front().step - 1;
  for (const SeriesPoint& p : kept) {
    if (p.step == previous) continue;
    previous = p.step;
    path += (pen_down ? "L" : "M") + num(s.x_of(static_cast<double>(p.step))) + " " +
            num(s.y_of(p.value));
    pen_down = true;
  }
}

// The series as an SVG path. NaN (logged as null) breaks the line instead of being drawn as a
// number. A run logged at every one of 100,000 steps would make a page of megabytes: per
// half-pixel column only a few points are drawn (append_column).
std::string series_path(const ScalarSeries& series, const LineScale& s) {
  std::string path;
  bool pen_down = false;
  std::vector<SeriesPoint> column;  // the current column's points, in step order
  long column_index = -1;
  auto flush = [&] {
    append_column(path, pen_down, column, s);
    column.clear();
  };
  for (const auto& [step, value] : series) {
    if (!std::isfinite(value)) {
      flush();
      pen_down = false;
      continue;
    }
    const long index = std::lround(std::floor(s.x_of(static_cast<double>(step)) * 2));
    if (index != column_index) flush();
    column_index = index;
    column.push_back({step, value});
  }
  flush();
  return path;
}

// Few points (an evaluation per epoch) are shown as dots, each telling its value on hover.
void draw_points(std::ostringstream& svg, const LineScale& s, const ScalarSeries& series) {
  if (series.size() > 60) return;
  svg << "<g class=\"points\" fill=\"#1f5fa8\">";
  for (const auto& [step, value] : series) {
    if (!std::isfinite(value)) continue;
    svg << "<circle cx=\"" << num(s.x_of(static_cast<double>(step))) << "\" cy=\""
        << num(s.y_of(value)) << "\" r=\"3\"><title>step " << step << ": " << short_number(value, 6)
        << "</title></circle>";
  }
  svg << "</g>\n";
}

}  // namespace

std::string short_number(double value, int digits) {
  if (std::isnan(value)) return "NaN";
  char text[32];
  std::snprintf(text, sizeof text, "%.*g", digits, value);
  return text;
}

std::string phase_colour(const std::string& phase) {
  static const std::map<std::string, std::string> kColours = {{"data", "#4e79a7"},
                                                              {"forward_backward", "#f28e2b"},
                                                              {"all_reduce", "#e15759"},
                                                              {"optimizer", "#59a14f"},
                                                              {"other", "#9c9c9c"}};
  auto it = kColours.find(phase);
  if (it != kColours.end()) return it->second;
  // A phase this version does not know still gets a stable colour of its own.
  static const char* kSpare[] = {"#b07aa1", "#edc948", "#76b7b2", "#ff9da7", "#9c755f"};
  return kSpare[std::hash<std::string>{}(phase) % 5];
}

std::string line_chart_svg(const std::string& tag, const ScalarSeries& series,
                           const std::vector<int64_t>& marks) {
  const LineScale s = scale_of(series);
  const Frame& f = s.f;
  std::ostringstream svg;
  svg << "<svg class=\"chart\" data-tag=\"" << escape_html(tag) << "\" data-points=\""
      << series.size() << "\" xmlns=\"http://www.w3.org/2000/svg\" width=\"" << f.width
      << "\" height=\"" << f.height << "\" viewBox=\"0 0 " << f.width << " " << f.height
      << "\" role=\"img\" aria-label=\"" << escape_html(tag) << " by step\">\n";
  draw_axes(svg, s, tag);
  draw_marks(svg, s, marks);
  svg << "<path class=\"series\" d=\"" << series_path(series, s)
      << "\" fill=\"none\" stroke=\"#1f5fa8\" stroke-width=\"1.8\"/>\n";
  draw_points(svg, s, series);
  svg << "</svg>";
  return svg.str();
}

std::string step_time_svg(const std::vector<RankStepTime>& ranks, double median_ms) {
  const double row = 30, left = 70, right = 190, top = 10, bottom = 34, width = 760;
  const double height = top + bottom + row * static_cast<double>(ranks.size());
  double most = median_ms;
  for (const auto& r : ranks) {
    double sum = 0;
    for (const auto& [phase, ms] : r.phases) sum += ms;
    most = std::max({most, r.step_ms, sum});
  }
  if (most <= 0) most = 1;
  const std::vector<double> ticks = nice_ticks(0, most, 5);
  const double scale_max = std::max(most, ticks.empty() ? most : ticks.back());
  auto x_of = [&](double ms) { return left + ms / scale_max * (width - left - right); };

  // Known phases in the order a step runs them, then any others by name.
  std::vector<std::string> order = step_time_phases();
  for (const auto& r : ranks) {
    for (const auto& [phase, ms] : r.phases) {
      if (std::find(order.begin(), order.end(), phase) == order.end()) order.push_back(phase);
    }
  }

  std::ostringstream svg;
  svg << "<svg class=\"breakdown\" xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width
      << "\" height=\"" << num(height) << "\" viewBox=\"0 0 " << width << " " << num(height)
      << "\" role=\"img\" aria-label=\"step time per rank\" font-size=\"12\">\n";
  for (double t : ticks) {
    svg << "<line x1=\"" << num(x_of(t)) << "\" x2=\"" << num(x_of(t)) << "\" y1=\"" << top
        << "\" y2=\"" << num(height - bottom) << "\" stroke=\"#e3e3e3\"/><text x=\"" << num(x_of(t))
        << "\" y=\"" << num(height - bottom + 16) << "\" text-anchor=\"middle\" fill=\"#333\">"
        << short_number(t) << "</text>";
  }
  svg << "<text x=\"" << num(left + (width - left - right) / 2) << "\" y=\"" << num(height - 4)
      << "\" text-anchor=\"middle\" fill=\"#333\">milliseconds per step</text>\n";
  for (size_t i = 0; i < ranks.size(); ++i) {
    const RankStepTime& r = ranks[i];
    const double y = top + row * static_cast<double>(i);
    svg << "<g class=\"rank-bar" << (r.straggler ? " straggler" : "") << "\" data-rank=\"" << r.rank
        << "\" data-step-ms=\"" << short_number(r.step_ms, 6) << "\">";
    svg << "<text x=\"" << num(left - 8) << "\" y=\"" << num(y + row / 2 + 4)
        << "\" text-anchor=\"end\" fill=\"#333\">rank " << r.rank << "</text>";
    double at = 0;
    for (const auto& phase : order) {
      auto it = r.phases.find(phase);
      if (it == r.phases.end() || !(it->second > 0)) continue;
      svg << "<rect class=\"phase\" data-phase=\"" << escape_html(phase) << "\" x=\""
          << num(x_of(at)) << "\" y=\"" << num(y + 4) << "\" width=\""
          << num(x_of(at + it->second) - x_of(at)) << "\" height=\"" << num(row - 8) << "\" fill=\""
          << phase_colour(phase) << "\"><title>rank " << r.rank << " " << escape_html(phase) << ": "
          << short_number(it->second) << " ms</title></rect>";
      at += it->second;
    }
    if (r.straggler) {
      svg << "<rect class=\"straggler-outline\" x=\"" << num(left - 2) << "\" y=\"" << num(y + 2)
          << "\" width=\"" << num(x_of(std::max(at, r.step_ms)) - left + 4) << "\" height=\""
          << num(row - 4) << "\" fill=\"none\" stroke=\"#c0392b\" stroke-width=\"2.5\"/>";
    }
    svg << "<text x=\"" << num(x_of(std::max(at, r.step_ms)) + 8) << "\" y=\""
        << num(y + row / 2 + 4) << "\" fill=\"" << (r.straggler ? "#c0392b" : "#333") << "\">"
        << short_number(r.step_ms) << " ms";
    if (r.straggler && median_ms > 0) {
      svg << " &#9650; straggler +" << short_number((r.step_ms / median_ms - 1) * 100, 3) << "%";
    }
    svg << "</text></g>\n";
  }
  if (median_ms > 0) {
    svg << "<line class=\"median\" x1=\"" << num(x_of(median_ms)) << "\" x2=\""
        << num(x_of(median_ms)) << "\" y1=\"" << top - 4 << "\" y2=\"" << num(height - bottom)
        << "\" stroke=\"#222\" stroke-dasharray=\"4 3\"><title>median of ranks: "
        << short_number(median_ms) << " ms</title></line>";
  }
  svg << "</svg>";
  return svg.str();
}

}  // namespace accelerant::cli
