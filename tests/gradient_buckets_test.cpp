// Table tests for the gradient bucket plan: reverse order, caps, homogeneous buckets, frozen
// parameters left out, every trainable parameter exactly once.
#include <accelerant/error.h>
#include <accelerant/gradient_buckets.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>

using namespace accelerant;

namespace {

constexpr int64_t kMiB = 1024 * 1024;
constexpr int64_t kFloatsPerMiB = kMiB / 4;

BucketParam floats(int64_t numel, bool trainable = true) {
  return {numel, torch::kFloat, torch::kCPU, trainable};
}

std::vector<std::vector<size_t>> members(const std::vector<GradientBucket>& buckets) {
  std::vector<std::vector<size_t>> out;
  for (const auto& b : buckets) out.push_back(b.params);
  return out;
}

}  // namespace

TEST(GradientBuckets, ReverseOrderSmallFirstBucketThenCapped) {
  std::vector<BucketParam> params(6, floats(kFloatsPerMiB));
  auto buckets = plan_buckets(
      params, BucketPlanOptions().bucket_cap_bytes(3 * kMiB).first_bucket_cap_bytes(kMiB));
  EXPECT_EQ(members(buckets), (std::vector<std::vector<size_t>>{{5}, {4, 3, 2}, {1, 0}}));
  EXPECT_EQ(buckets[1].offsets, (std::vector<int64_t>{0, kFloatsPerMiB, 2 * kFloatsPerMiB}));
  EXPECT_EQ(buckets[1].numel, 3 * kFloatsPerMiB);
}

TEST(GradientBuckets, AParameterLargerThanTheCapGetsItsOwnBucket) {
  std::vector<BucketParam> params{floats(10), floats(10 * kFloatsPerMiB), floats(10)};
  auto buckets =
      plan_buckets(params, BucketPlanOptions().bucket_cap_bytes(kMiB).first_bucket_cap_bytes(kMiB));
  EXPECT_EQ(members(buckets), (std::vector<std::vector<size_t>>{{2}, {1}, {0}}));
  auto alone =
      plan_buckets({floats(10 * kFloatsPerMiB), floats(10)},
                   BucketPlanOptions().bucket_cap_bytes(kMiB).first_bucket_cap_bytes(kMiB));
  EXPECT_EQ(members(alone), (std::vector<std::vector<size_t>>{{1}, {0}}));  // never shares
}

TEST(GradientBuckets, FrozenAndEmptyParametersAreLeftOutAndTheRestAppearOnce) {
  std::vector<BucketParam> params;
  for (int i = 0; i < 50; ++i) params.push_back(floats(1000 + i * 997, /*trainable=*/i % 7 != 0));
  params.push_back(floats(0));
  auto buckets = plan_buckets(
      params, BucketPlanOptions().bucket_cap_bytes(64 * 1024).first_bucket_cap_bytes(8 * 1024));
  std::vector<size_t> seen;
  for (const auto& b : buckets) {
    int64_t expected_offset = 0;
    for (size_t i = 0; i < b.params.size(); ++i) {
      EXPECT_EQ(b.offsets[i], expected_offset);
      expected_offset += params[b.params[i]].numel;
      seen.push_back(b.params[i]);
    }
    EXPECT_EQ(b.numel, expected_offset);
  }
  std::vector<size_t> trainable;
  for (size_t i = 0; i < 50; ++i)
    if (i % 7 != 0) trainable.push_back(i);
  std::sort(seen.begin(), seen.end());
  EXPECT_EQ(seen, trainable);
}

TEST(GradientBuckets, BucketsNeverMixDtypes) {
  std::vector<BucketParam> params;
  for (int i = 0; i < 8; ++i) {
    params.push_back({100, i % 2 ? torch::kBFloat16 : torch::kFloat, torch::kCPU, true});
  }
  auto buckets = plan_buckets(params);
  ASSERT_EQ(buckets.size(), 2u);
  for (const auto& b : buckets) {
    for (size_t k : b.params) EXPECT_EQ(params[k].dtype, b.dtype);
  }
}

TEST(GradientBuckets, FromModuleParameters) {
  torch::nn::Sequential net(torch::nn::Linear(4, 8), torch::nn::ReLU(), torch::nn::Linear(8, 2));
  auto params = net->parameters();
  params[0].requires_grad_(false);  // a frozen first weight
  auto buckets = plan_buckets(params);
  ASSERT_EQ(buckets.size(), 1u);
  EXPECT_EQ(buckets[0].params, (std::vector<size_t>{3, 2, 1}));
  EXPECT_EQ(buckets[0].numel, 2 + 16 + 8);
}

TEST(GradientBuckets, NonPositiveCapsAreErrors) {
  EXPECT_THROW(plan_buckets({floats(1)}, BucketPlanOptions().bucket_cap_bytes(0)), Error);
}
