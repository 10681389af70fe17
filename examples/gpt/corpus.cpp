#include "corpus.h"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace gpt {

Vocabulary Vocabulary::of_text(const std::string& text) {
  std::array<bool, 256> seen{};
  for (unsigned char c : text) seen[c] = true;
  std::vector<uint8_t> chars;
  for (int c = 0; c < 256; ++c) {
    if (seen[c]) chars.push_back(static_cast<uint8_t>(c));
  }
  return of_chars(std::move(chars));
}

Vocabulary Vocabulary::of_chars(std::vector<uint8_t> chars) {
  Vocabulary v;
  v.index_.fill(-1);
  for (size_t i = 0; i < chars.size(); ++i) {
    if (v.index_[chars[i]] != -1) {
      throw std::invalid_argument("the vocabulary lists byte " + std::to_string(chars[i]) +
                                  " twice");
    }
    v.index_[chars[i]] = static_cast<int16_t>(i);
  }
  v.chars_ = std::move(chars);
  return v;
}

torch::Tensor Vocabulary::encode(const std::string& text) const {
  auto tokens = torch::empty({static_cast<int64_t>(text.size())}, torch::kLong);
  auto* out = tokens.data_ptr<int64_t>();
  for (size_t i = 0; i < text.size(); ++i) {
    const int16_t token = index_[static_cast<unsigned char>(text[i])];
    if (token < 0) {
      throw std::invalid_argument(
          "character " + std::to_string(static_cast<unsigned char>(text[i])) + " at offset " +
          std::to_string(i) + " of \"" + text.substr(0, 40) + "\" is not in the vocabulary of " +
          std::to_string(size()) +
          " characters (those of the training text). Fix: use only "
          "characters the text contains (e.g. in --start)");
    }
    out[i] = token;
  }
  return tokens;
}

bool Vocabulary::contains(const std::string& text) const {
  for (unsigned char c : text) {
    if (index_[c] < 0) return false;
  }
  return true;
}

std::string Vocabulary::decode(const torch::Tensor& tokens) const {
  auto flat = tokens.to(torch::kCPU, torch::kLong).contiguous().view(-1);
  std::string text;
  text.reserve(static_cast<size_t>(flat.numel()));
  const auto* in = flat.data_ptr<int64_t>();
  for (int64_t i = 0; i < flat.numel(); ++i) {
    text.push_back(static_cast<char>(chars_.at(static_cast<size_t>(in[i]))));
  }
  return text;
}

Corpus read_corpus(const std::string& path, int64_t block_size) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read the training text " + path);
  std::ostringstream buffer;
  buffer << in.rdbuf();
  const std::string text = buffer.str();
  Corpus corpus;
  corpus.vocabulary = Vocabulary::of_text(text);
  // 16-bit tokens halve the memory the forked workers share; the windows come back as int64.
  auto tokens = corpus.vocabulary.encode(text).to(torch::kShort);
  const auto n = static_cast<int64_t>(text.size());
  const auto split = static_cast<int64_t>(0.9 * static_cast<double>(n));
  if (n - split <= block_size) {
    throw std::runtime_error(path + " has " + std::to_string(n) +
                             " characters: its last 10 % (the validation split) must be longer "
                             "than block_size " +
                             std::to_string(block_size) +
                             ". Fix: a longer text or a smaller "
                             "--block_size");
  }
  corpus.train = tokens.narrow(0, 0, split);
  corpus.val = tokens.narrow(0, split, n - split);
  return corpus;
}

}  // namespace gpt
