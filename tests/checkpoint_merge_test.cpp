// `accelerant checkpoint merge` (merge_checkpoint): a checkpoint that 2 real processes saved
// under ZeRO stage 2 becomes model.safetensors holding exactly the trained weights (read by the
// library and by an independent reader), and an optimizer_0.pt that a 1-process run without ZeRO
// loads and continues from exactly as a resume from the shards does; a missing shard and an
// existing OUT are refused with the file named and nothing written.
#include <accelerant/accelerant.h>
#include <accelerant/checkpoint.h>
#include <accelerant/checkpoint_merge.h>
#include <accelerant/safetensors.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <zlib.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "test_support.h"

using namespace accelerant;
using namespace accelerant::testing;

namespace {

constexpr int kGlobalBatch = 8;
constexpr int kSavedAt = 6;  // optimizer steps in the checkpoint
constexpr int kSteps = 12;   // continuations run to here

// Parameters of odd sizes, so that the two ranks' shares cut through parameters.
torch::nn::Sequential merge_model() {
  torch::manual_seed(5);
  return torch::nn::Sequential(torch::nn::Linear(16, 301), torch::nn::Tanh(),
                               torch::nn::Linear(301, 77), torch::nn::Tanh(),
                               torch::nn::Linear(77, 4));
}

std::pair<torch::Tensor, torch::Tensor> global_batch(int step) {
  torch::manual_seed(2000 + step);
  return {torch::randn({kGlobalBatch, 16}), torch::randn({kGlobalBatch, 4})};
}

struct TrainingRun {
  int stage = 0;
  bool fused_type = false;  // accelerant::FusedAdamW (state at the top) instead of prepare's
  int steps = kSavedAt;
  std::string load_dir;  // start from this checkpoint
  std::string save_dir;  // save after the last step
};

// Trains with a fused AdamW; returns the parameters, flattened.
torch::Tensor train(int rank, int world, const TrainingRun& run) {
  Accelerator acc(
      AcceleratorOptions().cpu(true).zero_stage(run.stage).fused_optimizers(true).bucket_cap_mb(1));
  auto model = merge_model();
  const auto options = torch::optim::AdamWOptions(1e-3).weight_decay(0.01);
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  if (run.fused_type) {
    optimizer = std::make_unique<FusedAdamW>(model->parameters(), options);
  } else {
    optimizer = std::make_unique<torch::optim::AdamW>(model->parameters(), options);
  }
  auto [m, opt] = acc.prepare(model, *optimizer);
  int first = 0;
  if (!run.load_dir.empty()) {
    acc.load_state(run.load_dir);
    first = static_cast<int>(acc.state()->optimizer_steps);
  }
  const int per_rank = kGlobalBatch / world;
  for (int step = first; step < run.steps; ++step) {
    auto [x, y] = global_batch(step);
    x = x.narrow(0, rank * per_rank, per_rank), y = y.narrow(0, rank * per_rank, per_rank);
    auto loss = (m->forward(x) - y).pow(2).mean();
    acc.backward(loss);
    opt.step();
    opt.zero_grad();
  }
  if (!run.save_dir.empty()) acc.save_state(run.save_dir);
  return flat_parameters(*m);
}

std::vector<torch::Tensor> train_on(int world, const TrainingRun& run) {
  auto options = LaunchOptions()
                     .processes_per_node(world)
                     .collective_timeout(std::chrono::seconds(90))
                     .verbose(false);
  return launch([run, world](int rank) { return train(rank, world, run); }, options);
}

// The CLI's exit status (-1: killed at the limit) and its output.
std::pair<int, std::string> cli(const std::vector<std::string>& args) {
  std::vector<std::string> argv{cli_path()};
  argv.insert(argv.end(), args.begin(), args.end());
  auto program = start_program(argv);
  std::string output;
  const int status = finish_program(program, output, std::chrono::seconds(60));
  return {status >= 0 && WIFEXITED(status) ? WEXITSTATUS(status) : -1, output};
}

void copy_file(const std::string& from, const std::string& to) {
  const std::string bytes = slurp(from);
  std::ofstream(to, std::ios::binary | std::ios::trunc).write(bytes.data(), bytes.size());
}

// Puts `file` in place of checkpoint `dir`'s `name` (optimizer_0.pt by default), with the
// manifest's size and CRC-32 updated ("re-signed"), so that verify passes and load_state reads it
// as that run's own.
void replace_optimizer_file(const std::string& dir, const std::string& file,
                            const std::string& name = "optimizer_0.pt") {
  copy_file(file, dir + "/" + name);
  const std::string bytes = slurp(file);
  CheckpointManifest manifest = read_checkpoint_manifest(dir);
  bool found = false;
  for (auto& entry : manifest.files) {
    if (entry.path != name) continue;
    entry.size = bytes.size();
    entry.crc32 = static_cast<uint32_t>(
        ::crc32(0, reinterpret_cast<const Bytef*>(bytes.data()), static_cast<uInt>(bytes.size())));
    found = true;
  }
  ASSERT_TRUE(found) << dir << " has no " << name;
  std::ofstream(dir + "/manifest.json", std::ios::trunc) << format_checkpoint_manifest(manifest);
  verify_checkpoint(dir);
}

class CheckpointMerge : public ::testing::TestWithParam<bool> {};

// The whole path: 2 ranks under ZeRO stage 2 save shards; the merge's weights are the trained
// ones; its optimizer state, loaded by 1 process without ZeRO, continues as a resume from the
// shards does.
TEST_P(CheckpointMerge, ShardedCheckpointBecomesWeightsAndWholeOptimizerState) {
  ScratchDir scratch;
  const std::string ckpt = scratch.path + "/ckpt", out = scratch.path + "/merged";
  TrainingRun saved;
  saved.stage = 2;
  saved.fused_type = GetParam();
  saved.save_dir = ckpt;
  const auto trained = train_on(2, saved);
  ASSERT_TRUE(std::ifstream(ckpt + "/rank_1/optimizer_0.pt").good()) << "not saved in shards";
  ASSERT_FALSE(std::ifstream(ckpt + "/optimizer_0.pt").good());

  const auto [status, output] = cli({"checkpoint", "merge", "--optimizer", ckpt, out});
  ASSERT_EQ(status, 0) << output;
  EXPECT_TRUE(contains(output, out + "/model.safetensors")) << output;
  EXPECT_TRUE(contains(output, "1 optimizer(s) in ZeRO shards")) << output;

  // The weights, exactly, through the library's reader into a plain model.
  auto plain = merge_model();
  for (auto& p : plain->parameters()) p.data().zero_();
  load_model_safetensors(*plain, out);
  EXPECT_TRUE(torch::equal(flat_parameters(*plain), trained[0]))
      << "model.safetensors does not hold the trained weights";
  const auto file = read_safetensors(out + "/model.safetensors");
  EXPECT_EQ(file.metadata.at("format"), "pt");
  EXPECT_EQ(file.tensors.size(), plain->named_parameters().size());

  // An independent reader (json + numpy) reads every tensor; it writes them back doubled.
  auto numpy = start_program({"/usr/bin/python3", "-c", "import numpy"});
  std::string probe;
  if (finish_program(numpy, probe, std::chrono::seconds(30)) != 0) {
    std::cout << "[ SKIPPED  ] independent reader: /usr/bin/python3 has no numpy: " << probe;
  } else {
    auto reader = start_program({"/usr/bin/python3", test_file_path("safetensors_interop.py"), out,
                                 scratch.path + "/doubled.safetensors"});
    std::string summary;
    ASSERT_EQ(finish_program(reader, summary, std::chrono::seconds(60)), 0) << summary;
    EXPECT_EQ(nlohmann::json::parse(summary)["tensors"].get<size_t>(), file.tensors.size());
    for (const auto& [name, tensor] :
         read_safetensors(scratch.path + "/doubled.safetensors").tensors)
      EXPECT_TRUE(torch::equal(tensor, plain->named_parameters()[name] * 2)) << name;
  }
  // Python's safetensors, when installed (Debian: python3-safetensors).
  auto python = start_program({"/usr/bin/python3", "-c", "import safetensors.torch"});
  if (finish_program(python, probe, std::chrono::seconds(30)) != 0) {
    std::cout << "[ SKIPPED  ] Python's safetensors is not importable by /usr/bin/python3\n";
  } else {
    auto reader =
        start_program({"/usr/bin/python3", "-c",
                       "import sys, safetensors.torch as s; t = s.load_file(sys.argv[1]); "
                       "print(len(t), float(sum(v.double().sum() for v in t.values())))",
                       out + "/model.safetensors"});
    std::string printed;
    ASSERT_EQ(finish_program(reader, printed, std::chrono::seconds(60)), 0) << printed;
    EXPECT_TRUE(contains(printed, std::to_string(file.tensors.size()) + " ")) << printed;
  }

  // The optimizer state: a 1-process run without ZeRO saves its own checkpoint after loading the
  // shards; its optimizer_0.pt is replaced by the merged one, and it must continue exactly as the
  // resume from the shards.
  TrainingRun resume;
  resume.fused_type = GetParam();
  resume.load_dir = ckpt;
  resume.steps = kSavedAt;
  resume.save_dir = scratch.path + "/plain";
  train_on(1, resume);
  replace_optimizer_file(resume.save_dir, out + "/optimizer_0.pt");
  resume.save_dir.clear();
  resume.steps = kSteps;
  const auto from_shards = train_on(1, resume);
  resume.load_dir = scratch.path + "/plain";
  const auto from_merged = train_on(1, resume);
  EXPECT_TRUE(torch::equal(from_merged[0], from_shards[0]))
      << "the merged optimizer state continues otherwise than the shards: largest difference "
      << (from_merged[0] - from_shards[0]).abs().max().item<double>();
  EXPECT_GT((from_merged[0] - trained[0]).abs().max().item<double>(), 1e-4) << "nothing trained";
  // And as the 2 ranks under ZeRO continue, up to the order of fp32 sums.
  TrainingRun zero = resume;
  zero.stage = 2;
  zero.load_dir = ckpt;
  const auto two = train_on(2, zero);
  EXPECT_LT((from_merged[0] - two[0]).abs().max().item<double>(), 2e-5);

  // The library call says what it wrote.
  const MergedCheckpoint merged =
      merge_checkpoint(ckpt, scratch.path + "/again", MergeCheckpointOptions().optimizer(true));
  EXPECT_EQ(merged.world_size, 2);
  EXPECT_EQ(merged.step, kSavedAt);
  EXPECT_EQ(merged.sharded_optimizers, 1);
  ASSERT_EQ(merged.models.size(), 1u);
  EXPECT_EQ(merged.models[0].path, scratch.path + "/again/model.safetensors");
  EXPECT_EQ(merged.models[0].tensors, static_cast<int64_t>(file.tensors.size()));
  EXPECT_EQ(merged.models[0].bytes, static_cast<int64_t>(slurp(out + "/model.safetensors").size()));
  ASSERT_EQ(merged.optimizers.size(), 1u);
  EXPECT_GE(merged.optimizers[0].tensors, 3);  // step counts and two moments at least
  EXPECT_EQ(slurp(merged.optimizers[0].path), slurp(out + "/optimizer_0.pt"));
}

INSTANTIATE_TEST_SUITE_P(PreparedAdamWAndFusedAdamW, CheckpointMerge, ::testing::Bool());

// One sharded checkpoint for the failure tests.
class CheckpointMergeRefuses : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = make_temp_dir();
    TrainingRun run;
    run.stage = 2;
    run.steps = 2;
    run.save_dir = dir_ + "/ckpt";
    train_on(2, run);
  }
  static void TearDownTestSuite() { remove_tree(dir_); }
  static std::string dir_;
};
std::string CheckpointMergeRefuses::dir_;

TEST_F(CheckpointMergeRefuses, AMissingShardNamingItsRankAndWritesNothing) {
  const std::string broken = dir_ + "/missing_shard", out = dir_ + "/out_missing";
  ASSERT_EQ(std::system(("cp -r " + dir_ + "/ckpt " + broken).c_str()), 0);
  ASSERT_EQ(std::remove((broken + "/rank_1/optimizer_0.pt").c_str()), 0);
  const auto [status, output] = cli({"checkpoint", "merge", "--optimizer", broken, out});
  EXPECT_EQ(status, 1) << output;
  EXPECT_TRUE(contains(output, "rank 1's shard of optimizer 0 (rank_1/optimizer_0.pt) is missing"))
      << output;
  EXPECT_TRUE(contains(output, "Fix: copy rank_1/")) << output;
  EXPECT_FALSE(std::ifstream(out + "/model.safetensors").good()) << "a partial OUT was left";
  // Nor a temporary directory beside it.
  for (const auto& entry : std::filesystem::directory_iterator(dir_))
    EXPECT_NE(entry.path().filename().string().rfind(".out_missing", 0), 0u) << entry.path();
}

TEST_F(CheckpointMergeRefuses, AnExistingOutUnlessForced) {
  const std::string out = dir_ + "/out_existing";
  ASSERT_EQ(std::system(("mkdir -p " + out).c_str()), 0);
  std::ofstream(out + "/notes.txt") << "mine";
  const auto [status, output] = cli({"checkpoint", "merge", dir_ + "/ckpt", out});
  EXPECT_EQ(status, 1) << output;
  EXPECT_TRUE(contains(output, "it exists and is not empty")) << output;
  EXPECT_TRUE(contains(output, "--force")) << output;
  EXPECT_EQ(slurp(out + "/notes.txt"), "mine");
  EXPECT_FALSE(std::ifstream(out + "/model.safetensors").good());

  const auto [forced, forced_output] = cli({"checkpoint", "merge", "--force", dir_ + "/ckpt", out});
  EXPECT_EQ(forced, 0) << forced_output;
  EXPECT_TRUE(std::ifstream(out + "/model.safetensors").good());
  EXPECT_FALSE(std::ifstream(out + "/notes.txt").good()) << "--force replaces OUT as a whole";
}

TEST_F(CheckpointMergeRefuses, ADamagedOrAbsentCheckpoint) {
  const std::string damaged = dir_ + "/damaged";
  ASSERT_EQ(std::system(("cp -r " + dir_ + "/ckpt " + damaged).c_str()), 0);
  std::ofstream(damaged + "/model_0.pt", std::ios::binary | std::ios::in | std::ios::out)
      .write("XXXX", 4);
  auto [status, output] = cli({"checkpoint", "merge", damaged, dir_ + "/out_damaged"});
  EXPECT_EQ(status, 1) << output;
  EXPECT_TRUE(contains(output, "model_0.pt is corrupted")) << output;
  EXPECT_TRUE(contains(output, "Nothing was written")) << output;

  std::tie(status, output) = cli({"checkpoint", "merge", dir_ + "/nothing", dir_ + "/out_none"});
  EXPECT_EQ(status, 1) << output;
  EXPECT_TRUE(contains(output, "no checkpoint at " + dir_ + "/nothing")) << output;
}

// Issue 38: a shard of an older checkpoint put into a newer one and re-signed (its checksum
// rewritten) passes verify, which checks only bytes; merge and load refuse it, naming the shard,
// because the shards of one save agree on every parameter's update count. auto_resume then falls
// back to the older checkpoint, as for one that does not verify.
TEST(CheckpointSemantics, AnOlderShardResignedIntoANewerCheckpointIsRefusedAndResumeFallsBack) {
  ScratchDir scratch;
  const std::string project = scratch.path + "/project";
  auto run = [project](int rank, bool resume) {
    Accelerator acc(AcceleratorOptions()
                        .cpu(true)
                        .zero_stage(2)
                        .bucket_cap_mb(1)
                        .project_dir(project)
                        .auto_resume(resume));
    auto model = merge_model();
    torch::optim::AdamW adamw(model->parameters(), torch::optim::AdamWOptions(1e-3));
    // auto_resume is armed by a prepared loader (whose position it restores): both runs prepare
    // one, unused otherwise.
    auto [m, opt, loader] =
        acc.prepare(model, adamw,
                    make_data_loader(torch::zeros({16, 16}), torch::zeros({16, 4}),
                                     DataLoaderOptions().batch_size(4)));
    if (resume) {
      acc.auto_resume_now();
      return static_cast<int64_t>(acc.state()->optimizer_steps);
    }
    for (int step = 0; step < kSavedAt; ++step) {
      auto [x, y] = global_batch(step);
      x = x.narrow(0, rank * 4, 4), y = y.narrow(0, rank * 4, 4);
      acc.backward((m->forward(x) - y).pow(2).mean());
      opt.step();
      opt.zero_grad();
      if (step + 1 == kSavedAt / 2 || step + 1 == kSavedAt) acc.save_state();
    }
    return static_cast<int64_t>(acc.state()->optimizer_steps);
  };
  auto options = LaunchOptions()
                     .processes_per_node(2)
                     .collective_timeout(std::chrono::seconds(90))
                     .verbose(false);
  launch([&](int rank) { return run(rank, false); }, options);
  const std::string older = project + "/checkpoints/checkpoint_0";
  const std::string newer = project + "/checkpoints/checkpoint_1";
  replace_optimizer_file(newer, older + "/rank_1/optimizer_0.pt", "rank_1/optimizer_0.pt");

  const auto [status, out] =
      cli({"checkpoint", "merge", "--optimizer", newer, scratch.path + "/merged"});
  EXPECT_NE(status, 0) << out;
  EXPECT_TRUE(out.find("shard 1 was saved at another step than shard 0") != std::string::npos)
      << out;
  EXPECT_FALSE(std::filesystem::exists(scratch.path + "/merged")) << "nothing written";
  // verify checks what the files hold, not only their bytes: the newer checkpoint is refused
  // naming its shards, the older one passes, and the folder counts one of two.
  const auto [bad, bad_out] = cli({"checkpoint", "verify", newer});
  EXPECT_EQ(bad, 1) << bad_out;
  EXPECT_TRUE(bad_out.find("do not belong together") != std::string::npos) << bad_out;
  EXPECT_TRUE(bad_out.find("shard 1 was saved at another step") != std::string::npos) << bad_out;
  const auto [good, good_out] = cli({"checkpoint", "verify", older});
  EXPECT_EQ(good, 0) << good_out;
  EXPECT_TRUE(good_out.find("every file holds what its name says") != std::string::npos)
      << good_out;
  const auto [folder, folder_out] = cli({"checkpoint", "verify", project + "/checkpoints"});
  EXPECT_EQ(folder, 1) << folder_out;
  EXPECT_TRUE(folder_out.find("1 of 2 checkpoint(s) verified") != std::string::npos) << folder_out;

  const auto resumed = launch([&](int rank) { return run(rank, true); }, options);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(resumed[r], kSavedAt / 2) << "rank " << r << " should have fallen back to " << older;
  }
}

// A model's file swapped with an optimizer's, the manifest re-signed: verify names the file and
// what it holds; load_state refuses it in words (no LibTorch backtrace) and changes nothing.
TEST(CheckpointSemantics, AModelFileThatHoldsAnOptimizersStateIsNamed) {
  ScratchDir scratch;
  const std::string ckpt = scratch.path + "/ckpt";
  TrainingRun saved;
  saved.save_dir = ckpt;
  train_on(1, saved);
  ASSERT_EQ(cli({"checkpoint", "verify", ckpt}).first, 0);
  replace_optimizer_file(ckpt, ckpt + "/optimizer_0.pt", "model_0.pt");
  const auto [status, out] = cli({"checkpoint", "verify", ckpt});
  EXPECT_EQ(status, 1) << out;
  EXPECT_TRUE(out.find("model_0.pt holds an optimizer's state, not a model's") != std::string::npos)
      << out;
  TrainingRun resumed;
  resumed.load_dir = ckpt;
  try {
    train_on(1, resumed);
    ADD_FAILURE() << "a checkpoint whose model file holds an optimizer's state was loaded";
  } catch (const LaunchError& e) {
    const std::string m = e.what();
    EXPECT_TRUE(m.find("model_0.pt") != std::string::npos) << m;
    EXPECT_EQ(m.find("frame #"), std::string::npos) << "LibTorch's backtrace: " << m;
  }
}

TEST(CheckpointMergeHelp, TeachesWhatItWritesAndHowToLoadIt) {
  const auto [status, output] = cli({"checkpoint", "merge", "--help"});
  EXPECT_EQ(status, 0) << output;
  for (const char* part : {"model.safetensors", "--optimizer", "--force",
                           "Examples:", "load_model_safetensors", "safetensors.torch.load_file"}) {
    EXPECT_TRUE(contains(output, part)) << part << " not in:\n" << output;
  }
  const auto [listed, listing] = cli({"checkpoint", "--help"});
  EXPECT_TRUE(contains(listing, "merge")) << listing;
}

}  // namespace
