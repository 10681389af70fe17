// examples/gpt end to end on a text generated here (no ../shared on a user's machine): a tiny GPT
// trained on 2 processes reaches the text's entropy floor, which a broken causal mask, schedule
// or window sampler cannot reach; its samples are made of the text's words; --sample reads the
// best weights back; a worker SIGKILLed under `accelerant launch --max_restarts 1` resumes and
// ends bit-identical to the uninterrupted run; torchrun trains as the fork launcher does.
#include <accelerant/safetensors.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cmath>
#include <csignal>
#include <fstream>
#include <random>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "test_support.h"

using namespace accelerant::testing;

namespace {

const std::vector<std::string> kWords{"the", "cat", "sat", "on", "mat", "and", "dog", "ran"};

// 40,000 words drawn uniformly from kWords, separated by spaces. Once a word has begun the rest
// of it is certain and so is the space after it; only a word's first letter is a draw among 8.
// So the best possible loss is ln 8 per word, ln 8 / 3.875 = 0.537 nats per character, and only
// a model that looks back at least 3 characters gets there (2: 0.582, 1, as a model whose
// attention sees only its own position: 0.871). A mask that lets a position see the next one,
// or targets not shifted by one, go below it; a schedule that never trains stays near ln 13.
std::string write_word_text(const std::string& path) {
  std::mt19937 random(5);
  std::uniform_int_distribution<size_t> pick(0, kWords.size() - 1);
  std::string text;
  for (int i = 0; i < 40000; ++i) text += (i ? " " : "") + kWords[pick(random)];
  std::ofstream(path) << text;
  return path;
}

std::string gpt_path() { return cli_path().substr(0, cli_path().rfind('/')) + "/gpt"; }

int exit_code(int status) { return WIFEXITED(status) ? WEXITSTATUS(status) : -1; }

// A tiny configuration that trains in seconds: 2 layers, 2 heads, 32 wide, context 32.
std::vector<std::string> tiny_gpt(const std::string& input, const std::string& out_dir) {
  return {"--input",          input, "--out_dir",       out_dir, "--n_layer",        "2",
          "--n_head",         "2",   "--n_embd",        "32",    "--block_size",     "32",
          "--batch_size",     "8",   "--max_iters",     "300",   "--warmup_iters",   "20",
          "--lr_decay_iters", "300", "--learning_rate", "3e-3",  "--min_lr",         "3e-4",
          "--eval_interval",  "50",  "--eval_iters",    "10",    "--max_new_tokens", "200"};
}

int run(std::vector<std::string> argv, std::string& output,
        std::chrono::seconds limit = std::chrono::seconds(90)) {
  auto program = start_program(argv);
  output.clear();
  return exit_code(finish_program(program, output, limit));
}

double whole_split_loss(const std::string& output) {
  std::smatch m;
  static const std::regex line("val loss over the whole validation split: ([0-9.]+)");
  return std::regex_search(output, m, line) ? std::stod(m[1]) : NAN;
}

// The "step N: train loss X, val loss Y" lines, in order.
std::vector<std::string> evaluation_lines(const std::string& output) {
  std::vector<std::string> lines;
  static const std::regex line("step [0-9]+: train loss [0-9.]+, val loss [0-9.]+");
  for (auto it = std::sregex_iterator(output.begin(), output.end(), line);
       it != std::sregex_iterator(); ++it) {
    lines.push_back(it->str());
  }
  return lines;
}

// The fraction of the space-separated pieces of `text` (first and last left out: cut words)
// that are words of kWords.
double fraction_of_words(const std::string& text) {
  std::istringstream in(text);
  std::vector<std::string> pieces;
  for (std::string piece; in >> piece;) pieces.push_back(piece);
  if (pieces.size() < 3) return 0;
  const std::set<std::string> words(kWords.begin(), kWords.end());
  int known = 0;
  for (size_t i = 1; i + 1 < pieces.size(); ++i) known += words.count(pieces[i]) ? 1 : 0;
  return static_cast<double>(known) / static_cast<double>(pieces.size() - 2);
}

// The text between the sampling separators of the example's output.
std::string first_sample(const std::string& output) {
  const std::string separator = "---------------\n";
  const auto begin = output.find(separator);
  if (begin == std::string::npos) return "";
  const auto end = output.find(separator, begin + separator.size());
  return output.substr(begin + separator.size(), end - begin - separator.size());
}

}  // namespace

TEST(GptExample, TwoProcessesTrainToTheTextsEntropyFloorAndSampleItsWords) {
  ScratchDir scratch;
  const auto input = write_word_text(scratch.path + "/words.txt");
  auto argv = tiny_gpt(input, scratch.path + "/run");
  argv.insert(argv.begin(), {gpt_path(), "--world_size", "2"});
  std::string out;
  ASSERT_EQ(run(argv, out), 0) << out;
  EXPECT_TRUE(contains(out, "Training on 2 processes")) << out;
  const auto evaluations = evaluation_lines(out);
  ASSERT_EQ(evaluations.size(), 7u) << out;  // steps 0, 50, ..., 300
  const double loss = whole_split_loss(out);
  EXPECT_GT(loss, 0.45) << "below the entropy floor 0.537: the model sees what it predicts\n"
                        << out;
  EXPECT_LT(loss, 0.65) << "far above the floor 0.537: it did not learn the words\n" << out;
  EXPECT_GE(fraction_of_words(first_sample(out)), 0.8) << out;
  EXPECT_TRUE(contains(out, "done: 300 iterations")) << out;

  // --sample: the best weights (safetensors) and gpt.json, in a process of its own.
  ASSERT_EQ(run({gpt_path(), "--sample", "--out_dir", scratch.path + "/run", "--start", "the ",
                 "--max_new_tokens", "200"},
                out),
            0)
      << out;
  EXPECT_GE(fraction_of_words(out.substr(0, out.find("---------------"))), 0.8) << out;
}

TEST(GptExample, AWorkerKilledUnderMaxRestartsResumesAndEndsBitIdentical) {
  ScratchDir scratch;
  const auto input = write_word_text(scratch.path + "/words.txt");
  const std::string uninterrupted = scratch.path + "/uninterrupted",
                    interrupted = scratch.path + "/interrupted";
  auto command = [&](const std::string& out_dir, std::vector<std::string> launch) {
    launch.insert(launch.begin(), cli_path());
    launch.push_back(gpt_path());
    for (auto& a : tiny_gpt(input, out_dir)) launch.push_back(a);
    return launch;
  };
  std::string expected;
  ASSERT_EQ(
      run(command(uninterrupted, {"launch", "-n", "2", "--main_process_port", "0"}), expected), 0)
      << expected;

  auto launcher = start_program(command(
      interrupted, {"launch", "-n", "2", "--main_process_port", "0", "--max_restarts", "1"}));
  // Rank 1 dies as soon as the second checkpoint (iteration 100 of 300) appears: the first is
  // complete by then, whether the second is or not.
  pid_t killed = -1;
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (killed < 0 && std::chrono::steady_clock::now() < give_up) {
    if (std::ifstream(interrupted + "/checkpoints/checkpoint_1/manifest.json")) {
      for (pid_t child : children_of(launcher.pid)) {
        if (environment_of(child, "RANK") == "1") {
          ::kill(child, SIGKILL);
          killed = child;
        }
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  std::string resumed;
  const int status = finish_program(launcher, resumed, std::chrono::seconds(90));
  ASSERT_GT(killed, 0) << "no checkpoint appeared, or no rank 1 worker was found:\n" << resumed;
  ASSERT_EQ(exit_code(status), 0) << resumed;
  EXPECT_TRUE(contains(resumed, "resumed at iteration")) << resumed;
  EXPECT_TRUE(wait_until_dead({killed}, std::chrono::seconds(5)).empty());

  // The same evaluations from the resumed iteration on (the resumed run repeats the one at its
  // checkpoint), the same final loss to the last digit, the same best weights byte for byte.
  const auto before = evaluation_lines(expected), after = evaluation_lines(resumed);
  ASSERT_EQ(before.size(), 7u) << expected;
  ASSERT_GE(after.size(), before.size()) << resumed;
  for (size_t i = 0; i < before.size(); ++i) {
    EXPECT_EQ(after[after.size() - before.size() + i], before[i]) << resumed;
  }
  EXPECT_EQ(whole_split_loss(resumed), whole_split_loss(expected)) << resumed;
  const std::string weights = "/best/model.safetensors";
  ASSERT_FALSE(slurp(uninterrupted + weights).empty());
  EXPECT_EQ(slurp(interrupted + weights), slurp(uninterrupted + weights));
}

// The same program under each way of starting it: forked by accelerant::launch, and under
// torchrun (Debian's python3-torch, when installed) with the same evaluations to the last digit;
// and in one process.
TEST(GptExample, TorchrunAndTheForkLauncherTrainAlikeAndOneProcessTrains) {
  ScratchDir scratch;
  const auto input = write_word_text(scratch.path + "/words.txt");
  auto short_run = [&](const std::string& out_dir) {
    auto args = tiny_gpt(input, scratch.path + "/" + out_dir);
    for (size_t i = 0; i + 1 < args.size(); ++i) {
      if (args[i] == "--max_iters") args[i + 1] = "40";
      if (args[i] == "--eval_interval") args[i + 1] = "20";
    }
    return args;
  };
  std::vector<std::string> forked_argv{gpt_path(), "--world_size", "2"};
  for (auto& a : short_run("forked")) forked_argv.push_back(a);
  std::string forked;
  ASSERT_EQ(run(forked_argv, forked), 0) << forked;
  ASSERT_EQ(evaluation_lines(forked).size(), 3u) << forked;

  std::vector<std::string> single_argv{gpt_path(), "--world_size", "1"};
  for (auto& a : short_run("single")) single_argv.push_back(a);
  std::string single;
  ASSERT_EQ(run(single_argv, single), 0) << single;
  EXPECT_TRUE(contains(single, "Training on 1 process x")) << single;
  EXPECT_EQ(evaluation_lines(single).size(), 3u) << single;

  std::string probe;
  if (run({"/usr/bin/python3", "-c", "import torch.distributed.run"}, probe) != 0) {
    GTEST_SKIP() << "torchrun (python3-torch) is not installed: " << probe;
  }
  std::vector<std::string> torchrun_command = torchrun_argv(2);
  torchrun_command.push_back(gpt_path());
  for (auto& a : short_run("torchrun")) torchrun_command.push_back(a);
  std::string torchrun;
  ASSERT_EQ(run(torchrun_command, torchrun, std::chrono::seconds(120)), 0) << torchrun;
  EXPECT_TRUE(contains(torchrun, "started by torchrun as rank 0 of 2")) << torchrun;
  EXPECT_EQ(evaluation_lines(torchrun), evaluation_lines(forked)) << "torchrun:\n"
                                                                  << torchrun << "\nforked:\n"
                                                                  << forked;
}

// --zero_stage 3: each block's parameters sharded over the 2 processes. The evaluations follow
// stage 0's (up to the rounding of another reduction order), the run resumes from its own
// checkpoint (each process's optimizer state of its shares), and the best weights it saved load
// into an unsharded model for --sample (the wrapper adds no name).
TEST(GptExample, ZeroStage3TrainsAsStage0ResumesAndItsWeightsSample) {
  ScratchDir scratch;
  const auto input = write_word_text(scratch.path + "/words.txt");
  auto argv = [&](const std::string& out_dir, const std::string& stage, const std::string& iters) {
    std::vector<std::string> args{gpt_path(), "--world_size", "2", "--zero_stage", stage};
    for (auto& a : tiny_gpt(input, scratch.path + "/" + out_dir)) args.push_back(a);
    for (size_t i = 0; i + 1 < args.size(); ++i) {
      if (args[i] == "--max_iters") args[i + 1] = iters;
      if (args[i] == "--eval_interval") args[i + 1] = "20";
    }
    return args;
  };
  std::string stage0, stage3, resumed;
  ASSERT_EQ(run(argv("stage0", "0", "60"), stage0), 0) << stage0;
  ASSERT_EQ(run(argv("stage3", "3", "40"), stage3), 0) << stage3;
  ASSERT_EQ(run(argv("stage3", "3", "60"), resumed), 0) << resumed;
  EXPECT_TRUE(contains(resumed, "resumed at iteration 40")) << resumed;
  ASSERT_EQ(evaluation_lines(stage0).size(), 4u) << stage0;    // steps 0, 20, 40, 60
  ASSERT_EQ(evaluation_lines(resumed).size(), 2u) << resumed;  // 40 again, then 60
  EXPECT_NEAR(whole_split_loss(resumed), whole_split_loss(stage0), 1e-3) << stage0 << resumed;
  std::string sampled;
  ASSERT_EQ(run({gpt_path(), "--sample", "--out_dir", scratch.path + "/stage3", "--start", "the ",
                 "--max_new_tokens", "50"},
                sampled),
            0)
      << sampled;
}

TEST(GptExample, BadSettingsAreRefusedWithTheFix) {
  std::string out;
  EXPECT_NE(run({gpt_path(), "--input", "/nonexistent/input.txt"}, out), 0);
  EXPECT_TRUE(contains(out, "cannot read the training text /nonexistent/input.txt")) << out;
  EXPECT_NE(run({gpt_path(), "--input", "x", "--n_embd", "32", "--n_head", "3"}, out), 0);
  EXPECT_TRUE(contains(out, "not divisible by n_head 3")) << out;
  EXPECT_NE(run({gpt_path()}, out), 0);
  EXPECT_TRUE(contains(out, "--input")) << out;
  ScratchDir scratch;
  EXPECT_NE(run({gpt_path(), "--sample", "--out_dir", scratch.path}, out), 0);
  EXPECT_TRUE(contains(out, "Fix: train first")) << out;
}
