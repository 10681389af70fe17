#include "accelerant/lr_schedule.h"

#include <cmath>

#include "accelerant/error.h"
#include "base/text.h"

namespace accelerant {
namespace {

constexpr double kPi = 3.14159265358979323846;

using Segment = LrSchedule::Segment;

void check_steps(const char* what, int64_t steps, int64_t minimum) {
  if (steps < minimum) {
    throw Error(detail::str("LrSchedule::", what, "(", steps, "): a segment needs at least ",
                            minimum, " step", minimum == 1 ? "" : "s",
                            ". Fix: pass the number of optimizer steps it should last."));
  }
}

// The factor `s` steps into `segment` (s >= 0; past its end, its final value).
double segment_factor(const Segment& segment, int64_t s) {
  if (s >= segment.steps) return segment.to;
  const double t = static_cast<double>(s) / static_cast<double>(segment.steps);
  switch (segment.shape) {
    case Segment::Shape::kConstant:
      return segment.from;
    case Segment::Shape::kWarmup:
      return static_cast<double>(s + 1) / static_cast<double>(segment.steps + 1);
    case Segment::Shape::kLinear:
      return segment.from + (segment.to - segment.from) * t;
    case Segment::Shape::kCosine:
      return segment.to + (segment.from - segment.to) * 0.5 * (1.0 + std::cos(kPi * t));
  }
  return segment.to;
}

}  // namespace

LrSchedule LrSchedule::constant(double factor, int64_t steps) {
  check_steps("constant", steps, 0);
  return LrSchedule({{Segment::Shape::kConstant, steps, factor, factor}});
}

LrSchedule LrSchedule::warmup(int64_t steps) {
  check_steps("warmup", steps, 0);
  return LrSchedule({{Segment::Shape::kWarmup, steps, 1.0 / static_cast<double>(steps + 1), 1.0}});
}

LrSchedule LrSchedule::linear(int64_t steps, double to, double from) {
  check_steps("linear", steps, 1);
  return LrSchedule({{Segment::Shape::kLinear, steps, from, to}});
}

LrSchedule LrSchedule::cosine(int64_t steps, double to, double from) {
  check_steps("cosine", steps, 1);
  return LrSchedule({{Segment::Shape::kCosine, steps, from, to}});
}

LrSchedule LrSchedule::then(const LrSchedule& next) const {
  std::vector<Segment> all = segments_;
  all.insert(all.end(), next.segments_.begin(), next.segments_.end());
  return LrSchedule(std::move(all));
}

double LrSchedule::factor(int64_t step) const {
  if (step < 0) {
    throw Error(detail::str("LrSchedule::factor(", step,
                            "): optimizer steps count from 0. Fix: pass the step's index."));
  }
  if (segments_.empty()) return 1.0;
  int64_t start = 0;
  for (const auto& segment : segments_) {
    if (step < start + segment.steps) return segment_factor(segment, step - start);
    start += segment.steps;
  }
  return segments_.back().to;  // past the end: the last segment's final value holds
}

int64_t LrSchedule::steps() const {
  int64_t total = 0;
  for (const auto& segment : segments_) total += segment.steps;
  return total;
}

std::string LrSchedule::describe() const {
  if (segments_.empty()) return "constant 1";
  std::vector<std::string> parts;
  for (const auto& segment : segments_) {
    switch (segment.shape) {
      case Segment::Shape::kConstant:
        parts.push_back(detail::str("constant ", segment.from, " for ", segment.steps));
        break;
      case Segment::Shape::kWarmup:
        parts.push_back(detail::str("warmup ", segment.steps));
        break;
      case Segment::Shape::kLinear:
        parts.push_back(
            detail::str("linear ", segment.steps, " from ", segment.from, " to ", segment.to));
        break;
      case Segment::Shape::kCosine:
        parts.push_back(
            detail::str("cosine ", segment.steps, " from ", segment.from, " to ", segment.to));
        break;
    }
  }
  return detail::join(parts, ", then ");
}

ScheduledLR::ScheduledLR(torch::optim::Optimizer& optimizer, LrSchedule schedule)
    : torch::optim::LRScheduler(optimizer), optimizer_(&optimizer), schedule_(std::move(schedule)) {
  // LibTorch 1.13's LRScheduler leaves its step count uninitialised: the schedule's state.
  step_count_ = 0;
  for (auto& group : optimizer.param_groups()) {
    try {
      base_lrs_.push_back(group.options().get_lr());
    } catch (const std::exception& e) {
      throw Error(detail::str(
          "ScheduledLR: the optimizer's parameter group options have no learning rate (", e.what(),
          "). Fix: schedule an optimizer whose options have lr() (SGD, Adam, AdamW, Adagrad, "
          "RMSprop, LBFGS)."));
    }
  }
  // The rates of step 0 hold from now, before the first update.
  for (size_t g = 0; g < base_lrs_.size(); ++g)
    optimizer.param_groups()[g].options().set_lr(lr_at(0, g));
}

double ScheduledLR::lr_at(int64_t step, size_t group) const {
  if (group >= base_lrs_.size()) {
    throw Error(detail::str("ScheduledLR::lr_at: group ", group, " of ", base_lrs_.size(),
                            ". Fix: pass a parameter group index the optimizer had when the "
                            "scheduler was made."));
  }
  return base_lrs_[group] * schedule_.factor(step);
}

std::vector<double> ScheduledLR::get_lrs() {
  if (optimizer_->param_groups().size() != base_lrs_.size()) {
    throw Error(detail::str(
        "ScheduledLR: the optimizer has ", optimizer_->param_groups().size(),
        " parameter groups, the scheduler was made over ", base_lrs_.size(),
        ". Likely cause: add_param_group after the scheduler was made. Fix: make the scheduler "
        "after the last add_param_group."));
  }
  std::vector<double> lrs;
  for (size_t g = 0; g < base_lrs_.size(); ++g)
    lrs.push_back(lr_at(static_cast<int64_t>(step_count_) + 1, g));
  return lrs;
}

}  // namespace accelerant
