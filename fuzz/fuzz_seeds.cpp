// Writes the fuzzers' starting corpora, made by the project's own encoders so that they follow
// the formats as this build writes them: fuzz_seeds SAFETENSORS_DIR JSON_DIR.
#include <torch/torch.h>

#include <cstring>
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

  // Nesting bombs (note "Bounded input" in src/base/bounded_input.h), small enough to mutate
  // quickly; the 100,000-deep ones that overflowed the stack are in the unit tests. Each must be
  // refused at once, and the fuzzer mutates around the limit (depth 64 passes, 65 does not).
  auto nested = [](size_t depth, bool closed) {
    return std::string(depth, '[') + (closed ? std::string(depth, ']') : "");
  };
  auto safetensors_with_header = [](const std::string& header) {
    std::string out(8, '\0');
    const uint64_t n = header.size();
    std::memcpy(&out[0], &n, 8);
    return out + header;
  };
  write(tensors_dir + "/deep_header.safetensors",
        safetensors_with_header("{\"a\":" + nested(2000, true) + "}"));
  write(tensors_dir + "/deep_unclosed_header.safetensors",
        safetensors_with_header("{\"a\":" + nested(2000, false)));
  write(tensors_dir + "/depth_65_header.safetensors",
        safetensors_with_header("{\"a\":" + nested(64, true) + "}"));
  write(json_dir + "/deep_manifest.json",
        "{\"format\": \"accelerant-checkpoint\", \"files\": " + nested(2000, true) + "}");
  write(json_dir + "/deep_unclosed.json", "{\"contents\": " + nested(2000, false));
  write(json_dir + "/deep_objects.json", [] {
    std::string text;
    for (int i = 0; i < 2000; ++i) text += "{\"a\":";
    return text + "1" + std::string(2000, '}');
  }());
  write(json_dir + "/brackets_in_strings.json",
        "{\"s\": \"" + nested(1000, false) + "\\\"" + nested(1000, false) + "\"}");
  return 0;
}
