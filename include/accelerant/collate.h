// Collate functions: how the samples of one batch (what a dataset's get() returned for each of its
// indices) become the batch. make_data_loader(dataset, options, collate) takes one; the default
// stacks.
//
//   auto loader = accelerant::make_data_loader(
//       dataset, accelerant::DataLoaderOptions().batch_size(32),
//       accelerant::collate::pad_to_bucket(accelerant::bucket_lengths(256, 4),
//                                          accelerant::PaddingOptions().pad({"input_ids"})));
//   for (auto& batch : loader) model->forward(batch["input_ids"], batch["mask"]);
//
//   stack            every tensor stacked along a new dim 0 (equal sizes only)
//   pad_to_longest   the padded tensors to the batch's longest sample (dynamic padding)
//   pad_to_bucket    the padded tensors to the smallest bucket length that holds the batch
//   pad_to_length    the padded tensors to one fixed length
//
// A padding collate pads the tensors PaddingOptions::pad names (each sample's is a 1-D sequence;
// static_shapes.h does the padding), stacks the others, and adds two tensors to the batch:
// "mask" (bool [batch, length], true at real positions) and "lengths" (int64 [batch], each
// sample's length after truncation). Graph mode wants pad_to_bucket or pad_to_length: each
// distinct length is a new capture (graph_step.h).
//
// A user collate is any function from the samples to a Batch: it runs in the loader's worker
// threads when there are some, so it must be safe to call from several threads at once.
#pragma once
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "accelerant/batch.h"
#include "accelerant/options.h"

namespace accelerant {

/// Builds one batch from its samples, in the order of the batch's dataset indices.
using Collate = std::function<Batch(std::vector<Batch> samples)>;

/// What a padding collate pads and how.
struct PaddingOptions {
  /// The names of the tensors to pad; each sample's must be 1-D (a sequence), and a sample's
  /// padded tensors must have one length (ids and labels of a token tagger). The others are
  /// stacked. Default: {"data"}.
  ACCELERANT_OPTION(std::vector<std::string>, pad) = std::vector<std::string>{"data"};
  /// The value at the padded positions, one for all padded tensors (the mask tells real
  /// positions from padding whatever the value). Default: 0.
  ACCELERANT_OPTION(int64_t, pad_value) = 0;
  /// Cut samples longer than the length padded to, instead of throwing Error (pad_to_bucket:
  /// the largest bucket; pad_to_length: the length). Default: false.
  ACCELERANT_OPTION(bool, truncate) = false;
  /// The name under which the mask comes (bool [batch, length], true at real positions).
  /// Default: "mask".
  ACCELERANT_OPTION(std::string, mask_name) = "mask";
  /// The name under which the lengths come (int64 [batch]). Default: "lengths".
  ACCELERANT_OPTION(std::string, lengths_name) = "lengths";
};

/// The ready collates (see the file comment).
namespace collate {

/// Stacks each tensor of the samples along a new dim 0: the collation of a DataLoader when none
/// is given. Every sample must hold the same names, and each name tensors of one size: unequal
/// sizes throw Error naming the two samples' shapes and the fix (a padding collate).
Collate stack();

/// Pads to the longest sample of each batch (a new shape for almost every batch).
Collate pad_to_longest(PaddingOptions options = {});

/// Pads to the smallest of `bucket_lengths` (ascending) that holds the batch's longest sample:
/// at most as many shapes as buckets. accelerant::bucket_lengths suggests some.
Collate pad_to_bucket(std::vector<int64_t> bucket_lengths, PaddingOptions options = {});

/// Pads every batch to `length`: one shape.
Collate pad_to_length(int64_t length, PaddingOptions options = {});

}  // namespace collate
}  // namespace accelerant
