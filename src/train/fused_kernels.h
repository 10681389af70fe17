// The CPU loops of the fused optimizers: every parameter's update in one pass through its
// parameter, gradient and state memory, vectorised by the compiler (one clone per instruction
// set, picked at load time) and split across LibTorch's intra-op threads.
//
// The arithmetic follows torch::optim's C++ implementations operation by operation (same order,
// fp32), so results agree within rounding (fused multiply-adds are the only difference).
#pragma once
#include <cstdint>
#include <vector>

namespace accelerant::detail {

enum class FusedKind { kSGD, kAdam, kAdamW };

/// One parameter's memory and this step's constants, computed on the host in double as
/// torch::optim does and rounded to float as its kernels do.
struct FusedSegment {
  float* param = nullptr;
  const float* grad = nullptr;
  float* state1 = nullptr;  ///< Adam: exp_avg; SGD: momentum buffer
  float* state2 = nullptr;  ///< Adam: exp_avg_sq; SGD: unused
  int64_t numel = 0;
  // Adam / AdamW
  float decay = 1;         ///< AdamW: 1 - lr * weight_decay
  float weight_decay = 0;  ///< Adam and SGD: added to the gradient as weight_decay * param
  float beta1 = 0, one_minus_beta1 = 0, beta2 = 0, one_minus_beta2 = 0;
  float sqrt_bias_correction2 = 1, eps = 0, neg_step_size = 0;
  // SGD
  float momentum = 0, one_minus_dampening = 1, neg_lr = 0;
  bool nesterov = false;
  bool first_step = false;  ///< SGD: the momentum buffer starts as the gradient
};

/// Applies `kind`'s update to every segment, in parallel over their elements.
void run_fused_update(FusedKind kind, const std::vector<FusedSegment>& segments);

}  // namespace accelerant::detail
