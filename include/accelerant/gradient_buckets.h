// How gradients are grouped for the all-reduce that runs during backward: a pure planning step,
// separate from the reducer so that it can be tested alone (as c10d does).
//
// Gradients become ready roughly in reverse order of the parameters (the last layer's first), so
// buckets are filled in reverse parameter order: the first bucket fills, and its all-reduce can
// start, while backward is still working on earlier layers. The first bucket is kept small so
// that communication starts early. A bucket is one flat buffer, so it never mixes dtypes or
// devices; frozen parameters (requires_grad false) get no bucket.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <vector>

#include "accelerant/options.h"

namespace accelerant {

/// How large plan_buckets() makes the buckets.
struct BucketPlanOptions {
  /// Largest bucket in bytes; a single larger parameter gets a bucket of its own.
  /// Default: 25 MiB (c10d's default).
  ACCELERANT_OPTION(int64_t, bucket_cap_bytes) = 25 * 1024 * 1024;
  /// Largest first bucket in bytes, so that the first all-reduce starts early. Default: 1 MiB.
  ACCELERANT_OPTION(int64_t, first_bucket_cap_bytes) = 1024 * 1024;
};

/// What the planner needs to know about one parameter.
struct BucketParam {
  int64_t numel = 0;                        ///< elements
  torch::ScalarType dtype = torch::kFloat;  ///< its gradient's dtype, which its bucket shares
  torch::Device device = torch::kCPU;       ///< where it lives, which its bucket shares
  bool requires_grad = true;                ///< false for a frozen parameter, which gets no bucket
};

/// One bucket of the plan: a flat buffer of one dtype on one device that holds the gradients of
/// `params` side by side and is all-reduced as one tensor.
struct GradientBucket {
  std::vector<size_t> params;    ///< indices into the parameter list, in the order they are packed
  std::vector<int64_t> offsets;  ///< element offset of each parameter in the flat buffer
  int64_t numel = 0;             ///< elements in the flat buffer
  torch::ScalarType dtype = torch::kFloat;  ///< the buffer's dtype, that of every parameter in it
  torch::Device device = torch::kCPU;       ///< the buffer's device, that of every parameter in it
};

/// Groups the trainable parameters into buckets (see the file comment for the rules).
std::vector<GradientBucket> plan_buckets(const std::vector<BucketParam>& params,
                                         const BucketPlanOptions& options = {});

/// plan_buckets over tensors (e.g. module->parameters()).
std::vector<GradientBucket> plan_buckets(const std::vector<torch::Tensor>& params,
                                         const BucketPlanOptions& options = {});

}  // namespace accelerant
