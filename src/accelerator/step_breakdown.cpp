#include "accelerator/step_breakdown.h"

#include <algorithm>
#include <cstdio>
#include <iostream>

#include "accelerant/communicator.h"
#include "base/text.h"
#include "comm/collective_label.h"

namespace accelerant::detail {
namespace {

double ms(double seconds) { return seconds * 1e3; }

std::string fixed1(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f", value);
  return text;
}

}  // namespace

namespace {

// The median of every rank's value but `rank`'s: what the others take. Against the median of all
// ranks, a rank of two would have to be 50 % slower than the other to be 20 % above.
double others_median(const std::vector<StepTime>& ranks, int rank,
                     const std::function<double(const StepTime&)>& value) {
  std::vector<double> values;
  for (size_t r = 0; r < ranks.size(); ++r)
    if (static_cast<int>(r) != rank) values.push_back(value(ranks[r]));
  return median_of(std::move(values));
}

double busy(const StepTime& t) { return t.busy(); }

}  // namespace

int find_straggler(const std::vector<StepTime>& ranks) {
  if (ranks.size() < 2) return -1;
  int slowest = 0;
  for (size_t r = 1; r < ranks.size(); ++r)
    if (ranks[r].busy() > ranks[slowest].busy()) slowest = static_cast<int>(r);
  const double typical = others_median(ranks, slowest, busy);
  const double excess = ranks[slowest].busy() - typical;
  const double min_excess = std::chrono::duration<double>(kStragglerMinExcess).count();
  if (typical <= 0 || excess < typical * kStragglerThreshold || excess < min_excess) return -1;
  return slowest;
}

int StragglerWarnings::observe(int found) {
  in_a_row_ = found >= 0 && found == candidate_ ? in_a_row_ + 1 : (found >= 0 ? 1 : 0);
  candidate_ = found;
  if (found < 0 || in_a_row_ < kStragglerExchangesToWarn) return -1;
  return named_.insert(found).second ? found : -1;
}

std::string describe_straggler(const std::vector<StepTime>& ranks, int straggler) {
  const StepTime& slow = ranks[straggler];
  const double typical_busy = others_median(ranks, straggler, busy);
  // The phase where the straggler spends the most time beyond the others' median of that phase.
  struct Part {
    StepPhase phase;
    const char* what;
  };
  const Part parts[] = {{StepPhase::data, "waiting for data (its loader is slower)"},
                        {StepPhase::forward_backward, "compute (forward and backward)"},
                        {StepPhase::optimizer, "the optimizer step"},
                        {StepPhase::other, "its own code between steps"}};
  const Part* worst = &parts[1];
  double worst_excess = -1, worst_median = 0;
  for (const Part& part : parts) {
    const int p = static_cast<int>(part.phase);
    const double typical =
        others_median(ranks, straggler, [p](const StepTime& t) { return t.phase[p]; });
    const double excess = slow.phase[p] - typical;
    if (excess > worst_excess) {
      worst = &part;
      worst_excess = excess;
      worst_median = typical;
    }
  }
  return str("rank ", straggler, " is ",
             static_cast<int>((slow.busy() / typical_busy - 1) * 100 + 0.5),
             "% slower than the median of the other ranks (busy ", fixed1(ms(slow.busy())),
             " ms per step vs ", fixed1(ms(typical_busy)),
             " ms; they wait for it in the all-reduce). Most of the difference is ", worst->what,
             ": ", fixed1(ms(slow.phase[static_cast<int>(worst->phase)])), " ms vs ",
             fixed1(ms(worst_median)), " ms.");
}

TrackerScalars step_time_scalars(const std::vector<StepTime>& ranks, int straggler) {
  TrackerScalars scalars;
  for (size_t r = 0; r < ranks.size(); ++r) {
    const std::string prefix = str("step_time/rank_", r, "/");
    for (int p = 0; p < kStepPhases; ++p) {
      scalars.emplace_back(prefix + step_phase_name(static_cast<StepPhase>(p)) + "_ms",
                           ms(ranks[r].phase[p]));
    }
    scalars.emplace_back(prefix + "step_ms", ms(ranks[r].step));
  }
  scalars.emplace_back("step_time/straggler", straggler);
  return scalars;
}

StepBreakdown::StepBreakdown(int64_t every, Hooks hooks) : every_(every), hooks_(std::move(hooks)) {
  window_.reserve(static_cast<size_t>(every_));
  set_step_time_listener(this, [this](const StepTime& step) { on_step(step); });
}

StepBreakdown::~StepBreakdown() { remove_step_time_listener(this); }

void StepBreakdown::on_step(const StepTime& step) {
  window_.push_back(step);
  // At optimizer steps every, 2 every, ...: the tags land on the steps a user's own logging
  // counts (the first window is one step short, since the first step has no known start). The
  // count is the same on every rank, so all of them meet in the exchange; an fp16 step skipped
  // at a multiple leaves the count there, and the window then waits for the next multiple.
  const int64_t at = hooks_.optimizer_step();
  if (at % every_ == 0 && at != last_exchange_at_) exchange();
}

void StepBreakdown::exchange() {
  const StepTime mine = median_step_time(window_);
  const int64_t steps = static_cast<int64_t>(window_.size());
  window_.clear();
  std::vector<StepTime> ranks(static_cast<size_t>(hooks_.world));
  if (hooks_.world > 1) {
    // Every rank fills its own row; a sum of the rows is the table (an all-gather of 6 numbers
    // per rank, through the collective every backend has).
    torch::Tensor table = torch::zeros({hooks_.world, kStepTimeFields}, torch::kFloat64);
    auto row = table.accessor<double, 2>()[hooks_.rank];
    for (int f = 0; f < kStepTimeFields; ++f) row[f] = step_time_field(mine, f);
    ScopedCollectiveLabel label("step-time breakdown");
    try {
      hooks_.communicator().all_reduce_(table);
    } catch (const std::exception&) {
      // A process died after this step's backward (in-place recovery): the step is whole on
      // every survivor, and the next step's backward, which the broken group refuses, forms the
      // group again. Only this window's diagnosis is lost.
      if (!hooks_.recovers_in_place || !hooks_.recovers_in_place()) throw;
      last_exchange_at_ = hooks_.optimizer_step();
      return;
    }
    auto rows = table.accessor<double, 2>();
    for (int r = 0; r < hooks_.world; ++r)
      for (int f = 0; f < kStepTimeFields; ++f) set_step_time_field(ranks[r], f, rows[r][f]);
  } else {
    ranks[0] = mine;
  }
  const int64_t at = hooks_.optimizer_step();
  last_exchange_at_ = at;
  const int straggler = find_straggler(ranks);
  if (warnings_.observe(straggler) >= 0 && hooks_.rank == 0) {
    std::cerr << hooks_.rank_prefix
              << "accelerant: warning: " << describe_straggler(ranks, straggler)
              << " (the slowest at the last " << kStragglerExchangesToWarn
              << " step-time exchanges, the latest over steps " << at - steps + 1 << "-" << at
              << "; reported once per rank; docs/observability.md)\n";
  }
  set_rank_step_times({at, steps, ranks, straggler});
  hooks_.log(step_time_scalars(ranks, straggler), at);
}

}  // namespace accelerant::detail
