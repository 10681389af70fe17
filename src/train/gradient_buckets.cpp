#include "accelerant/gradient_buckets.h"

#include "accelerant/error.h"
#include "base/text.h"

namespace accelerant {

std::vector<GradientBucket> plan_buckets(const std::vector<BucketParam>& params,
                                         const BucketPlanOptions& options) {
  if (options.bucket_cap_bytes() < 1 || options.first_bucket_cap_bytes() < 1) {
    throw Error(detail::str("bucket caps must be positive (bucket_cap_bytes ",
                            options.bucket_cap_bytes(), ", first_bucket_cap_bytes ",
                            options.first_bucket_cap_bytes(),
                            "). Fix: give a size in bytes, e.g. 25 MiB = 26214400."));
  }
  std::vector<GradientBucket> done;
  // One bucket being filled per (dtype, device): parameters of another kind do not close it.
  std::vector<GradientBucket> open;
  auto cap = [&] {
    return done.empty() ? options.first_bucket_cap_bytes() : options.bucket_cap_bytes();
  };
  auto close = [&](size_t i) {
    done.push_back(std::move(open[i]));
    open.erase(open.begin() + static_cast<std::ptrdiff_t>(i));
  };
  for (size_t k = params.size(); k-- > 0;) {
    const BucketParam& p = params[k];
    if (!p.requires_grad || p.numel == 0) continue;
    const int64_t element_size = static_cast<int64_t>(c10::elementSize(p.dtype));
    size_t slot = open.size();
    for (size_t i = 0; i < open.size(); ++i) {
      if (open[i].dtype == p.dtype && open[i].device == p.device) slot = i;
    }
    if (slot < open.size() && (open[slot].numel + p.numel) * element_size > cap()) {
      close(slot);
      slot = open.size();
    }
    if (slot == open.size()) {
      GradientBucket fresh;
      fresh.dtype = p.dtype;
      fresh.device = p.device;
      open.push_back(std::move(fresh));
    }
    GradientBucket& b = open[slot];
    b.params.push_back(k);
    b.offsets.push_back(b.numel);
    b.numel += p.numel;
    if (b.numel * element_size >= cap()) close(slot);
  }
  while (!open.empty()) close(0);
  return done;
}

std::vector<GradientBucket> plan_buckets(const std::vector<torch::Tensor>& params,
                                         const BucketPlanOptions& options) {
  std::vector<BucketParam> info;
  info.reserve(params.size());
  for (const auto& t : params) {
    info.push_back({t.numel(), t.scalar_type(), t.device(), t.requires_grad()});
  }
  return plan_buckets(info, options);
}

}  // namespace accelerant
