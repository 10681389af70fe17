// The example's settings, named as nanoGPT's train.py names them where it has the setting; the
// defaults are nanoGPT's CPU configuration of its character-level Shakespeare run (README, "I
// only have a macbook"), which reaches val loss 1.88 after 2000 iterations.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "corpus.h"
#include "model.h"

namespace gpt {

struct Settings {
  // Data and output.
  std::string input;                ///< the training text; 90 % train, 10 % val
  std::string out_dir = "out-gpt";  ///< checkpoints, best weights, gpt.json, trackers
  int world_size = 1;               ///< forked workers (ignored under a launcher)
  // The model.
  ModelConfig model;  // vocab_size comes from the text
  // The optimisation.
  int64_t batch_size = 12;  ///< windows per micro-step on each process
  int64_t gradient_accumulation_steps = 1;
  int64_t max_iters = 2000;
  double learning_rate = 1e-3;
  double weight_decay = 0.1;
  double beta1 = 0.9;
  double beta2 = 0.99;
  double grad_clip = 1.0;  ///< 0: off
  bool decay_lr = true;
  int64_t warmup_iters = 100;
  int64_t lr_decay_iters = 2000;
  double min_lr = 1e-4;
  std::string dtype = "float32";  ///< float32, bfloat16 (autocast) or float16 (CUDA)
  bool compile = false;           ///< graph mode (accelerant's, not torch.compile)
  bool fused = true;              ///< Accelerant's fused AdamW update
  int zero_stage = 0;
  uint64_t seed = 1337;
  // Evaluation, checkpoints, logging.
  int64_t eval_interval = 250;
  int64_t eval_iters = 20;
  int64_t log_interval = 10;
  int64_t checkpoint_interval = 0;  ///< iterations between save_state; 0: eval_interval
  bool eval_only = false;
  std::vector<std::string> log_with;
  // Sampling.
  bool sample = false;  ///< only sample from out_dir's best weights
  int64_t num_samples = 1;
  int64_t max_new_tokens = 500;
  double temperature = 0.8;
  int64_t top_k = 200;
  std::string start = "\n";
};

/// Trains as the settings say, in this process as one rank of the job (the launcher calls it
/// once per process). Returns the final val loss over the whole validation split.
double train(const Settings& settings, const Corpus& corpus);

/// Prints `settings.num_samples` samples from the weights and vocabulary in settings.out_dir.
void sample_from_out_dir(const Settings& settings);

/// `settings.num_samples` texts from `model`, each `settings.max_new_tokens` characters after
/// `settings.start`, drawn with a generator seeded with settings.seed.
std::vector<std::string> sample_texts(GptImpl& model, const Vocabulary& vocabulary,
                                      const Settings& settings);

}  // namespace gpt
