#include "accelerant/collate.h"

#include <algorithm>
#include <utility>

#include "accelerant/error.h"
#include "accelerant/static_shapes.h"
#include "base/text.h"

namespace accelerant {

namespace {

// The names every sample holds, in sample 0's order; a sample that holds others is an error.
std::vector<std::string> common_names(const std::vector<Batch>& samples, const char* who) {
  if (samples.empty())
    throw Error(detail::str(who, ": no samples to collate (a batch of 0 indices)."));
  std::vector<std::string> names = samples[0].names();
  for (size_t i = 1; i < samples.size(); ++i) {
    std::vector<std::string> here = samples[i].names();
    if (here != names) {
      throw Error(detail::str(
          who, ": sample ", i, " of the batch holds [", detail::join(here, ", "),
          "] but sample 0 holds [", detail::join(names, ", "),
          "]. Likely cause: the dataset's get() sets some tensors only for some samples. Fix: set "
          "the same names, in the same order, for every sample."));
    }
  }
  return names;
}

std::string shape_of(const torch::Tensor& t) { return c10::str(t.sizes()); }

// "[3, 5, 2]": an int64 tensor's values, for a message.
std::string values_of(const torch::Tensor& t) {
  const auto flat = t.to(torch::kLong).contiguous();
  const int64_t* p = flat.data_ptr<int64_t>();
  return "[" + detail::join(std::vector<int64_t>(p, p + flat.numel()), ", ") + "]";
}

torch::Tensor stack_one(const std::vector<Batch>& samples, const std::string& name,
                        const char* who) {
  std::vector<torch::Tensor> parts;
  parts.reserve(samples.size());
  const torch::Tensor& first = samples[0][name];
  for (size_t i = 0; i < samples.size(); ++i) {
    const torch::Tensor& t = samples[i][name];
    if (t.sizes() != first.sizes()) {
      throw Error(detail::str(
          who, ": cannot stack \"", name, "\": sample 0 of the batch is ", shape_of(first),
          " and sample ", i, " is ", shape_of(t),
          "; stacking needs equal sizes. Likely cause: variable-length samples (sequences). Fix: "
          "a padding collate, make_data_loader(dataset, options, "
          "accelerant::collate::pad_to_longest(accelerant::PaddingOptions().pad({\"",
          name, "\"}))), or pad_to_bucket / pad_to_length for the static shapes of graph mode."));
    }
    parts.push_back(t);
  }
  return torch::stack(parts);
}

// The padding collates differ only in how they pad one tensor's sequences.
using PadFunction = std::function<PaddedSequences(const std::vector<torch::Tensor>&)>;

Batch pad_and_stack(std::vector<Batch> samples, const PaddingOptions& options,
                    const PadFunction& pad, const char* who) {
  const std::vector<std::string> names = common_names(samples, who);
  for (const auto& wanted : options.pad()) {
    if (std::find(names.begin(), names.end(), wanted) == names.end()) {
      throw Error(detail::str(who, ": PaddingOptions::pad names \"", wanted,
                              "\", but the samples hold [", detail::join(names, ", "),
                              "]. Fix: name the sequences to pad, e.g. PaddingOptions().pad({\"",
                              names.empty() ? "data" : names[0], "\"})."));
    }
  }
  for (const auto& added : {options.mask_name(), options.lengths_name()}) {
    if (std::find(names.begin(), names.end(), added) != names.end()) {
      throw Error(detail::str(who, ": the samples already hold \"", added,
                              "\", the name the collate gives its mask or lengths. Fix: another ",
                              "PaddingOptions::mask_name / lengths_name."));
    }
  }
  Batch out;
  torch::Tensor mask, lengths;
  std::string lengths_from;
  for (const auto& name : names) {
    const bool padded =
        std::find(options.pad().begin(), options.pad().end(), name) != options.pad().end();
    if (!padded) {
      out.set(name, stack_one(samples, name, who));
      continue;
    }
    std::vector<torch::Tensor> sequences;
    sequences.reserve(samples.size());
    for (const auto& sample : samples) sequences.push_back(sample[name]);
    PaddedSequences result = pad(sequences);
    if (!lengths.defined()) {
      mask = result.mask;
      lengths = result.lengths;
      lengths_from = name;
    } else if (!torch::equal(lengths, result.lengths) || mask.sizes() != result.mask.sizes()) {
      throw Error(detail::str(
          who, ": the padded tensors \"", lengths_from, "\" and \"", name,
          "\" differ in length in some sample (lengths ", values_of(lengths), " and ",
          values_of(result.lengths),
          "); one mask cannot describe both. Fix: give them equal lengths in the dataset, or pad "
          "one of them in a collate function of your own."));
    }
    out.set(name, std::move(result.values));
  }
  out.set(options.mask_name(), mask);
  out.set(options.lengths_name(), lengths);
  return out;
}

Collate padding_collate(PaddingOptions options, PadFunction pad, const char* who) {
  if (options.pad().empty()) {
    throw Error(detail::str(who, ": PaddingOptions::pad names no tensor. Fix: name the sequences ",
                            "to pad (default {\"data\"}), or use collate::stack()."));
  }
  return [options = std::move(options), pad = std::move(pad), who](std::vector<Batch> samples) {
    return pad_and_stack(std::move(samples), options, pad, who);
  };
}

}  // namespace

namespace collate {

Collate stack() {
  return [](std::vector<Batch> samples) {
    Batch out;
    for (const auto& name : common_names(samples, "collate::stack"))
      out.set(name, stack_one(samples, name, "collate::stack"));
    return out;
  };
}

Collate pad_to_longest(PaddingOptions options) {
  const int64_t value = options.pad_value();
  return padding_collate(
      std::move(options),
      [value](const std::vector<torch::Tensor>& s) { return accelerant::pad_to_longest(s, value); },
      "collate::pad_to_longest");
}

Collate pad_to_bucket(std::vector<int64_t> bucket_lengths, PaddingOptions options) {
  // Checked now, not at the first batch: a bad bucket list is a mistake in the program.
  if (bucket_lengths.empty() || bucket_lengths.front() < 1 ||
      !std::is_sorted(bucket_lengths.begin(), bucket_lengths.end())) {
    throw Error(detail::str(
        "collate::pad_to_bucket: bucket lengths must be positive and ascending, got [",
        detail::join(bucket_lengths, ", "), "]. Fix: e.g. accelerant::bucket_lengths(256, 4)."));
  }
  const int64_t value = options.pad_value();
  const bool truncate = options.truncate();
  return padding_collate(
      std::move(options),
      [buckets = std::move(bucket_lengths), value, truncate](const std::vector<torch::Tensor>& s) {
        return accelerant::pad_to_bucket(s, buckets, value, truncate);
      },
      "collate::pad_to_bucket");
}

Collate pad_to_length(int64_t length, PaddingOptions options) {
  if (length < 1) {
    throw Error(detail::str("collate::pad_to_length: length must be positive, got ", length,
                            ". Fix: the longest sequence the model takes."));
  }
  const int64_t value = options.pad_value();
  const bool truncate = options.truncate();
  return padding_collate(
      std::move(options),
      [length, value, truncate](const std::vector<torch::Tensor>& s) {
        return accelerant::pad_to_length(s, length, value, truncate);
      },
      "collate::pad_to_length");
}

}  // namespace collate
}  // namespace accelerant
