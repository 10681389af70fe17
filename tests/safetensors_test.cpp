// safetensors: the exact bytes written, round trips of every dtype, hostile files refused with a
// reason, sharded model saves with an index, and files read and written by an independent
// implementation (tests/safetensors_interop.py, json + numpy only).
#include <accelerant/accelerant.h>
#include <accelerant/checkpoint.h>
#include <accelerant/safetensors.h>
#include <accelerant/safetensors_header.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <torch/torch.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "checkpoint/durable_files.h"
#include "checkpoint/safetensors_stream.h"
#include "test_support.h"

namespace {

using namespace accelerant;
namespace t = accelerant::testing;
using accelerant::testing::slurp;

void spit(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// Raw bytes of a file from a header text and data, as a hostile writer would make them.
std::string raw_file(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  const uint64_t n = header.size();
  std::memcpy(&out[0], &n, 8);
  return out + header + data;
}

std::string decode_error(const std::string& bytes) {
  try {
    decode_safetensors(bytes, "test.safetensors");
  } catch (const CheckpointError& e) {
    return e.what();
  }
  return "(no error)";
}

// Every dtype safetensors and LibTorch share, as parameters and buffers.
struct AllDtypesImpl : torch::nn::Module {
  AllDtypesImpl() {
    torch::manual_seed(7);
    linear = register_module("linear", torch::nn::Linear(5, 3));
    register_buffer("b_bool", torch::tensor({true, false, true}));
    register_buffer("b_u8", torch::arange(0, 6, torch::kUInt8).reshape({2, 3}));
    register_buffer("b_i8", torch::arange(-3, 3, torch::kInt8));
    register_buffer("b_i16", torch::arange(-300, 300, 7, torch::kInt16));
    register_buffer("b_i32", torch::arange(-70000, 70000, 999, torch::kInt32));
    register_buffer("b_i64", torch::arange(0, 4, torch::kInt64) * (int64_t{1} << 40));
    register_buffer("b_f16", torch::randn({4, 2}).to(torch::kHalf));
    register_buffer("b_bf16", torch::randn({3, 3}).to(torch::kBFloat16));
    register_buffer("b_f64", torch::randn({2, 2, 2}, torch::kDouble));
    register_buffer("b_scalar", torch::tensor(3.5));
    register_buffer("b_empty", torch::zeros({0, 4}));
  }
  torch::nn::Linear linear{nullptr};
};
TORCH_MODULE(AllDtypes);

std::map<std::string, torch::Tensor> state_of(const torch::nn::Module& m) {
  std::map<std::string, torch::Tensor> state;
  for (const auto& p : m.named_parameters()) state[p.key()] = p.value();
  for (const auto& b : m.named_buffers()) state[b.key()] = b.value();
  return state;
}

TEST(Safetensors, WritesTheSpecifiedLayoutByteForByte) {
  SafetensorsContents c;
  c.tensors.emplace_back("w", torch::tensor({1.0f, 2.0f}));
  c.tensors.emplace_back("n", torch::tensor({int16_t{-1}}, torch::kInt16));
  const std::string bytes = encode_safetensors(c);
  const std::string header =
      R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"n":{"dtype":"I16","shape":[1],"data_offsets":[8,10]}})";
  const std::string padded = header + std::string((8 - header.size() % 8) % 8, ' ');
  std::string data(10, '\0');
  const float w[2] = {1.0f, 2.0f};
  std::memcpy(&data[0], w, 8);
  data[8] = data[9] = '\xff';
  EXPECT_EQ(bytes, raw_file(padded, data));
  EXPECT_EQ((8 + padded.size()) % 8, 0u) << "the data must start 8-byte aligned";
}

TEST(Safetensors, RoundTripsEveryDtypeShapeAndMetadata) {
  AllDtypes model;
  SafetensorsContents c;
  for (const auto& [name, tensor] : state_of(*model)) c.tensors.emplace_back(name, tensor);
  c.tensors.emplace_back("strided",
                         torch::arange(12, torch::kFloat).reshape({3, 4}).t());  // not contiguous
  c.metadata = {{"format", "pt"}, {"note", "x"}};
  const auto back = decode_safetensors(encode_safetensors(c), "memory");
  ASSERT_EQ(back.tensors.size(), c.tensors.size());
  for (size_t i = 0; i < c.tensors.size(); ++i) {
    EXPECT_EQ(back.tensors[i].first, c.tensors[i].first) << "file order is write order";
    EXPECT_EQ(back.tensors[i].second.scalar_type(), c.tensors[i].second.scalar_type())
        << c.tensors[i].first;
    EXPECT_EQ(back.tensors[i].second.sizes(), c.tensors[i].second.sizes()) << c.tensors[i].first;
    EXPECT_TRUE(torch::equal(back.tensors[i].second, c.tensors[i].second)) << c.tensors[i].first;
  }
  EXPECT_EQ(back.metadata, c.metadata);
}

TEST(Safetensors, RefusesNamesAndDtypesItCannotWrite) {
  SafetensorsContents twice;
  twice.tensors = {{"a", torch::ones(1)}, {"a", torch::ones(1)}};
  EXPECT_THROW(encode_safetensors(twice), Error);
  SafetensorsContents complex;
  complex.tensors = {{"c", torch::ones(2, torch::kComplexFloat)}};
  try {
    encode_safetensors(complex);
    FAIL() << "a complex tensor was written";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("Supported: BOOL"), std::string::npos) << e.what();
  }
}

TEST(Safetensors, HostileFilesAreRefusedWithTheReason) {
  const std::string f32x2(8, '\0');
  const std::string ok = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  ASSERT_EQ(decode_error(raw_file(ok, f32x2)), "(no error)");

  EXPECT_NE(decode_error("abc").find("fewer than the 8"), std::string::npos);
  std::string huge(8, '\0');
  huge[7] = 0x01;  // 2^56 bytes of header
  EXPECT_NE(decode_error(huge + "{}").find("header length is 72057594037927936"),
            std::string::npos);
  EXPECT_NE(decode_error(raw_file(ok, f32x2).substr(0, 40)).find("only 32 follow"),
            std::string::npos);
  EXPECT_NE(decode_error(raw_file(R"({"a": )", "")).find("not valid JSON"), std::string::npos);
  EXPECT_NE(decode_error(raw_file("[1]", "")).find("does not start with '{'"), std::string::npos);
  EXPECT_NE(decode_error(raw_file(ok, f32x2.substr(0, 4))).find("truncated"), std::string::npos);
  EXPECT_NE(decode_error(raw_file(ok, f32x2 + "xx")).find("bytes left over"), std::string::npos);
  EXPECT_NE(
      decode_error(raw_file(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", f32x2))
          .find("needs 12 bytes, its data_offsets [0, 8] hold 8"),
      std::string::npos);
  EXPECT_NE(
      decode_error(raw_file(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", f32x2))
          .find("not a non-negative integer: -2"),
      std::string::npos);
  EXPECT_NE(
      decode_error(raw_file(R"({"a":{"dtype":"F8_E4M3","shape":[8],"data_offsets":[0,8]}})", f32x2))
          .find("dtype F8_E4M3, which this build cannot hold"),
      std::string::npos);
  EXPECT_NE(decode_error(raw_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                                  R"("b":{"dtype":"F32","shape":[1],"data_offsets":[2,6]}})",
                                  std::string(6, '\0')))
                .find("overlaps"),
            std::string::npos);
  EXPECT_NE(
      decode_error(raw_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", f32x2))
          .find("a gap before it"),
      std::string::npos);
  EXPECT_NE(decode_error(
                raw_file(R"({"a":{"dtype":"BOOL","shape":[2],"data_offsets":[0,2]}})", "\x01\x02"))
                .find("holds the byte 2"),
            std::string::npos);
  EXPECT_NE(
      decode_error(
          raw_file(R"({"a":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,8]}})",
                   f32x2))
          .find("too large to address"),
      std::string::npos);
  EXPECT_NE(decode_error(raw_file(R"({"__metadata__":{"k":1}})", "")).find("\"k\" is not a string"),
            std::string::npos);
}

// Nesting bombs (note "Bounded input" in src/base/bounded_input.h): before the depth check a
// header of 100,000 '[' overflowed the stack inside nlohmann::json (SIGSEGV), and an unclosed one
// of 50 MB took 14.6 s and 3.9 GB. Now a linear scan refuses them before anything is parsed.
TEST(Safetensors, DeeplyNestedHeadersAreRefusedBeforeParsing) {
  const std::string open(100000, '[');
  const std::string closed = open + std::string(100000, ']');
  for (const std::string& header :
       {"{\"a\":" + closed + "}", "{\"a\":" + open, "{\"__metadata__\":{\"k\":" + closed + "}}"}) {
    const std::string error = decode_error(raw_file(header, ""));
    EXPECT_TRUE(t::contains(error, "its header nests lists and mappings more than 64 deep"))
        << error.substr(0, 400);
  }
  // 20 MB of an unclosed nesting is refused at its 65th bracket, not read to its end.
  const auto start = std::chrono::steady_clock::now();
  const std::string error = decode_error(raw_file("{\"a\":" + std::string(20 << 20, '['), ""));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_TRUE(t::contains(error, "more than 64 deep (at byte 68)")) << error.substr(0, 400);
  EXPECT_LT(seconds, 2.0);

  // 64 deep is within the limit: refused for what it holds, not for its depth.
  const std::string at_limit = "{\"a\":" + std::string(63, '[') + std::string(63, ']') + "}";
  EXPECT_FALSE(t::contains(decode_error(raw_file(at_limit, "")), "deep"));
  // Brackets and escaped quotes inside strings are text, not nesting.
  SafetensorsContents text;
  text.metadata = {{"note", std::string(1000, '[') + "\"{" + std::string(1000, '{') + "\\"}};
  EXPECT_EQ(decode_safetensors(encode_safetensors(text), "text").metadata, text.metadata);
}

TEST(SafetensorsModel, ADeeplyNestedIndexIsRefusedNamingIt) {
  t::ScratchDir dir;
  const std::string index = dir.path + "/model.safetensors.index.json";
  spit(index, "{\"weight_map\": " + std::string(100000, '[') + std::string(100000, ']') + "}");
  try {
    read_model_safetensors(dir.path);
    ADD_FAILURE() << "a nesting bomb was accepted";
  } catch (const CheckpointError& e) {
    EXPECT_TRUE(t::contains(e.what(), index + " nests lists and mappings more than 64 deep"))
        << e.what();
    EXPECT_EQ(e.path(), index);
  }
}

// A cheap in-test fuzzer: random bit flips, byte writes, truncations and header-length edits of
// valid files. Every outcome must be a decoded file or a CheckpointError, never a crash, a hang
// or another exception; a decoded file must hold what its header says.
TEST(Safetensors, RandomlyDamagedFilesDecodeOrFailCleanly) {
  AllDtypes model;
  SafetensorsContents c;
  for (const auto& [name, tensor] : state_of(*model)) c.tensors.emplace_back(name, tensor);
  const std::string valid = encode_safetensors(c);
  CheckpointManifest m;
  m.accelerant_version = "0.1.0";
  m.files = {{"model_0.pt", 10, 0xdeadbeef}, {"rank_0/rng.pt", 3, 7}};
  const std::string manifest = format_checkpoint_manifest(m);
  std::mt19937_64 rng(20261203);
  int decoded = 0, refused = 0;
  for (int trial = 0; trial < 4000; ++trial) {
    const bool of_manifest = trial % 4 == 3;
    std::string bytes = of_manifest ? manifest : valid;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits && !bytes.empty(); ++e) {
      const size_t at = rng() % bytes.size();
      switch (rng() % 5) {
        case 0:
          bytes[at] = static_cast<char>(bytes[at] ^ (1 << (rng() % 8)));
          break;
        case 1:
          bytes[at] = "{}[]\":,0-9e \\"[rng() % 15];
          break;
        case 2:
          bytes.resize(at);
          break;
        case 3:
          bytes.insert(at, std::string(1 + rng() % 8, static_cast<char>(rng())));
          break;
        case 4:  // the header length, as a hostile writer would set it
          if (!of_manifest && bytes.size() >= 8) bytes[rng() % 8] = static_cast<char>(rng());
          break;
      }
    }
    try {
      if (of_manifest) {
        parse_checkpoint_manifest(bytes, "manifest.json");
      } else {
        const auto back = decode_safetensors(bytes, "fuzzed.safetensors");
        for (const auto& [name, tensor] : back.tensors) ASSERT_TRUE(tensor.defined()) << name;
      }
      ++decoded;
    } catch (const CheckpointError&) {
      ++refused;
    } catch (const std::exception& e) {
      FAIL() << "trial " << trial << ": not a CheckpointError: " << e.what();
    }
  }
  EXPECT_GT(refused, 1000) << "the damage should mostly be caught";
  EXPECT_GT(decoded, 0) << "some damage (inside tensor data, whitespace) leaves a valid file";
}

// Inputs fuzz/fuzz_checkpoint_json found: numbers JSON can write but the fields cannot hold.
// nlohmann would convert them silently (or, past double's range, throw its own out_of_range).
TEST(CheckpointJson, NumbersOutOfRangeOfTheirFieldAreRefusedNotConverted) {
  CheckpointTrainingState state;
  state.optimizer_steps = 3;
  state.scheduler_steps = {3};
  state.data_loaders = {{1, 64, 600, 42, true}};
  const std::string valid_state = format_checkpoint_state(state);
  EXPECT_NO_THROW(parse_checkpoint_state(valid_state, "state.json"));
  CheckpointManifest m;
  m.files = {{"model_0.pt", 10, 0xdeadbeef}};
  const std::string valid_manifest = format_checkpoint_manifest(m);

  auto with = [](std::string text, const std::string& from, const std::string& to) {
    const size_t at = text.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return text.replace(at, from.size(), to);
  };
  const std::vector<std::pair<std::string, std::string>> bad_states = {
      {"\"micro_steps\": 0", "\"micro_steps\": 3e52"},         // a float beyond int64
      {"\"micro_steps\": 0", "\"micro_steps\": 2.5"},          // not an integer
      {"\"seed\": 42", "\"seed\": -1"},                        // negative into unsigned
      {"\"step_count\": 3", "\"step_count\": 5000000000"},     // beyond unsigned (32-bit)
      {"\"epoch\": 1", "\"epoch\": 99999999999999999999999"},  // beyond uint64
      {"\"epoch\": 1", "\"epoch\": 6666661e30866666"},         // beyond double: json's overflow
  };
  for (const auto& [from, to] : bad_states) {
    try {
      parse_checkpoint_state(with(valid_state, from, to), "state.json");
      ADD_FAILURE() << to << " was accepted";
    } catch (const CheckpointError& e) {
      EXPECT_NE(std::string(e.what()).find("state.json"), std::string::npos) << e.what();
    } catch (const std::exception& e) {
      ADD_FAILURE() << to << ": not a CheckpointError: " << e.what();
    }
  }
  const std::vector<std::pair<std::string, std::string>> bad_manifests = {
      {"\"world_size\": 1", "\"world_size\": 1099511627776"},  // beyond int
      {"\"size\": 10", "\"size\": -3"},                        // negative into uint64
      {"\"step\": 0", "\"step\": 1e400"},                      // beyond double
  };
  for (const auto& [from, to] : bad_manifests) {
    EXPECT_THROW(parse_checkpoint_manifest(with(valid_manifest, from, to), "manifest.json"),
                 CheckpointError)
        << to;
  }
}

// Nesting bombs and oversized text in manifest.json and state.json (note "Bounded input"):
// refused with the file's name before parsing; before the check 100,000 '[' crashed the reader.
TEST(CheckpointJson, DeeplyNestedOrOversizedFilesAreRefusedBeforeParsing) {
  const std::string bomb = std::string(100000, '[') + std::string(100000, ']');
  std::string deep_objects;
  for (int i = 0; i < 100000; ++i) deep_objects += "{\"a\":";
  deep_objects += "1" + std::string(100000, '}');
  for (const std::string& text :
       {"{\"format\": \"accelerant-checkpoint\", \"files\": " + bomb + "}", deep_objects,
        "{\"contents\": " + std::string(100000, '[')}) {
    for (const bool manifest : {true, false}) {
      try {
        if (manifest)
          parse_checkpoint_manifest(text, "manifest.json");
        else
          parse_checkpoint_state(text, "state.json");
        ADD_FAILURE() << "a nesting bomb was accepted";
      } catch (const CheckpointError& e) {
        EXPECT_TRUE(t::contains(e.what(), std::string(manifest ? "manifest.json" : "state.json") +
                                              " nests lists and mappings more than 64 deep"))
            << std::string(e.what()).substr(0, 300);
      }
    }
  }
  const std::string oversized = std::string((64 << 20) + 1, ' ') + "{}";
  try {
    parse_checkpoint_state(oversized, "state.json");
    ADD_FAILURE() << "64 MiB of text was parsed";
  } catch (const CheckpointError& e) {
    EXPECT_TRUE(t::contains(e.what(),
                            "state.json has 67108867 bytes, more than the limit of "
                            "67108864"))
        << e.what();
  }
}

TEST(Safetensors, ParsesShardSizesAsAccelerateDoes) {
  EXPECT_EQ(parse_byte_size("10GB"), 10'000'000'000);
  EXPECT_EQ(parse_byte_size("2GiB"), int64_t{2} << 30);
  EXPECT_EQ(parse_byte_size("500kb"), 500'000);
  EXPECT_EQ(parse_byte_size("4096"), 4096);
  for (const char* bad : {"", "GB", "-1MB", "1.5GB", "10 parsecs", "0", "99999999999999TB"}) {
    EXPECT_THROW(parse_byte_size(bad), Error) << bad;
  }
}

TEST(SafetensorsModel, ShardsWithAnIndexAndLoadsBack) {
  const std::string dir = t::make_temp_dir();
  AllDtypes model;
  // linear.weight is 60 bytes: a 64-byte limit forces several shards.
  const auto saved = save_model_safetensors(*model, dir, 64);
  ASSERT_GT(saved.weight_files.size(), 2u);
  EXPECT_EQ(saved.weight_files[0],
            "model-00001-of-" +
                std::string(5 - std::to_string(saved.weight_files.size()).size(), '0') +
                std::to_string(saved.weight_files.size()) + ".safetensors");
  EXPECT_EQ(saved.index_file, "model.safetensors.index.json");
  const auto index = nlohmann::json::parse(slurp(dir + "/" + saved.index_file));
  int64_t bytes = 0;
  for (const auto& [name, tensor] : state_of(*model)) {
    bytes += tensor.numel() * tensor.element_size();
    EXPECT_TRUE(index["weight_map"].contains(name)) << name;
  }
  EXPECT_EQ(index["metadata"]["total_size"].get<int64_t>(), bytes);
  EXPECT_EQ(saved.total_bytes, bytes);
  for (const auto& file : saved.weight_files) {
    const auto shard = read_safetensors(dir + "/" + file);
    int64_t shard_bytes = 0;
    for (const auto& [n, tensor] : shard.tensors)
      shard_bytes += tensor.numel() * tensor.element_size();
    EXPECT_TRUE(shard_bytes <= 64 || shard.tensors.size() == 1)
        << file << " holds " << shard_bytes << " bytes";
    EXPECT_EQ(shard.metadata.at("format"), "pt");
  }

  AllDtypes other;
  torch::NoGradGuard no_grad;
  for (auto& [name, tensor] : state_of(*other)) {
    if (tensor.scalar_type() == torch::kBool)
      tensor.logical_not_();
    else
      tensor.zero_();
  }
  load_model_safetensors(*other, dir);
  for (const auto& [name, tensor] : state_of(*other))
    EXPECT_TRUE(torch::equal(tensor, state_of(*model).at(name))) << name;

  // Saving again in one file removes the shards and the index, keeps the user's files.
  spit(dir + "/config.json", "{}");
  const auto single = save_model_safetensors(*model, dir, parse_byte_size("10GB"));
  EXPECT_EQ(single.weight_files, std::vector<std::string>{"model.safetensors"});
  EXPECT_TRUE(single.index_file.empty());
  for (const auto& file : saved.weight_files)
    EXPECT_FALSE(std::ifstream(dir + "/" + file).good()) << file << " left behind";
  EXPECT_FALSE(std::ifstream(dir + "/model.safetensors.index.json").good());
  EXPECT_TRUE(std::ifstream(dir + "/config.json").good());
  EXPECT_EQ(read_model_safetensors(dir).size(), state_of(*model).size());
  t::remove_tree(dir);
}

// A save that stops part-way (a full disk, a failed gather) leaves the earlier save's files as
// they were: the new files are written under temporary names and take the real ones only when
// every one of them is complete, so the directory never holds a mix of two saves under the same
// names (which would load without a complaint). The temporary files are removed.
TEST(SafetensorsModel, ASaveStoppedPartWayLeavesTheEarlierSaveWhole) {
  const std::string dir = t::make_temp_dir();
  AllDtypes model;
  const auto saved = save_model_safetensors(*model, dir, 64);  // several files, as above
  ASSERT_GT(saved.weight_files.size(), 2u);
  std::map<std::string, std::string> before;
  for (const auto& name : accelerant::detail::list_directory(dir))
    before[name] = slurp(dir + "/" + name);
  {
    AllDtypes changed;
    torch::NoGradGuard no_grad;
    for (auto& [name, tensor] : state_of(*changed)) {
      if (tensor.is_floating_point()) tensor.add_(1);
    }
    const auto tensors = accelerant::detail::model_tensors_in_file_order(*changed);
    std::vector<accelerant::detail::TensorLayout> layouts;
    for (const auto& [name, tensor] : tensors)
      layouts.push_back(accelerant::detail::layout_of(name, tensor));
    accelerant::detail::ModelSafetensorsWriter writer(dir, layouts, 64);
    // Most files complete, then the save stops (the writer goes without finish()).
    for (size_t i = 0; i + 2 < tensors.size(); ++i) writer.write(tensors[i].second);
    int complete = 0;  // waiting under their temporary names, the old files untouched
    for (const auto& name : accelerant::detail::list_directory(dir)) {
      complete += name.size() > 8 && name.compare(name.size() - 8, 8, ".partial") == 0 ? 1 : 0;
    }
    EXPECT_GE(complete, 2) << "the writer should have finished files before it stopped";
  }
  std::map<std::string, std::string> after;
  for (const auto& name : accelerant::detail::list_directory(dir))
    after[name] = slurp(dir + "/" + name);
  EXPECT_EQ(after.size(), before.size()) << "files were added or removed";
  for (const auto& [name, bytes] : before) {
    EXPECT_TRUE(after.count(name) && after.at(name) == bytes) << name << " changed";
  }
  t::remove_tree(dir);
}

// The LibTorch-free header reader (what `accelerant checkpoint` uses) sees what the tensor reader
// sees, refuses what it refuses, and verify_safetensors also checks the data as decoding does.
TEST(SafetensorsHeader, AgreesWithTheTensorReaderOnSingleFilesAndShards) {
  const std::string dir = t::make_temp_dir();
  AllDtypes model;
  save_model_safetensors(*model, dir, 64);  // shards and an index
  const auto headers = read_model_safetensors_header(dir);
  const auto tensors = read_model_safetensors(dir);
  ASSERT_EQ(headers.size(), tensors.size());
  for (const auto& [name, tensor] : tensors) {
    const auto& info = headers.at(name);
    EXPECT_EQ(info.shape, tensor.sizes().vec()) << name;
    EXPECT_EQ(info.data_end - info.data_begin,
              static_cast<uint64_t>(tensor.numel() * tensor.element_size()))
        << name;
  }
  EXPECT_EQ(headers.at("b_bf16").dtype, "BF16");
  EXPECT_EQ(headers.at("b_bool").dtype, "BOOL");
  EXPECT_EQ(verify_model_safetensors(dir).size(), tensors.size());

  const std::string file = dir + "/one.safetensors";
  spit(file,
       raw_file(R"({"__metadata__":{"format":"pt"},"b":{"dtype":"BOOL","shape":[2],)"
                R"("data_offsets":[0,2]},"a":{"dtype":"F32","shape":[1],"data_offsets":[2,6]}})",
                std::string("\x01\x00", 2) + std::string(4, '\0')));
  const auto header = read_safetensors_header(file);
  ASSERT_EQ(header.tensors.size(), 2u);
  EXPECT_EQ(header.tensors[0].name, "b");  // in data order, as decoding lists them
  EXPECT_EQ(header.metadata.at("format"), "pt");
  EXPECT_EQ(verify_safetensors(file).tensors.size(), 2u);

  // A bool byte of 2: the header is fine, the data is not.
  spit(file, raw_file(R"({"b":{"dtype":"BOOL","shape":[2],"data_offsets":[0,2]}})", "\x01\x02"));
  EXPECT_EQ(read_safetensors_header(file).tensors.size(), 1u);
  EXPECT_THROW(verify_safetensors(file), CheckpointError);
  // A truncated file: both refuse it with the decoder's words, reading only the header.
  const std::string ok = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  spit(file, raw_file(ok, std::string(4, '\0')));
  try {
    read_safetensors_header(file);
    ADD_FAILURE() << "a truncated file was accepted";
  } catch (const CheckpointError& e) {
    EXPECT_EQ(std::string(e.what()), decode_error(slurp(file)).replace(0, 16, file));
  }
  EXPECT_THROW(read_safetensors_header(dir + "/absent.safetensors"), CheckpointError);
  t::remove_tree(dir);
}

TEST(SafetensorsModel, AMismatchedModelIsListedAndLeftUnchanged) {
  const std::string dir = t::make_temp_dir();
  torch::nn::Sequential saved_model(torch::nn::Linear(4, 8), torch::nn::ReLU(),
                                    torch::nn::Linear(8, 2));
  save_model_safetensors(*saved_model, dir, 1 << 20);
  torch::nn::Sequential other(torch::nn::Linear(4, 16), torch::nn::ReLU(), torch::nn::Linear(16, 2),
                              torch::nn::Linear(2, 2));
  const auto before = other->parameters()[0].clone();
  try {
    load_model_safetensors(*other, dir);
    FAIL() << "a mismatched model loaded";
  } catch (const CheckpointError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("not in the checkpoint: 3.bias, 3.weight"), std::string::npos) << m;
    EXPECT_NE(m.find("0.weight saved [8, 4], model [16, 4]"), std::string::npos) << m;
    EXPECT_NE(m.find("nothing was loaded"), std::string::npos) << m;
  }
  EXPECT_TRUE(torch::equal(other->parameters()[0], before));

  // A shard of another save mixed in: caught by the index check.
  save_model_safetensors(*saved_model, dir, 40);
  const std::string second = dir + "/model-00002-of-00004.safetensors";
  ASSERT_TRUE(std::ifstream(second).good());
  spit(second, slurp(dir + "/model-00001-of-00004.safetensors"));
  try {
    read_model_safetensors(dir);
    FAIL() << "mixed shards were read";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("shards of two saves mixed"), std::string::npos)
        << e.what();
  }
  t::remove_tree(dir);
}

// Our files read by an independent implementation, and its (differently laid out) file read by us.
TEST(SafetensorsInterop, AnIndependentJsonAndNumpyReaderAgrees) {
  auto probe = t::start_program({"/usr/bin/python3", "-c", "import numpy"});
  std::string probe_out;
  if (t::finish_program(probe, probe_out, std::chrono::seconds(30)) != 0) {
    GTEST_SKIP() << "/usr/bin/python3 with numpy (python3-numpy) is not installed: " << probe_out;
  }
  for (int64_t shard : {int64_t{1} << 20, int64_t{48}}) {
    const std::string dir = t::make_temp_dir();
    AllDtypes model;
    const auto saved = save_model_safetensors(*model, dir, shard);
    auto run = t::start_program({"/usr/bin/python3", t::test_file_path("safetensors_interop.py"),
                                 dir, dir + "/py.safetensors"});
    std::string out;
    ASSERT_EQ(t::finish_program(run, out, std::chrono::seconds(60)), 0) << out;
    const auto summary = nlohmann::json::parse(out);
    EXPECT_EQ(summary["files"].get<size_t>(), saved.weight_files.size());
    EXPECT_EQ(summary["tensors"].get<size_t>(), state_of(*model).size());
    EXPECT_EQ(summary["format"], "pt");

    const auto back = read_safetensors(dir + "/py.safetensors");
    EXPECT_EQ(back.metadata.at("written_by"), "safetensors_interop.py");
    ASSERT_EQ(back.tensors.size(), state_of(*model).size());
    EXPECT_GT(back.tensors.front().first, back.tensors.back().first)
        << "python wrote reverse name order";
    for (const auto& [name, tensor] : back.tensors) {
      const torch::Tensor original = state_of(*model).at(name);
      ASSERT_EQ(tensor.scalar_type(), original.scalar_type()) << name;
      const torch::Tensor expected =
          original.scalar_type() == torch::kBool ? original.logical_not() : original * 2;
      EXPECT_TRUE(torch::equal(tensor, expected.to(original.scalar_type()))) << name;
    }
    t::remove_tree(dir);
  }
}

// Accelerator::save_model writes once from the main process and every rank can load it.
TEST(SafetensorsAccelerator, SaveModelOnTwoProcesses) {
  const std::string dir = t::make_temp_dir();
  launch(
      [dir](int) {
        Accelerator accelerator;
        torch::manual_seed(1);
        auto model = accelerator.prepare(torch::nn::Linear(6, 4));
        accelerator.save_model(model, dir, "64B");
        torch::manual_seed(99);
        auto other = torch::nn::Linear(6, 4);
        accelerator.load_model(other, dir);
        if (!torch::equal(other->weight, model->weight))
          throw std::runtime_error("weights differ after load_model");
        try {
          accelerator.save_model(model, dir, "a lot");
          throw std::runtime_error("a bad size was accepted");
        } catch (const Error&) {
        }
        return 0;
      },
      LaunchOptions()
          .processes_per_node(2)
          .collective_timeout(std::chrono::seconds(60))
          .verbose(false));
  EXPECT_TRUE(std::ifstream(dir + "/model.safetensors.index.json").good());
  t::remove_tree(dir);
}

}  // namespace
