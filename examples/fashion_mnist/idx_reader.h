// Reads the gzip-compressed IDX files of MNIST-style datasets (Debian's dataset-fashion-mnist
// installs them under /usr/share/datasets/fashion-mnist).
#pragma once

#include <torch/types.h>

#include <string>

namespace fashion_mnist {

struct Split {
  torch::Tensor images;  // [N, 1, 28, 28] float, normalised to mean 0, std 1
  torch::Tensor labels;  // [N] int64
};

/// Loads "train" or "t10k" from `dir`. Throws std::runtime_error naming the file on any problem.
Split load_split(const std::string& dir, const std::string& name);

}  // namespace fashion_mnist
