// Learning-rate schedules counted in optimizer steps: warmup, cosine, linear and constant
// segments, composed one after another, and a torch::optim scheduler that applies one.
//
//   // nanoGPT's: 100 warmup steps, then cosine from lr to lr/10 until step 2000, then lr/10.
//   auto schedule = accelerant::LrSchedule::warmup(100).then(
//       accelerant::LrSchedule::cosine(1900, 0.1));
//   accelerant::ScheduledLR scheduler(optimizer, schedule);
//   auto [opt, sched] = accelerator.prepare(optimizer, scheduler);
//   ... opt.step(); sched.step();     // the lr of the next optimizer step is set
//
// A schedule is a factor of each parameter group's base learning rate (the lr the group had when
// the ScheduledLR was made) as a pure function of the optimizer step, so that it needs no state
// of its own: the step count is the state. Prepared by the Accelerator it advances only on steps
// the optimizer really took (not on accumulating micro-steps, not on fp16 steps skipped for
// overflow), and save_state / load_state keep the count and the groups' learning rates, so a
// resumed run continues at the step it stopped at.
#pragma once
#include <torch/optim/optimizer.h>
#include <torch/optim/schedulers/lr_scheduler.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace accelerant {

/// A learning-rate factor per optimizer step: a sequence of segments, each lasting a number of
/// steps; past the end the last segment's final value holds. Copyable value; see the file
/// comment.
class LrSchedule {
 public:
  /// Factor 1 at every step (a schedule that changes nothing).
  LrSchedule() = default;

  /// `factor` for `steps` steps (as the last segment: from then on). Throws Error for steps < 0.
  static LrSchedule constant(double factor, int64_t steps = 0);
  /// Linear warmup over `steps` steps: step s < steps has factor (s + 1) / (steps + 1), so that
  /// no step runs at learning rate 0 and step `steps` is the first at full rate (nanoGPT's
  /// warmup); 0 steps is no warmup. Throws Error for steps < 0.
  static LrSchedule warmup(int64_t steps);
  /// Linear from `from` to `to` over `steps` steps: step s has from + (to - from) * s / steps,
  /// and `to` once s >= steps. Throws Error for steps < 1.
  static LrSchedule linear(int64_t steps, double to, double from = 1.0);
  /// Half a cosine from `from` to `to` over `steps` steps: step s has
  /// to + (from - to) * (1 + cos(pi * s / steps)) / 2, and `to` once s >= steps. Throws Error
  /// for steps < 1.
  static LrSchedule cosine(int64_t steps, double to, double from = 1.0);

  /// This schedule for its steps(), then `next` (whose step 0 follows this one's last step).
  LrSchedule then(const LrSchedule& next) const;

  /// The factor at optimizer step `step` (0 = the first update). Throws Error for step < 0.
  double factor(int64_t step) const;
  /// Steps until the last segment ends (its final value holds after that).
  int64_t steps() const;
  /// The segments in words, e.g. "warmup 100, then cosine 1900 from 1 to 0.1", for logs.
  std::string describe() const;

  /// One segment; the schedule is a list of them (see the factory functions).
  struct Segment {
    /// How the factor moves within the segment.
    enum class Shape { kConstant, kWarmup, kLinear, kCosine };
    Shape shape = Shape::kConstant;  ///< the curve
    int64_t steps = 0;               ///< its length
    double from = 1.0;               ///< factor at its first step (kLinear, kCosine, kConstant)
    double to = 1.0;                 ///< factor from its end on
  };
  /// The segments in order (empty: factor 1 throughout).
  const std::vector<Segment>& segments() const { return segments_; }

 private:
  explicit LrSchedule(std::vector<Segment> segments) : segments_(std::move(segments)) {}
  std::vector<Segment> segments_;
};

/// A torch::optim scheduler that sets every parameter group's learning rate to its base rate
/// times an LrSchedule's factor. Made, it sets the rates of step 0; each step() (one per
/// optimizer update: prepare it, or call it after each real update) sets those of the next
/// step. Its step count is the only state (the base rates are read from the optimizer when it
/// is made), which save_state / load_state keep.
class ScheduledLR : public torch::optim::LRScheduler {
 public:
  /// Over `optimizer` (which must outlive it); the groups' learning rates now are the base
  /// rates, and those of step 0 are set at once. Throws Error when the optimizer's options have
  /// no learning rate (OptimizerOptions::get_lr throws).
  ScheduledLR(torch::optim::Optimizer& optimizer, LrSchedule schedule);

  /// Optimizer steps this scheduler has followed (the step whose rates are set now).
  int64_t step_count() const { return static_cast<int64_t>(step_count_); }
  /// The schedule it applies.
  const LrSchedule& schedule() const { return schedule_; }
  /// The learning rate of parameter group `group` at optimizer step `step`.
  double lr_at(int64_t step, size_t group = 0) const;
  /// The base learning rate of each parameter group.
  const std::vector<double>& base_lrs() const { return base_lrs_; }

 protected:
  /// The rates of the step after the one step_count() counts (LRScheduler::step's contract:
  /// called before the count advances).
  std::vector<double> get_lrs() override;

 private:
  torch::optim::Optimizer* optimizer_;
  LrSchedule schedule_;
  std::vector<double> base_lrs_;
};

}  // namespace accelerant
