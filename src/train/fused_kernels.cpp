#include "train/fused_kernels.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>

namespace accelerant::detail {

namespace {

// target_clones: the dynamic loader picks the widest clone this CPU runs, so a Debian build
// (baseline x86-64) still uses AVX-512 or AVX2 where present.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define ACCELERANT_SIMD_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define ACCELERANT_SIMD_CLONES
#endif

// p.mul_(decay); m.mul_(b1).add_(g, 1-b1); v.mul_(b2).addcmul_(g, g, 1-b2);
// p.addcdiv_(m, v.sqrt() / sqrt(bc2) + eps, -step_size)   (AdamW; Adam adds wd * p to g first)
ACCELERANT_SIMD_CLONES
void adam_range(const FusedSegment& s, int64_t begin, int64_t end, bool decoupled) {
  float* __restrict p = s.param;
  const float* __restrict g = s.grad;
  float* __restrict m = s.state1;
  float* __restrict v = s.state2;
  const float decay = s.decay, wd = s.weight_decay, b1 = s.beta1, c1 = s.one_minus_beta1,
              b2 = s.beta2, c2 = s.one_minus_beta2, sbc2 = s.sqrt_bias_correction2, eps = s.eps,
              step = s.neg_step_size;
  if (decoupled) {
    for (int64_t i = begin; i < end; ++i) {
      const float pi = p[i] * decay;
      const float gi = g[i];
      const float mi = m[i] * b1 + gi * c1;
      const float vi = v[i] * b2 + c2 * gi * gi;
      m[i] = mi;
      v[i] = vi;
      p[i] = pi + step * (mi / (std::sqrt(vi) / sbc2 + eps));
    }
  } else {
    for (int64_t i = begin; i < end; ++i) {
      const float pi = p[i];
      const float gi = g[i] + wd * pi;
      const float mi = m[i] * b1 + gi * c1;
      const float vi = v[i] * b2 + c2 * gi * gi;
      m[i] = mi;
      v[i] = vi;
      p[i] = pi + step * (mi / (std::sqrt(vi) / sbc2 + eps));
    }
  }
}

// d = g + wd * p; buf = first ? d : buf * momentum + (1 - dampening) * d;
// d = nesterov ? d + momentum * buf : buf; p += -lr * d      (momentum 0: p += -lr * d)
ACCELERANT_SIMD_CLONES
void sgd_range(const FusedSegment& s, int64_t begin, int64_t end) {
  float* __restrict p = s.param;
  const float* __restrict g = s.grad;
  float* __restrict buf = s.state1;
  const float wd = s.weight_decay, mom = s.momentum, keep = s.one_minus_dampening, lr = s.neg_lr;
  if (mom == 0.0f) {
    for (int64_t i = begin; i < end; ++i) p[i] = p[i] + lr * (g[i] + wd * p[i]);
    return;
  }
  for (int64_t i = begin; i < end; ++i) {
    const float d = g[i] + wd * p[i];
    const float b = s.first_step ? d : buf[i] * mom + keep * d;
    buf[i] = b;
    p[i] = p[i] + lr * (s.nesterov ? d + mom * b : b);
  }
}

void update_range(FusedKind kind, const FusedSegment& s, int64_t begin, int64_t end) {
  switch (kind) {
    case FusedKind::kSGD:
      sgd_range(s, begin, end);
      break;
    case FusedKind::kAdam:
      adam_range(s, begin, end, false);
      break;
    case FusedKind::kAdamW:
      adam_range(s, begin, end, true);
      break;
  }
}

}  // namespace

void run_fused_update(FusedKind kind, const std::vector<FusedSegment>& segments) {
  // Elements are numbered across all segments; each thread takes a contiguous range of them,
  // so a model of many small tensors parallelises as well as one of a few large ones.
  std::vector<int64_t> starts(segments.size() + 1, 0);
  for (size_t k = 0; k < segments.size(); ++k) starts[k + 1] = starts[k] + segments[k].numel;
  const int64_t total = starts.back();
  if (total == 0) return;
  constexpr int64_t kGrain = 1 << 15;  // below this, a thread costs more than it saves
  at::parallel_for(0, total, kGrain, [&](int64_t begin, int64_t end) {
    size_t k = static_cast<size_t>(std::upper_bound(starts.begin(), starts.end(), begin) -
                                   starts.begin()) -
               1;
    for (; k < segments.size() && starts[k] < end; ++k) {
      const int64_t lo = std::max(begin, starts[k]) - starts[k];
      const int64_t hi = std::min(end, starts[k + 1]) - starts[k];
      if (lo < hi) update_range(kind, segments[k], lo, hi);
    }
  });
}

}  // namespace accelerant::detail
