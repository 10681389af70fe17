#include "report_html.h"

#include <accelerant/metrics.h>
#include <accelerant/version.h>

#include <cmath>
#include <cstdio>
#include <ctime>
#include <sstream>

#include "html_text.h"
#include "human_bytes.h"
#include "report_svg.h"

namespace accelerant::cli {
namespace {

const char* const kStyle = R"(
body{font-family:system-ui,sans-serif;margin:24px;color:#222;max-width:1240px}
h1{font-size:22px;margin:0 0 4px} h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid #ddd}
code,pre{font-family:ui-monospace,monospace;font-size:12px} .meta{color:#666;font-size:13px}
.cards{display:flex;gap:12px;flex-wrap:wrap} .card{border:1px solid #ddd;border-radius:6px;padding:8px 14px}
.card b{display:block;font-size:20px} .charts{display:flex;flex-wrap:wrap;gap:14px}
figure{margin:0;border:1px solid #e5e5e5;border-radius:6px;padding:6px}
figcaption{font-size:13px;font-weight:600} figcaption span{font-weight:400;color:#666}
table{border-collapse:collapse;font-size:13px} td,th{border:1px solid #ddd;padding:3px 8px;text-align:left}
td.n{text-align:right;font-variant-numeric:tabular-nums} tr.straggler td{color:#c0392b;font-weight:600}
.legend{list-style:none;padding:0;display:flex;gap:14px;font-size:13px}
.legend i{display:inline-block;width:12px;height:12px;margin-right:4px;vertical-align:-1px}
.failed{color:#c0392b} pre{background:#f7f7f7;border:1px solid #e5e5e5;padding:6px;overflow-x:auto;white-space:pre-wrap}
.none{color:#666;font-style:italic} .warning{color:#8a6d00}
)";

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%d %H:%M:%S UTC", &tm);
  return text;
}

bool is_throughput(const std::string& tag) {
  return tag.find("samples_per_second") != std::string::npos;
}

// The last finite value, for the caption: what the run ended at.
std::string last_text(const ScalarSeries& series) {
  for (auto it = series.rbegin(); it != series.rend(); ++it) {
    if (std::isfinite(it->second)) {
      return short_number(it->second, 5) + " at step " + std::to_string(it->first);
    }
  }
  return "no finite value";
}

void charts(std::ostream& out, const RunReport& r, bool throughput) {
  std::vector<int64_t> marks;
  for (const auto& c : r.checkpoints) {
    if (c.step >= 0) marks.push_back(c.step);
  }
  int shown = 0;
  out << "<div class=\"charts\">\n";
  for (const auto& tag : r.scalar_order) {
    if (is_throughput(tag) != throughput) continue;
    const ScalarSeries& series = r.scalars.at(tag);
    ++shown;
    out << "<figure class=\"chart-box\" data-tag=\"" << escape_html(tag) << "\"><figcaption>"
        << escape_html(tag) << " <span>" << last_text(series) << ", " << series.size()
        << " points</span></figcaption>\n"
        << line_chart_svg(tag, series, marks) << "</figure>\n";
  }
  out << "</div>\n";
  if (shown == 0) {
    out << "<p class=\"none\">"
        << (throughput ? "Not logged: no tag containing samples_per_second."
                       : "No scalars other than the step-time breakdown were logged.")
        << "</p>\n";
  }
}

void step_time_section(std::ostream& out, const RunReport& r) {
  out << "<section id=\"step-time\"><h2>Step time per rank</h2>\n";
  if (r.step_times.empty()) {
    out << "<p class=\"none\">Not logged: no step_time/rank_&lt;r&gt;/&lt;phase&gt;_ms tags "
           "in this run.</p></section>\n";
    return;
  }
  int stragglers = 0;
  for (const auto& s : r.step_times) stragglers += s.straggler;
  out << "<p>The last logged values of each rank (medians over the steps before them), its "
         "phases stacked; the dashed line is the ranks' median step ("
      << short_number(r.median_rank_step_ms)
      << " ms). A rank whose busy time (its step minus the all-reduce wait, where the others "
         "wait for it) is "
      << short_number(kStragglerThreshold * 100, 3) << "% and "
      << short_number(kStragglerMinExcess.count())
      << " ms or more above the other ranks' is a straggler: <b id=\"straggler-summary\" "
         "data-stragglers=\""
      << stragglers << "\">";
  if (stragglers == 0) {
    out << "none";
  } else {
    const char* sep = "";
    for (const auto& s : r.step_times) {
      if (!s.straggler) continue;
      out << sep << "<span class=\"straggler-marker\" data-rank=\"" << s.rank << "\">rank "
          << s.rank << "</span>";
      sep = ", ";
    }
  }
  out << "</b>.</p>\n<ul class=\"legend\">";
  for (const auto& phase : step_time_phases()) {
    out << "<li data-phase=\"" << phase << "\"><i style=\"background:" << phase_colour(phase)
        << "\"></i>" << phase << "</li>";
  }
  out << "</ul>\n" << step_time_svg(r.step_times, r.median_rank_step_ms) << "\n";
  out << "<table class=\"step-time-table\"><tr><th>rank</th><th>at step</th>";
  for (const auto& phase : step_time_phases()) out << "<th>" << phase << " ms</th>";
  out << "<th>step ms</th><th>run median step ms</th></tr>\n";
  for (const auto& s : r.step_times) {
    out << "<tr" << (s.straggler ? " class=\"straggler\"" : "") << " data-rank=\"" << s.rank
        << "\"><td>" << s.rank << (s.straggler ? " (straggler)" : "") << "</td><td class=\"n\">"
        << s.step << "</td>";
    for (const auto& phase : step_time_phases()) {
      auto it = s.phases.find(phase);
      out << "<td class=\"n\">" << (it == s.phases.end() ? "" : short_number(it->second))
          << "</td>";
    }
    out << "<td class=\"n\">" << short_number(s.step_ms) << "</td><td class=\"n\">"
        << short_number(s.median_step_ms) << "</td></tr>\n";
  }
  out << "</table></section>\n";
}

// Scalar `tag` at `step`, or null when the run did not log it there.
const double* scalar_at(const RunReport& r, const char* tag, int64_t step) {
  const auto series = r.scalars.find(tag);
  if (series == r.scalars.end()) return nullptr;
  const auto point = series->second.find(step);
  return point == series->second.end() ? nullptr : &point->second;
}

// Failed workers replaced in place (accelerant launch --recovery replace_failed_worker), from the
// recovery/* scalars the Accelerator logs at each: the group went on without a restart.
void in_place_recoveries(std::ostream& out, const RunReport& r) {
  const auto generations = r.scalars.find("recovery/generation");
  if (generations == r.scalars.end() || generations->second.empty()) return;
  out << "<p id=\"in-place\" data-recoveries=\"" << generations->second.size() << "\">"
      << generations->second.size()
      << " failed worker(s) replaced in place, the others going on without a restart:</p><ul>\n";
  for (const auto& [step, generation] : generations->second) {
    out << "<li class=\"recovery\" data-step=\"" << step << "\">generation "
        << short_number(generation) << " formed at step " << step;
    if (const double* again = scalar_at(r, "recovery/steps_done_again", step))
      out << ", " << short_number(*again) << " step(s) done again";
    if (const double* seconds = scalar_at(r, "recovery/seconds_to_resume", step))
      out << ", resumed in " << short_number(*seconds) << " s";
    out << "</li>\n";
  }
  out << "</ul>\n";
}

// Elastic membership changes (accelerant launch --num_nodes MIN:MAX), from the membership/*
// scalars the Accelerator logs when it resumes from a checkpoint of another world size.
void membership_changes(std::ostream& out, const RunReport& r) {
  const auto worlds = r.scalars.find("membership/world_size");
  if (worlds == r.scalars.end() || worlds->second.empty()) return;
  out << "<p id=\"membership\" data-changes=\"" << worlds->second.size() << "\">"
      << worlds->second.size()
      << " membership change(s), the run resuming from a checkpoint of another world "
         "size:</p><ul>\n";
  for (const auto& [step, world] : worlds->second) {
    out << "<li class=\"membership-change\" data-step=\"" << step << "\">at step " << step;
    if (const double* saved = scalar_at(r, "membership/saved_world_size", step))
      out << ": " << short_number(*saved) << " process(es) &rarr; " << short_number(world);
    if (const double* accumulation = scalar_at(r, "membership/gradient_accumulation_steps", step))
      out << ", " << short_number(*accumulation) << " micro-batch(es) per step";
    out << "</li>\n";
  }
  out << "</ul>\n";
}

void attempts_section(std::ostream& out, const RunReport& r) {
  const size_t n = r.attempts.size();
  out << "<section id=\"attempts\" data-attempts=\"" << n << "\" data-restarts=\""
      << (n ? n - 1 : 0) << "\"><h2>Restarts and failures</h2>\n";
  in_place_recoveries(out, r);
  membership_changes(out, r);
  if (r.log_dir.empty()) {
    out << "<p class=\"none\">No launcher logs: run with <code>accelerant launch --log_dir "
           "DIR</code> and pass <code>--log_dir DIR</code> (or keep them in RUN_DIR/logs).</p>"
           "</section>\n";
    return;
  }
  out << "<p>From <code>" << escape_html(r.log_dir) << "</code>: " << n
      << " attempt(s), <b id=\"restart-count\">" << (n ? n - 1 : 0)
      << "</b> restart(s). The launcher starts the group again only after a worker failed, so "
         "every attempt but the last failed.</p>\n";
  for (size_t i = 0; i < n; ++i) {
    const Attempt& a = r.attempts[i];
    const bool failed = i + 1 < n;
    out << "<div class=\"attempt\" data-attempt=\"" << a.index << "\" data-failed=\""
        << (failed ? "true" : "false") << "\"><h3" << (failed ? " class=\"failed\"" : "")
        << ">attempt " << a.index << ": " << (failed ? "failed, restarted" : "the last")
        << "</h3>\n";  // no rank count: the relay makes a rank's files only when it prints
    int said = 0;
    for (const auto& log : a.ranks) {
      if (!log.error_message.empty()) {
        ++said;
        out << "<p>rank " << log.rank << "'s error file:</p><pre class=\"error-message\" "
            << "data-rank=\"" << log.rank << "\">" << escape_html(log.error_message) << "</pre>\n";
      }
      if (!log.stderr_tail.empty()) {
        ++said;
        out << "<p>rank " << log.rank << "'s stderr, last lines (<code>"
            << escape_html(log.stderr_path) << "</code>):</p><pre class=\"stderr-tail\" "
            << "data-rank=\"" << log.rank << "\">" << escape_html(log.stderr_tail) << "</pre>\n";
      }
    }
    if (said == 0) out << "<p class=\"none\">No rank wrote to stderr.</p>\n";
    out << "</div>\n";
  }
  out << "</section>\n";
}

void checkpoints_section(std::ostream& out, const RunReport& r) {
  out << "<section id=\"checkpoints\" data-count=\"" << r.checkpoints.size()
      << "\"><h2>Checkpoints</h2>\n";
  if (r.checkpoints_dir.empty()) {
    out << "<p class=\"none\">None found in RUN_DIR, RUN_DIR/checkpoints or "
           "RUN_DIR/../checkpoints; pass <code>--checkpoints DIR</code> if they are "
           "elsewhere.</p></section>\n";
    return;
  }
  out << "<p>In <code>" << escape_html(r.checkpoints_dir)
      << "</code> (their steps are dashed lines on the charts).</p>\n<table><tr><th>name</th>"
         "<th>step</th><th>epoch</th><th>written (UTC)</th><th>size</th><th>state</th></tr>\n";
  for (const auto& c : r.checkpoints) {
    out << "<tr class=\"checkpoint\" data-name=\"" << escape_html(c.name) << "\" data-step=\""
        << c.step << "\"><td>" << escape_html(c.name) << "</td><td class=\"n\">"
        << (c.step >= 0 ? std::to_string(c.step) : "") << "</td><td class=\"n\">"
        << (c.epoch >= 0 ? std::to_string(c.epoch) : "") << "</td><td>" << escape_html(c.created)
        << "</td><td class=\"n\">" << human_bytes(c.bytes) << "</td><td"
        << (c.problem.empty() ? ">complete" : " class=\"failed\">" + escape_html(c.problem))
        << "</td></tr>\n";
  }
  out << "</table></section>\n";
}

void config_section(std::ostream& out, const RunReport& r) {
  out << "<section id=\"config\"><h2>Configuration</h2>\n";
  if (r.config.empty()) {
    out << "<p class=\"none\">No config: init_trackers was given none.</p></section>\n";
    return;
  }
  if (r.tracker_starts > 1) {
    out << "<p>The run was resumed " << r.tracker_starts - 1
        << " time(s); this is the config of its last start.</p>\n";
  }
  out << "<table><tr><th>name</th><th>value</th></tr>\n";
  for (const auto& [name, value] : r.config) {
    out << "<tr class=\"config-row\" data-name=\"" << escape_html(name) << "\"><td>"
        << escape_html(name) << "</td><td>" << escape_html(value) << "</td></tr>\n";
  }
  out << "</table></section>\n";
}

void summary(std::ostream& out, const RunReport& r) {
  int64_t last_step = -1;
  for (const auto& [tag, series] : r.scalars) {
    if (!series.empty()) last_step = std::max(last_step, series.rbegin()->first);
  }
  std::string straggler = "none";
  for (const auto& s : r.step_times) {
    if (s.straggler) straggler = straggler == "none" ? "rank " + std::to_string(s.rank) : "several";
  }
  auto card = [&out](const std::string& id, const std::string& value, const std::string& label) {
    out << "<div class=\"card\" id=\"" << id << "\"><b>" << escape_html(value) << "</b>" << label
        << "</div>";
  };
  out << "<section id=\"summary\" class=\"cards\">";
  card("summary-steps", last_step < 0 ? "-" : std::to_string(last_step), "last step");
  card("summary-tags", std::to_string(r.scalars.size()), "scalar tags");
  card("summary-restarts",
       r.log_dir.empty() ? "-" : std::to_string(r.attempts.empty() ? 0 : r.attempts.size() - 1),
       "restarts");
  card("summary-checkpoints", std::to_string(r.checkpoints.size()), "checkpoints");
  card("summary-straggler", r.step_times.empty() ? "-" : straggler, "straggler");
  out << "</section>\n";
}

}  // namespace

std::string report_html(const RunReport& r) {
  std::ostringstream out;
  out << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n<title>Accelerant "
         "report: "
      << escape_html(r.run_dir) << "</title>\n<style>" << kStyle << "</style></head>\n<body>\n";
  out << "<header><h1>Training run <code>" << escape_html(r.run_dir) << "</code></h1>\n"
      << "<p class=\"meta\">Scalars from <code>" << escape_html(r.scalars_path)
      << "</code>. Written by accelerant " << kVersion << " at " << utc_now() << ".</p></header>\n";
  summary(out, r);
  out << "<section id=\"scalars\"><h2>Loss and metrics</h2>\n";
  charts(out, r, false);
  out << "</section>\n<section id=\"throughput\"><h2>Throughput (samples/s)</h2>\n";
  charts(out, r, true);
  out << "</section>\n";
  step_time_section(out, r);
  attempts_section(out, r);
  checkpoints_section(out, r);
  config_section(out, r);
  if (!r.warnings.empty()) {
    out << "<section id=\"warnings\"><h2>Skipped input</h2><ul>";
    for (const auto& w : r.warnings) out << "<li class=\"warning\">" << escape_html(w) << "</li>";
    out << "</ul></section>\n";
  }
  out << "</body></html>\n";
  return out.str();
}

}  // namespace accelerant::cli
