// Loss scaling for fp16 training: the loss is multiplied by a large factor so that small
// gradients survive fp16, gradients are divided by it before the optimizer step, and a step whose
// gradients overflowed is skipped while the factor shrinks. LibTorch has no C++ GradScaler.
//
//   accelerant::GradScaler scaler;
//   scaler.scale(loss).backward();
//   scaler.step(optimizer);   // unscales, skips the step if a gradient is inf or nan
//   scaler.update();          // adapts the scale
//
// Found-inf detection and the scale update are tensor operations on the gradients' device: no
// host synchronisation. step() with a torch::optim optimizer reads the flag on the host, once,
// to decide whether to call optimizer.step(); with a FusedUpdater (fused_optimizer.h) the
// decision stays on the device, and step_on_device() reads nothing at all (graph mode).
// PreparedOptimizer picks the entry point once, at construction.
#pragma once

#include <torch/optim/optimizer.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>
#include <torch/types.h>

#include <memory>
#include <vector>

#include "accelerant/options.h"

namespace accelerant {

class Communicator;
class FusedUpdater;

/// How a GradScaler scales; the defaults are PyTorch's GradScaler's. The GradScaler constructor
/// throws Error unless init_scale > 0, growth_factor > 1, 0 < backoff_factor < 1 and
/// growth_interval >= 1.
struct GradScalerOptions {
  /// The scale of the first step. Default: 65536 (2^16).
  ACCELERANT_OPTION(double, init_scale) = 65536.0;
  /// Factor applied after growth_interval steps without overflow. Default: 2.
  ACCELERANT_OPTION(double, growth_factor) = 2.0;
  /// Factor applied after an overflow. Default: 0.5.
  ACCELERANT_OPTION(double, backoff_factor) = 0.5;
  /// Steps without overflow before the scale grows. Default: 2000.
  ACCELERANT_OPTION(int64_t, growth_interval) = 2000;
  /// When false every call passes through unchanged (no scaling). Default: true.
  ACCELERANT_OPTION(bool, enabled) = true;
};

/// Dynamic loss scaling for fp16 training (see the file comment). The Accelerator makes one under
/// mixed_precision fp16 (TrainingState::scaler), which PreparedOptimizer drives; it is usable
/// alone. Its state is 0-dim tensors on one device.
class GradScaler {
 public:
  /// A scaler whose state lives on `device`, the gradients' device, starting at
  /// options.init_scale(). Throws Error for options out of range (see GradScalerOptions).
  explicit GradScaler(GradScalerOptions options = {}, torch::Device device = torch::kCPU);
  ~GradScaler();
  /// A scaler over the same state tensors (updated in place, so steps through either show in
  /// both), with its own copy of the options and of whether this step was unscaled.
  GradScaler(const GradScaler& other);
  /// Makes this scaler a copy of `other` (see the copy constructor).
  GradScaler& operator=(const GradScaler& other);
  /// Takes over the moved-from scaler's state; that one must not be used afterwards.
  GradScaler(GradScaler&&) noexcept;
  /// Takes over the moved-from scaler's state; that one must not be used afterwards.
  GradScaler& operator=(GradScaler&&) noexcept;

  /// loss * scale (the loss itself when disabled).
  torch::Tensor scale(const torch::Tensor& loss) const;
  /// Divides the gradients of `params` by the scale and records whether any is inf or nan.
  /// Called by step() unless already called this step (e.g. before gradient clipping).
  void unscale_(const std::vector<torch::Tensor>& params);
  /// unscale_ over the parameters of every parameter group of `optimizer`. Throws Error when
  /// called twice in one step (between update() calls).
  void unscale_(torch::optim::Optimizer& optimizer);
  /// unscale_ for gradients sharded across processes (ZeRO stage 2): `shares` are this process's
  /// (GradientReducer::gradient_shares()). Divides them by the scale, then makes found_inf the
  /// maximum over `communicator`: an inf or nan in any process's share skips the step on every
  /// process, as it would with whole gradients. A collective: every process calls it once per
  /// step. Throws Error when called twice in one step, or inside a graph step (the agreement is
  /// a collective that no capture holds).
  void unscale_shares_(const std::vector<torch::Tensor>& shares, Communicator& communicator);
  /// Whether the gradients were unscaled this step (by unscale_ or unscale_shares_); update()
  /// starts a new step.
  bool unscaled() const;
  /// Unscales if needed, then runs optimizer.step() unless a gradient overflowed. Returns whether
  /// it stepped. The skip decision is read on the host, whatever the optimizer: a FusedSGD /
  /// FusedAdam / FusedAdamW passed here is stepped as any torch::optim optimizer (same result).
  /// To keep the decision on the device, pass its updater: step(optimizer.updater()).
  bool step(torch::optim::Optimizer& optimizer);
  /// The same for a fused update: the skip decision stays on the device (step_unless); the
  /// returned flag is read after the step was queued.
  bool step(FusedUpdater& updater);
  /// Queues the fused update with the skip decision on the device and reads nothing on the
  /// host: what a captured step (GraphStep) needs. found_inf() tells, until update(), whether
  /// this step is skipped.
  void step_on_device(FusedUpdater& updater);
  /// Shrinks the scale after an overflow, grows it after growth_interval clean steps, and resets
  /// the per-step state. Call once per optimizer step, after step().
  void update();

  /// 1.0 when the current step's gradients overflowed, else 0.0: a 0-dim tensor on the device,
  /// reset by update(). The scaler's state tensors are updated in place: these references stay
  /// valid, and a captured step keeps reading and writing them.
  const torch::Tensor& found_inf() const;
  /// The current scale: a 0-dim float tensor on the device.
  const torch::Tensor& scale_tensor() const;
  /// The current scale (reads it from the device).
  double current_scale() const;
  /// GradScalerOptions::enabled: when false every call passes through unchanged.
  bool enabled() const;

  /// The scale and the count of clean steps since it last changed (what a checkpoint keeps).
  void save(torch::serialize::OutputArchive& archive) const;
  /// Restores what save() wrote, onto this scaler's device, and starts a fresh step (no overflow
  /// recorded, nothing unscaled). Throws c10::Error when `archive` lacks the entries.
  void load(torch::serialize::InputArchive& archive);

 private:
  struct Impl;  // src/train/grad_scaler.cpp: the options and the 0-dim state tensors
  std::unique_ptr<Impl> impl_;
};

}  // namespace accelerant
