#include "accelerant/evaluation.h"

#include <limits>

#include "accelerant/error.h"
#include "base/text.h"

namespace accelerant {

void MeanMetrics::add(const std::string& name, const torch::Tensor& mean, double weight) {
  if (!mean.defined() || mean.numel() != 1) {
    throw Error(detail::str(
        "MeanMetrics::add(\"", name, "\"): needs one value; got ",
        mean.defined() ? c10::str("a tensor of shape ", mean.sizes()) : "an undefined tensor",
        ". Fix: reduce it first (e.g. loss.mean()) and pass how many items it averages."));
  }
  add_sum(name, mean.detach() * weight, weight);
}

void MeanMetrics::add_sum(const std::string& name, const torch::Tensor& sum, double weight) {
  if (name.empty() || !(weight >= 0) || !sum.defined() || sum.numel() != 1) {
    throw Error(detail::str("MeanMetrics: metric \"", name, "\" with weight ", weight,
                            sum.defined() ? "" : " and an undefined value",
                            ": a metric needs a name, one value and a weight >= 0. Fix: e.g. "
                            "metrics.add(\"val/loss\", loss, targets.numel())."));
  }
  const torch::Tensor value = sum.detach().reshape({}).to(torch::kDouble);
  auto found = sums_.find(name);
  if (found == sums_.end()) {
    sums_.emplace(name, value.clone());
    weights_[name] = weight;
  } else {
    found->second.add_(value.to(found->second.device()));
    weights_[name] += weight;
  }
}

std::vector<std::string> MeanMetrics::names() const {
  std::vector<std::string> names;
  for (const auto& item : sums_) names.push_back(item.first);
  return names;
}

std::map<std::string, double> MeanMetrics::local_means() const { return means_of(packed()); }

torch::Tensor MeanMetrics::packed() const {
  if (sums_.empty()) return torch::zeros({0}, torch::kDouble);
  const torch::Device device = sums_.begin()->second.device();
  std::vector<torch::Tensor> parts;
  for (const auto& item : sums_) {
    parts.push_back(item.second.to(device).reshape({1}));
    parts.push_back(torch::full({1}, weights_.at(item.first),
                                torch::TensorOptions(torch::kDouble).device(device)));
  }
  return torch::cat(parts);
}

std::map<std::string, double> MeanMetrics::means_of(const torch::Tensor& packed) const {
  if (packed.numel() != static_cast<int64_t>(2 * sums_.size())) {
    throw Error(detail::str("MeanMetrics::means_of: ", packed.numel(), " values for ", sums_.size(),
                            " metrics (a sum and a weight each). Fix: pass what "
                            "packed() returned, all-reduced."));
  }
  const torch::Tensor host = packed.to(torch::kCPU, torch::kDouble).contiguous();
  const double* v = host.data_ptr<double>();
  std::map<std::string, double> means;
  size_t i = 0;
  for (const auto& item : sums_) {
    const double sum = v[2 * i], weight = v[2 * i + 1];
    means[item.first] = weight > 0 ? sum / weight : std::numeric_limits<double>::quiet_NaN();
    ++i;
  }
  return means;
}

}  // namespace accelerant
