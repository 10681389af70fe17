// The text a character-level GPT trains on: its vocabulary (the distinct bytes, sorted, as
// nanoGPT's shakespeare_char/prepare.py builds it), and the encoded text split 90 / 10 by position
// into train and val.
#pragma once

#include <torch/types.h>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace gpt {

/// Characters (bytes) <-> token indices.
class Vocabulary {
 public:
  Vocabulary() = default;
  /// The distinct bytes of `text`, sorted; index i is the i-th smallest.
  static Vocabulary of_text(const std::string& text);
  /// From the bytes themselves (what chars() returns), e.g. read back from a run's files.
  static Vocabulary of_chars(std::vector<uint8_t> chars);
  int64_t size() const { return static_cast<int64_t>(chars_.size()); }
  const std::vector<uint8_t>& chars() const { return chars_; }
  /// `text` as int64 token indices, 1-D. Throws std::invalid_argument naming the first byte
  /// that is not in the vocabulary.
  torch::Tensor encode(const std::string& text) const;
  /// Whether every character of `text` is in the vocabulary.
  bool contains(const std::string& text) const;
  /// Token indices (any integer tensor) back to text.
  std::string decode(const torch::Tensor& tokens) const;

 private:
  std::vector<uint8_t> chars_;
  std::array<int16_t, 256> index_{};  // byte -> token, -1 when absent
};

/// The encoded text and its split.
struct Corpus {
  Vocabulary vocabulary;
  torch::Tensor train;  ///< the first 90 % of the tokens (int16)
  torch::Tensor val;    ///< the rest
};

/// Reads `path` and splits it at int(0.9 * length). Throws std::runtime_error when it cannot
/// be read or is too short for windows of `block_size`.
Corpus read_corpus(const std::string& path, int64_t block_size);

}  // namespace gpt
