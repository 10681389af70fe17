// Metrics of an evaluation averaged across processes with the right weights, reduced with one
// collective per evaluation instead of one per batch.
//
//   auto means = accelerator.evaluate(model, [&](accelerant::MeanMetrics& metrics) {
//     for (...) {                                   // in eval mode, without gradients
//       auto loss = cross_entropy(model->forward(x), y);
//       metrics.add("val/loss", loss, y.numel());   // this batch's mean over y.numel() tokens
//     }
//   });                                            // train mode is back; one all-reduce
//   double val_loss = means.at("val/loss");        // sum of loss * tokens / sum of tokens
//
// The weights matter when batches differ in size (the last batch of a split, uneven shares
// across processes): a plain mean of per-batch means would count a short batch's tokens more.
// The sums stay on the device while batches are added, so adding never waits for the device.
#pragma once
#include <torch/types.h>

#include <map>
#include <string>
#include <vector>

namespace accelerant {

/// Weighted means of named metrics, accumulated on the device; see the file comment.
/// Accelerator::evaluate reduces them across processes.
class MeanMetrics {
 public:
  /// Adds `mean` (one element: a mean over `weight` items, e.g. a batch's mean loss over its
  /// tokens) to metric `name`, with weight `weight`. Throws Error for a tensor of more than one
  /// element, a negative weight or an empty name.
  void add(const std::string& name, const torch::Tensor& mean, double weight = 1.0);
  /// Adds `sum` (one element: a sum over `weight` items) to metric `name`.
  void add_sum(const std::string& name, const torch::Tensor& sum, double weight);

  /// The metrics' names, sorted.
  std::vector<std::string> names() const;
  /// Whether nothing was added.
  bool empty() const { return sums_.empty(); }
  /// This process's weighted means (read on the host); NaN for a metric of total weight 0.
  std::map<std::string, double> local_means() const;

  /// [sum, weight] of each metric in names() order, as one float64 tensor on the device of the
  /// first added value: what the processes all-reduce.
  torch::Tensor packed() const;
  /// The means from packed() sums (after an all-reduce: across processes), in names() order.
  /// Throws Error when `packed` has another length.
  std::map<std::string, double> means_of(const torch::Tensor& packed) const;

 private:
  std::map<std::string, torch::Tensor> sums_;  // float64, 0-dim, on the values' device
  std::map<std::string, double> weights_;
};

}  // namespace accelerant
