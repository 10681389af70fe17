// Writes the fuzzers' starting corpora, made by the project's own encoders so that they follow
// the formats as this build writes them: fuzz_seeds SAFETENSORS_DIR JSON_DIR.
#include <torch/torch.h>

#include <fstream>
#include <iostream>
#include <string>

#include "accelerant/checkpoint.h"
#include "accelerant/safetensors.h"

namespace {

void write(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out << bytes;
  if (!out) {
    std::cerr << "fuzz_seeds: cannot write " << path << "\n";
    std::exit(1);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: fuzz_seeds SAFETENSORS_DIR JSON_DIR\n";
    return 2;
  }
  const std::string tensors_dir = argv[1], json_dir = argv[2];

  accelerant::SafetensorsContents small;
  small.tensors = {{"fc.weight", torch::arange(6, torch::kFloat32).reshape({2, 3})},
                   {"fc.bias", torch::tensor({1.5, -2.0}, torch::kFloat64)},
                   {"steps", torch::tensor({int64_t{7}})}};
  small.metadata = {{"format", "pt"}};
  write(tensors_dir + "/small.safetensors", accelerant::encode_safetensors(small));

  accelerant::SafetensorsContents dtypes;
  dtypes.tensors = {{"b", torch::tensor({true, false})},
                    {"u8", torch::tensor({1, 2, 3}, torch::kUInt8)},
                    {"i16", torch::tensor({-1, 2}, torch::kInt16)},
                    {"h", torch::ones({2, 2}, torch::kFloat16)},
                    {"bf", torch::ones({3}, torch::kBFloat16)},
                    {"empty", torch::zeros({0, 4})},
                    {"scalar", torch::tensor(3.0f)}};
  write(tensors_dir + "/dtypes.safetensors", accelerant::encode_safetensors(dtypes));
  write(tensors_dir + "/none.safetensors", accelerant::encode_safetensors({}));

  accelerant::CheckpointManifest manifest;
  manifest.accelerant_version = "0.1.0";
  manifest.libtorch_version = "1.13.1";
  manifest.created = "2026-12-03T10:00:00Z";
  manifest.world_size = 2;
  manifest.step = 12;
  manifest.models = manifest.optimizers = manifest.data_loaders = 1;
  manifest.files = {{"model_0.pt", 1234, 0xdeadbeef}, {"rank_1/rng.pt", 88, 0x01020304}};
  write(json_dir + "/manifest.json", accelerant::format_checkpoint_manifest(manifest));

  accelerant::CheckpointTrainingState state;
  state.optimizer_steps = 12;
  state.micro_steps = 24;
  state.scheduler_steps = {12};
  state.data_loaders = {{1, 640, 60000, 42, true}};
  write(json_dir + "/state.json", accelerant::format_checkpoint_state(state));
  return 0;
}
