// Static shapes for graph mode: collate variable-length sequences into a few fixed shapes, so
// that a captured step is replayed instead of captured again for every new length.
//
//   pad_to_longest   dynamic padding: the batch's own longest length (a new shape almost every
//                    batch: one recompile each)
//   pad_to_bucket    the smallest of a few bucket lengths that holds the batch (as many shapes
//                    as buckets at most)
//   pad_to_length    one fixed length (one shape; the most padding)
//
// Each returns the padded values, a mask of the real positions and the lengths, so that a model
// can ignore the padding (e.g. as a key padding mask, or by averaging over the mask).
#pragma once
#include <torch/types.h>

#include <cstdint>
#include <vector>

namespace accelerant {

/// A batch of sequences padded to one length, as the pad_to_* functions return it.
struct PaddedSequences {
  torch::Tensor values;   ///< [batch, length]: the sequences, then pad_value
  torch::Tensor mask;     ///< bool [batch, length]: true at real positions
  torch::Tensor lengths;  ///< int64 [batch]: each sequence's length (after truncation)
};

/// Pads 1-D sequences (all of one dtype) to `length`. A longer sequence is an error naming it,
/// unless `truncate` cuts it to `length`.
PaddedSequences pad_to_length(const std::vector<torch::Tensor>& sequences, int64_t length,
                              int64_t pad_value = 0, bool truncate = false);

/// Pads to the smallest of `bucket_lengths` (ascending) that holds the longest sequence; longer
/// than the largest bucket is an error unless `truncate` cuts to it.
PaddedSequences pad_to_bucket(const std::vector<torch::Tensor>& sequences,
                              const std::vector<int64_t>& bucket_lengths, int64_t pad_value = 0,
                              bool truncate = false);

/// Pads to the longest sequence of this batch (dynamic padding).
PaddedSequences pad_to_longest(const std::vector<torch::Tensor>& sequences, int64_t pad_value = 0);

/// `count` bucket lengths evenly spaced up to `max_length`, each rounded up to a multiple of
/// `multiple` (8 suits vector units and tensor cores), e.g. (128, 4) -> {32, 64, 96, 128}.
std::vector<int64_t> bucket_lengths(int64_t max_length, int count, int64_t multiple = 8);

}  // namespace accelerant
