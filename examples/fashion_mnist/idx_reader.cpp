#include "idx_reader.h"

#include <zlib.h>

#include <stdexcept>
#include <vector>

namespace fashion_mnist {
namespace {

std::vector<uint8_t> read_gzip(const std::string& path) {
  gzFile file = gzopen(path.c_str(), "rb");
  if (file == nullptr) {
    throw std::runtime_error("cannot open " + path +
                             ". Fix: install Debian's dataset-fashion-mnist (scripts/install-deps) "
                             "or pass --data_dir");
  }
  std::vector<uint8_t> bytes;
  uint8_t buffer[1 << 16];
  int n;
  while ((n = gzread(file, buffer, sizeof buffer)) > 0)
    bytes.insert(bytes.end(), buffer, buffer + n);
  const bool failed = n < 0;
  gzclose(file);
  if (failed) throw std::runtime_error(path + " is not a readable gzip file (corrupt download?)");
  return bytes;
}

uint32_t big_endian(const std::vector<uint8_t>& b, size_t at) {
  return (uint32_t(b[at]) << 24) | (uint32_t(b[at + 1]) << 16) | (uint32_t(b[at + 2]) << 8) |
         b[at + 3];
}

}  // namespace

Split load_split(const std::string& dir, const std::string& name) {
  const std::string images_path = dir + "/" + name + "-images-idx3-ubyte.gz";
  const std::string labels_path = dir + "/" + name + "-labels-idx1-ubyte.gz";
  auto images = read_gzip(images_path);
  auto labels = read_gzip(labels_path);
  if (images.size() < 16 || big_endian(images, 0) != 2051) {
    throw std::runtime_error(images_path + " is not an IDX image file (magic 2051 expected)");
  }
  if (labels.size() < 8 || big_endian(labels, 0) != 2049) {
    throw std::runtime_error(labels_path + " is not an IDX label file (magic 2049 expected)");
  }
  const int64_t count = big_endian(images, 4), rows = big_endian(images, 8),
                cols = big_endian(images, 12);
  if (big_endian(labels, 4) != count || images.size() != size_t(16 + count * rows * cols) ||
      labels.size() != size_t(8 + count)) {
    throw std::runtime_error("the sizes in " + images_path + " and " + labels_path + " disagree");
  }
  Split split;
  split.images = torch::from_blob(images.data() + 16, {count, 1, rows, cols}, torch::kUInt8)
                     .to(torch::kFloat)
                     .div_(255)
                     .sub_(0.2860)
                     .div_(0.3530);  // Fashion-MNIST's mean and standard deviation
  split.labels = torch::from_blob(labels.data() + 8, {count}, torch::kUInt8).to(torch::kLong);
  return split;
}

}  // namespace fashion_mnist
