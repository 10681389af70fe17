#include "accelerant/static_shapes.h"

#include <algorithm>

#include "accelerant/error.h"
#include "base/text.h"

namespace accelerant {

namespace {

void check_sequences(const std::vector<torch::Tensor>& sequences, const char* who) {
  if (sequences.empty()) {
    throw Error(detail::str(who, ": no sequences to pad. Fix: pass at least one 1-D tensor."));
  }
  for (size_t i = 0; i < sequences.size(); ++i) {
    const auto& s = sequences[i];
    if (!s.defined() || s.dim() != 1) {
      throw Error(detail::str(
          who, ": sequence ", i, " is ", s.defined() ? detail::str(s.dim(), "-D") : "undefined",
          "; every sequence must be a 1-D tensor. Fix: flatten it, or pad each feature "
          "dimension separately."));
    }
    if (s.scalar_type() != sequences[0].scalar_type()) {
      throw Error(detail::str(who, ": sequence ", i, " is ", c10::toString(s.scalar_type()),
                              ", sequence 0 is ", c10::toString(sequences[0].scalar_type()),
                              ". Fix: convert them to one dtype."));
    }
  }
}

int64_t longest(const std::vector<torch::Tensor>& sequences) {
  int64_t n = 0;
  for (const auto& s : sequences) n = std::max(n, s.numel());
  return n;
}

PaddedSequences pad(const std::vector<torch::Tensor>& sequences, int64_t length,
                    int64_t pad_value) {
  const auto batch = static_cast<int64_t>(sequences.size());
  PaddedSequences out;
  out.values = torch::full({batch, length}, pad_value, sequences[0].options());
  out.mask = torch::zeros({batch, length}, torch::kBool);
  out.lengths = torch::empty({batch}, torch::kLong);
  auto lengths = out.lengths.accessor<int64_t, 1>();
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t n = std::min(length, sequences[b].numel());
    out.values[b].narrow(0, 0, n).copy_(sequences[b].narrow(0, 0, n));
    out.mask[b].narrow(0, 0, n).fill_(true);
    lengths[b] = n;
  }
  return out;
}

}  // namespace

PaddedSequences pad_to_length(const std::vector<torch::Tensor>& sequences, int64_t length,
                              int64_t pad_value, bool truncate) {
  check_sequences(sequences, "pad_to_length");
  if (length < 1)
    throw Error(detail::str("pad_to_length: length must be positive, got ", length, "."));
  if (!truncate) {
    for (size_t i = 0; i < sequences.size(); ++i) {
      if (sequences[i].numel() > length) {
        throw Error(detail::str("pad_to_length: sequence ", i, " has ", sequences[i].numel(),
                                " elements, more than the length ", length,
                                ". Fix: a larger length, or ",
                                "truncate = true to cut longer sequences."));
      }
    }
  }
  return pad(sequences, length, pad_value);
}

PaddedSequences pad_to_bucket(const std::vector<torch::Tensor>& sequences,
                              const std::vector<int64_t>& bucket_lengths, int64_t pad_value,
                              bool truncate) {
  check_sequences(sequences, "pad_to_bucket");
  if (bucket_lengths.empty() || bucket_lengths.front() < 1 ||
      !std::is_sorted(bucket_lengths.begin(), bucket_lengths.end())) {
    throw Error(detail::str("pad_to_bucket: bucket lengths must be positive and ascending, got [",
                            detail::join(bucket_lengths, ", "),
                            "]. Fix: e.g. accelerant::bucket_lengths(256, 4)."));
  }
  const int64_t need = longest(sequences);
  auto fits = std::lower_bound(bucket_lengths.begin(), bucket_lengths.end(), need);
  if (fits == bucket_lengths.end()) {
    if (!truncate) {
      throw Error(detail::str("pad_to_bucket: the longest sequence has ", need,
                              " elements, more than the largest ", "bucket ", bucket_lengths.back(),
                              ". Fix: add a bucket of at least ", need,
                              ", or truncate = true to cut to the largest."));
    }
    return pad(sequences, bucket_lengths.back(), pad_value);
  }
  return pad(sequences, *fits, pad_value);
}

PaddedSequences pad_to_longest(const std::vector<torch::Tensor>& sequences, int64_t pad_value) {
  check_sequences(sequences, "pad_to_longest");
  return pad(sequences, std::max<int64_t>(1, longest(sequences)), pad_value);
}

std::vector<int64_t> bucket_lengths(int64_t max_length, int count, int64_t multiple) {
  if (max_length < 1 || count < 1 || multiple < 1) {
    throw Error(detail::str("bucket_lengths: max_length (", max_length, "), count (", count,
                            ") and multiple (", multiple, ") must be positive."));
  }
  std::vector<int64_t> out;
  for (int k = 1; k <= count; ++k) {
    int64_t length = (max_length * k + count - 1) / count;
    length = std::min(max_length, (length + multiple - 1) / multiple * multiple);
    if (out.empty() || length > out.back()) out.push_back(length);
  }
  return out;
}

}  // namespace accelerant
