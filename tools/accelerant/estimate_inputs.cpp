#include "estimate_inputs.h"

#include <accelerant/error.h>

#include <algorithm>
#include <cctype>
#include <limits>
#include <sstream>

namespace accelerant::cli {
namespace {

std::string lower(std::string text) {
  for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return text;
}

std::vector<std::string> split_commas(const std::string& text) {
  std::vector<std::string> parts;
  std::stringstream in(text);
  for (std::string part; std::getline(in, part, ',');) parts.push_back(part);
  return parts;
}

}  // namespace

uint64_t checked_multiply(uint64_t a, uint64_t b, const std::string& what) {
  if (a != 0 && b > std::numeric_limits<uint64_t>::max() / a) {
    throw Error(what + " is too large to count in 64 bits.");
  }
  return a * b;
}

uint64_t parse_count(const std::string& text, const std::string& flag, uint64_t max) {
  const std::string bad = flag + " " + text + ": ";
  const std::string fix = " Fix: a positive whole number, plain or with K, M, B or T (e.g. " +
                          flag + " 350M, " + flag + " 1.3B).";
  std::string digits = text;
  uint64_t scale = 1;
  int scale_digits = 0;  // decimal places the suffix can absorb
  if (!digits.empty()) {
    switch (std::tolower(static_cast<unsigned char>(digits.back()))) {
      case 'k':
        scale = 1'000, scale_digits = 3;
        break;
      case 'm':
        scale = 1'000'000, scale_digits = 6;
        break;
      case 'b':  // billion, as model cards write it (1.3B), not bytes
      case 'g':
        scale = 1'000'000'000, scale_digits = 9;
        break;
      case 't':
        scale = 1'000'000'000'000, scale_digits = 12;
        break;
    }
    if (scale > 1) digits.pop_back();
  }
  // Whole and fractional digits read exactly: 1.3B is 1'300'000'000, not 1'299'999'999.
  const size_t dot = digits.find('.');
  const std::string whole = digits.substr(0, dot);
  const std::string fraction = dot == std::string::npos ? "" : digits.substr(dot + 1);
  const auto all_digits = [](const std::string& s) {
    return std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
  };
  if (whole.empty() || !all_digits(whole) || !all_digits(fraction) ||
      (dot != std::string::npos && fraction.empty())) {
    throw Error(bad +
                (!text.empty() && text[0] == '-' ? "a count cannot be negative." : "not a count.") +
                fix);
  }
  if (static_cast<int>(fraction.size()) > scale_digits) {
    throw Error(bad + "not a whole number." + fix);
  }
  const uint64_t limit = std::numeric_limits<uint64_t>::max() / 10;
  uint64_t value = 0;
  for (char c : whole + fraction) {
    if (value > limit) throw Error(bad + "too large." + fix);
    value = value * 10 + static_cast<uint64_t>(c - '0');
  }
  uint64_t fraction_scale = 1;
  for (size_t i = 0; i < fraction.size(); ++i) fraction_scale *= 10;
  if (value > std::numeric_limits<uint64_t>::max() / (scale / fraction_scale)) {
    throw Error(bad + "too large." + fix);
  }
  value *= scale / fraction_scale;
  if (value == 0) throw Error(bad + "must be at least 1." + fix);
  if (value > max) throw Error(bad + "more than " + std::to_string(max) + "." + fix);
  return value;
}

std::vector<int64_t> parse_world_sizes(const std::string& text) {
  std::vector<int64_t> sizes;
  for (const std::string& part : split_commas(text)) {
    try {
      sizes.push_back(static_cast<int64_t>(parse_count(part, "--world_size", 1'000'000)));
    } catch (const Error& e) {
      throw Error("--world_size " + text + ": " + part +
                  " is not a number of processes. Fix: positive whole numbers separated by "
                  "commas, e.g. --world_size 1,2,4,8.");
    }
  }
  if (sizes.empty()) throw Error("--world_size is empty. Fix: e.g. --world_size 1,2,4,8.");
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  return sizes;
}

std::vector<int> parse_zero_stages(const std::string& text) {
  if (lower(text) == "all") return {0, 1, 2, 3};
  std::vector<int> stages;
  for (const std::string& part : split_commas(text)) {
    if (part != "0" && part != "1" && part != "2" && part != "3") {
      throw Error("--zero_stage " + text + ": " + part +
                  " is not a ZeRO stage. Fix: 0, 1, 2, 3, a list such as 0,2, or all.");
    }
    stages.push_back(part[0] - '0');
  }
  if (stages.empty()) throw Error("--zero_stage is empty. Fix: 0, 1, 2, 3, a list, or all.");
  std::sort(stages.begin(), stages.end());
  stages.erase(std::unique(stages.begin(), stages.end()), stages.end());
  return stages;
}

TrainingPrecision parse_precision(const std::string& text) {
  const std::string p = lower(text);
  if (p == "fp32" || p == "no") return TrainingPrecision::kFp32;
  if (p == "bf16") return TrainingPrecision::kBf16;
  if (p == "fp16") return TrainingPrecision::kFp16;
  throw Error("--precision " + text +
              ": unknown precision. Fix: fp32, bf16 or fp16 (16-bit weights with an fp32 master "
              "copy).");
}

std::string precision_name(TrainingPrecision precision) {
  switch (precision) {
    case TrainingPrecision::kFp32:
      return "fp32";
    case TrainingPrecision::kBf16:
      return "bf16";
    case TrainingPrecision::kFp16:
      return "fp16";
  }
  return "";
}

OptimizerKind parse_optimizer(const std::string& text) {
  const std::string o = lower(text);
  if (o == "adamw") return OptimizerKind::kAdamW;
  if (o == "adam") return OptimizerKind::kAdam;
  if (o == "sgd") return OptimizerKind::kSgd;
  if (o == "sgd_momentum") return OptimizerKind::kSgdMomentum;
  throw Error("--optimizer " + text +
              ": unknown optimizer. Fix: adamw, adam, sgd_momentum or sgd (the state each keeps "
              "per parameter: 8, 8, 4 and 0 bytes).");
}

std::string optimizer_name(OptimizerKind optimizer) {
  switch (optimizer) {
    case OptimizerKind::kAdamW:
      return "adamw";
    case OptimizerKind::kAdam:
      return "adam";
    case OptimizerKind::kSgd:
      return "sgd";
    case OptimizerKind::kSgdMomentum:
      return "sgd_momentum";
  }
  return "";
}

std::optional<Activations> parse_activations(
    const std::string& batch_size, const std::string& bytes_per_sample, const std::string& seq_len,
    const std::string& hidden_size, const std::string& num_layers, TrainingPrecision precision) {
  const bool rule_of_thumb = !seq_len.empty() || !hidden_size.empty() || !num_layers.empty();
  if (batch_size.empty() && bytes_per_sample.empty() && !rule_of_thumb) return std::nullopt;
  const std::string fix =
      " Fix: --batch_size B with --activation_bytes_per_sample (measured), or with --seq_len, "
      "--hidden_size and --num_layers (a transformer's rule of thumb).";
  if (batch_size.empty()) throw Error("the activations need --batch_size (per rank)." + fix);
  const uint64_t max = 1'000'000'000'000ULL;
  const uint64_t batch = parse_count(batch_size, "--batch_size", max);
  Activations a;
  if (!bytes_per_sample.empty()) {
    if (rule_of_thumb) {
      throw Error(
          "--activation_bytes_per_sample and --seq_len/--hidden_size/--num_layers both "
          "given: one way at a time." +
          fix);
    }
    a.bytes = checked_multiply(
        batch, parse_count(bytes_per_sample, "--activation_bytes_per_sample", max), "activations");
    a.rule = "--batch_size x --activation_bytes_per_sample";
    return a;
  }
  if (seq_len.empty() || hidden_size.empty() || num_layers.empty()) {
    throw Error(
        "the transformer rule of thumb needs --seq_len, --hidden_size and --num_layers "
        "together." +
        fix);
  }
  // ~17 values stored per token, hidden unit and layer (attention, MLP, norms, dropout masks;
  // attention scores not stored, as flash attention does; no recomputation).
  const uint64_t per_value = precision == TrainingPrecision::kFp32 ? 4 : 2;
  uint64_t bytes = checked_multiply(batch, 17 * per_value, "activations");
  bytes = checked_multiply(bytes, parse_count(seq_len, "--seq_len", max), "activations");
  bytes = checked_multiply(bytes, parse_count(hidden_size, "--hidden_size", max), "activations");
  a.bytes = checked_multiply(bytes, parse_count(num_layers, "--num_layers", max), "activations");
  a.rule = "batch x " + std::to_string(17 * per_value) +
           " B x seq_len x hidden_size x num_layers, a transformer's rule of thumb";
  return a;
}

}  // namespace accelerant::cli
