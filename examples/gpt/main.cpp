// A character-level GPT (nanoGPT's architecture and its Shakespeare recipe) trained with the
// Accelerator, on one process or several, and sampled from.
//
//   gpt --input input.txt                          nanoGPT's CPU configuration on 1 process
//   gpt --input input.txt -n 2 --batch_size 6      2 processes, the same global batch
//   accelerant launch -n 2 --max_restarts 1 gpt --input input.txt --out_dir runs/a
//                                                  a killed worker restarts the group, which
//                                                  resumes from the newest checkpoint
//   gpt --sample --out_dir runs/a --start "ROMEO:" text from the best weights of a run
//
// The text is read and encoded once, before the workers are forked, so that they share it
// copy-on-write. Under a launcher (accelerant launch, torchrun, srun, mpirun) the program trains
// in the process it was started as. The walk-through is docs/gpt.md.
#include <accelerant/accelerant.h>
#include <accelerant/safetensors.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "settings.h"

namespace {

using gpt::Settings;

// --sample: the best weights save_model wrote during training, with the shape and vocabulary in
// gpt.json beside them; no Accelerator, no other process.
void sample_mode(Settings s) {
  const std::string card_path = s.out_dir + "/gpt.json";
  std::ifstream card_file(card_path);
  if (!card_file) {
    throw std::runtime_error("no " + card_path +
                             ": --sample reads a run's out_dir. Fix: train "
                             "first (gpt --input FILE --out_dir " +
                             s.out_dir + "), or pass the --out_dir of a run");
  }
  const auto card = nlohmann::json::parse(card_file);
  s.model.n_layer = card.at("n_layer");
  s.model.n_head = card.at("n_head");
  s.model.n_embd = card.at("n_embd");
  s.model.block_size = card.at("block_size");
  s.model.bias = card.at("bias");
  s.model.vocab_size = card.at("vocab_size");
  s.model.dropout = 0;
  const auto vocabulary = gpt::Vocabulary::of_chars(card.at("chars").get<std::vector<uint8_t>>());
  gpt::Gpt model(s.model);
  accelerant::load_model_safetensors(*model, s.out_dir + "/best");
  for (const auto& text : gpt::sample_texts(*model, vocabulary, s)) {
    std::printf("%s\n---------------\n", text.c_str());
  }
}

void add_options(CLI::App& app, Settings& s) {
  app.add_option("--input", s.input, "The training text (e.g. tiny Shakespeare's input.txt)");
  app.add_option("--out_dir", s.out_dir,
                 "Checkpoints (resumed from when started again), best weights as safetensors "
                 "(OUT_DIR/best), gpt.json, trackers")
      ->capture_default_str();
  app.add_option(accelerant::flag_names("world_size", "-n"), s.world_size,
                 "Processes to fork on this machine, the world size (ignored under a launcher)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  auto positive = [&](const char* name, int64_t& value, const char* help) {
    app.add_option(name, value, help)->capture_default_str()->check(CLI::PositiveNumber);
  };
  positive("--n_layer", s.model.n_layer, "Transformer blocks");
  positive("--n_head", s.model.n_head, "Attention heads (must divide n_embd)");
  positive("--n_embd", s.model.n_embd, "Width of the residual stream");
  positive("--block_size", s.model.block_size, "Context length in characters");
  app.add_option("--dropout", s.model.dropout, "Dropout probability")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--bias", s.model.bias, "Biases in the Linears and LayerNorms")
      ->capture_default_str();
  positive("--batch_size", s.batch_size, "Windows per micro-step on each process");
  positive("--gradient_accumulation_steps", s.gradient_accumulation_steps,
           "Micro-steps per iteration (the gradients of all are averaged)");
  app.add_option("--max_iters", s.max_iters, "Iterations (optimizer steps) to train")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--learning_rate", s.learning_rate, "Peak AdamW learning rate")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--weight_decay", s.weight_decay, "AdamW weight decay of the matrices")
      ->capture_default_str();
  app.add_option("--beta1", s.beta1, "AdamW beta1")->capture_default_str();
  app.add_option("--beta2", s.beta2, "AdamW beta2")->capture_default_str();
  app.add_option("--grad_clip", s.grad_clip, "Clip the gradient norm to this (0: off)")
      ->capture_default_str();
  app.add_option("--decay_lr", s.decay_lr, "Warmup and cosine decay (false: constant lr)")
      ->capture_default_str();
  app.add_option("--warmup_iters", s.warmup_iters, "Linear warmup iterations")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--lr_decay_iters", s.lr_decay_iters, "Iteration where the cosine reaches min_lr")
      ->capture_default_str();
  app.add_option("--min_lr", s.min_lr, "Learning rate from lr_decay_iters on")
      ->capture_default_str();
  app.add_option("--dtype", s.dtype,
                 "float32, bfloat16 (autocast) or float16 (autocast and loss scaling; CUDA)")
      ->capture_default_str()
      ->check(CLI::IsMember({"float32", "bfloat16", "float16"}));
  app.add_option("--compile", s.compile,
                 "Graph mode: the step captured once and replayed (CUDA graphs on a GPU; the "
                 "same eager step on the CPU)")
      ->capture_default_str();
  app.add_option("--fused", s.fused, "Accelerant's fused AdamW update")->capture_default_str();
  app.add_option("--zero_stage", s.zero_stage,
                 "ZeRO: 1 shards AdamW's state across the processes, 2 also the gradients, 3 "
                 "also each block's parameters (eager steps)")
      ->capture_default_str()
      ->check(CLI::Range(0, 3));
  app.add_option("--seed", s.seed, "Seed of the weights, the windows and the samples")
      ->capture_default_str();
  positive("--eval_interval", s.eval_interval, "Iterations between loss estimates");
  positive("--eval_iters", s.eval_iters, "Batches per split in each estimate, on each process");
  positive("--log_interval", s.log_interval, "Iterations between training-loss readings");
  app.add_option("--checkpoint_interval", s.checkpoint_interval,
                 "Iterations between checkpoints (0: eval_interval)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--eval_only", s.eval_only, "Evaluate once and stop");
  app.add_option("--log_with", s.log_with,
                 "Trackers, comma-separated: tensorboard, csv, jsonl (under OUT_DIR/gpt)")
      ->delimiter(',')
      ->check(CLI::IsMember({"tensorboard", "csv", "jsonl"}));
  app.add_flag("--sample", s.sample, "Only sample from OUT_DIR's best weights");
  app.add_option("--num_samples", s.num_samples, "Texts sampled (at the end of training too)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--max_new_tokens", s.max_new_tokens, "Characters per sample")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--temperature", s.temperature, "Softmax temperature of the sampling")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--top_k", s.top_k, "Sample among the k likeliest characters (0: all)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--start", s.start, "Text the samples continue")->capture_default_str();
}

// Settings that each pass alone but not together; the message says which and the fix.
void check_settings(const Settings& s) {
  if (!s.sample && s.input.empty()) {
    throw CLI::ValidationError("--input",
                               "is required to train. Fix: --input FILE (e.g. tiny "
                               "Shakespeare), or --sample to sample from a trained run");
  }
  if (s.model.n_embd % s.model.n_head != 0) {
    throw CLI::ValidationError("--n_head", "n_embd " + std::to_string(s.model.n_embd) +
                                               " is not divisible by n_head " +
                                               std::to_string(s.model.n_head));
  }
  if (s.decay_lr && s.lr_decay_iters <= s.warmup_iters) {
    throw CLI::ValidationError(
        "--lr_decay_iters", std::to_string(s.lr_decay_iters) + " must be above --warmup_iters " +
                                std::to_string(s.warmup_iters) + " (the cosine runs between them)");
  }
}

}  // namespace

int main(int argc, char** argv) {
  Settings s;
  CLI::App app{
      "Train a character-level GPT (nanoGPT's model and recipe) with accelerant::Accelerator, "
      "and sample from it. The defaults are nanoGPT's CPU configuration for tiny Shakespeare "
      "(4 layers, 4 heads, 128 wide, context 64, batch 12, 2000 iterations: val loss about "
      "1.88).\n\n"
      "Examples:\n"
      "  gpt --input input.txt                        1 process\n"
      "  gpt --input input.txt -n 2 --batch_size 6    2 processes, the same global batch\n"
      "  gpt --input input.txt --dtype bfloat16       bf16 autocast\n"
      "  accelerant launch -n 2 --max_restarts 1 gpt --input input.txt --out_dir runs/a\n"
      "                                               resumes from its checkpoint after a "
      "failure\n"
      "  gpt --sample --out_dir runs/a --start ROMEO: text from a run's best weights"};
  add_options(app, s);
  bool start_given = false;
  try {
    app.parse(argc, argv);
    start_given = app.count("--start") > 0;
    check_settings(s);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    if (s.sample) {
      sample_mode(s);
      return 0;
    }
    const auto options = accelerant::LaunchOptions().processes_per_node(s.world_size);
    accelerant::prepare_launch(options);  // before forking, read the text single-threaded
    const gpt::Corpus corpus = gpt::read_corpus(s.input, s.model.block_size);
    s.model.vocab_size = corpus.vocabulary.size();
    // nanoGPT starts its samples at a newline; a text without one starts at its first character.
    if (!start_given && !corpus.vocabulary.contains(s.start))
      s.start = corpus.vocabulary.decode(corpus.train.narrow(0, 0, 1));
    corpus.vocabulary.encode(s.start);  // refused here, before training, rather than at the end
    accelerant::launch(gpt::train, std::cref(s), std::cref(corpus), options);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpt: %s\n", e.what());
    return 1;
  }
}
