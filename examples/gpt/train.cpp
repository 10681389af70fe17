// The training loop: nanoGPT's train.py, written against the Accelerator. What each Accelerant
// call does is explained in docs/gpt.md.
#include <accelerant/accelerant.h>

#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "settings.h"

namespace gpt {
namespace {

// What the loop adds to the Accelerator's checkpoint: the iteration it stopped at (counted even
// when an fp16 step is skipped, as nanoGPT's iter_num is) and the best val loss so far (which
// decides whether the next evaluation rewrites the best weights).
struct LoopState {
  int64_t iter = 0;
  double best_val_loss = std::numeric_limits<double>::infinity();
  void save(torch::serialize::OutputArchive& archive) const {
    archive.write("iter", torch::tensor(iter));
    archive.write("best_val_loss", torch::tensor(best_val_loss, torch::kDouble));
  }
  void load(torch::serialize::InputArchive& archive) {
    torch::Tensor value;
    archive.read("iter", value);
    iter = value.item<int64_t>();
    archive.read("best_val_loss", value);
    best_val_loss = value.item<double>();
  }
};

// nanoGPT's --dtype as the autocast precision (float32: none).
accelerant::MixedPrecision mixed_precision_of(const std::string& dtype) {
  if (dtype == "bfloat16") return accelerant::MixedPrecision::kBf16;
  if (dtype == "float16") return accelerant::MixedPrecision::kFp16;
  return accelerant::MixedPrecision::kNo;
}

// nanoGPT's get_lr as a schedule: linear warmup, cosine down to min_lr at lr_decay_iters, then
// min_lr; a factor of the base learning rate, stepped once per optimizer update.
accelerant::LrSchedule schedule_of(const Settings& s) {
  if (!s.decay_lr) return accelerant::LrSchedule::constant(1.0);
  return accelerant::LrSchedule::warmup(s.warmup_iters)
      .then(accelerant::LrSchedule::cosine(s.lr_decay_iters - s.warmup_iters,
                                           s.min_lr / s.learning_rate));
}

torch::Tensor loss_of(Gpt& model, const torch::Tensor& data, const torch::Tensor& target) {
  auto logits = model->forward(data);
  return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}),
                                              target.reshape(-1));
}

torch::Tensor loss_of(Gpt& model, const accelerant::Batch& batch) {
  return loss_of(model, batch.data, batch.target);
}

// Writes what --sample needs besides the weights: the model's shape and the vocabulary.
void write_model_card(const Settings& s, const Corpus& corpus) {
  nlohmann::json card = {{"n_layer", s.model.n_layer},
                         {"n_head", s.model.n_head},
                         {"n_embd", s.model.n_embd},
                         {"block_size", s.model.block_size},
                         {"bias", s.model.bias},
                         {"vocab_size", s.model.vocab_size},
                         {"chars", corpus.vocabulary.chars()}};
  std::ofstream(s.out_dir + "/gpt.json") << card.dump(2) << "\n";
}

}  // namespace

std::vector<std::string> sample_texts(GptImpl& model, const Vocabulary& vocabulary,
                                      const Settings& s) {
  torch::NoGradGuard no_grad;
  const bool was_training = model.is_training();
  model.eval();
  auto generator = torch::make_generator<torch::CPUGeneratorImpl>(s.seed);
  const auto device = model.wte->weight.device();
  std::vector<std::string> texts;
  for (int64_t i = 0; i < s.num_samples; ++i) {
    auto start = vocabulary.encode(s.start).unsqueeze(0).to(device);
    auto tokens = model.generate(start, s.max_new_tokens, s.temperature, s.top_k, generator);
    texts.push_back(vocabulary.decode(tokens));
  }
  model.train(was_training);
  return texts;
}

double train(const Settings& s, const Corpus& corpus) {
  // The Accelerator resolves the processes, the device, mixed precision and the CPU threads,
  // seeds every generator, and owns checkpoints (project_dir) and trackers.
  accelerant::Accelerator acc(accelerant::AcceleratorOptions()
                                  .mixed_precision(mixed_precision_of(s.dtype))
                                  .gradient_accumulation_steps(s.gradient_accumulation_steps)
                                  .fused_optimizers(s.fused)
                                  .zero_stage(s.zero_stage)
                                  .seed(s.seed)
                                  .project_dir(s.out_dir)
                                  .checkpoint_total_limit(2)
                                  .auto_resume(true)
                                  .log_with(s.log_with));
  // Under --zero_stage 3 each transformer block keeps only this process's share from the moment
  // it is built (a sharded start), so the model is never whole in one process; below stage 3
  // this builds the model as usual. The values are the same either way.
  Gpt model = [&] {
    const accelerant::ShardedStart start = acc.sharded_start();
    return Gpt(s.model);
  }();
  // Weight decay on the matrices (2-D and up: the Linears' weights and both embeddings), none on
  // the LayerNorm gains; two ordinary AdamW parameter groups.
  auto groups = accelerant::weight_decay_groups(*model, torch::optim::AdamWOptions(s.learning_rate)
                                                            .betas({s.beta1, s.beta2})
                                                            .weight_decay(s.weight_decay));
  torch::optim::AdamW optimizer(std::move(groups), torch::optim::AdamWOptions(s.learning_rate));
  accelerant::ScheduledLR scheduler(optimizer, schedule_of(s));
  // Random windows, a stream per process drawn from (seed, rank, batch index): three streams,
  // training and the two evaluation estimates, each saved and resumed with the checkpoint.
  auto windows = [&](const torch::Tensor& tokens, uint64_t seed) {
    return accelerant::TokenWindows::from_tensor(tokens, accelerant::TokenWindowOptions()
                                                             .window(s.model.block_size)
                                                             .batch_size(s.batch_size)
                                                             .seed(seed));
  };
  auto [net, opt, sched, train_batches, train_eval, val_eval] =
      acc.prepare(model, optimizer, scheduler, windows(corpus.train, s.seed),
                  windows(corpus.train, s.seed + 1), windows(corpus.val, s.seed + 2));
  LoopState loop;
  acc.register_for_checkpointing(loop);
  // A run started again in out_dir (by hand or by the launcher's --max_restarts) continues from
  // its newest checkpoint, here, before the loop reads anything.
  acc.auto_resume_now();
  const int64_t start_iter = loop.iter;

  if (acc.is_main_process()) {
    std::filesystem::create_directories(s.out_dir);
    write_model_card(s, corpus);
  }
  if (!s.log_with.empty()) {
    acc.init_trackers("gpt", {{"n_layer", s.model.n_layer},
                              {"n_head", s.model.n_head},
                              {"n_embd", s.model.n_embd},
                              {"block_size", s.model.block_size},
                              {"batch_size", s.batch_size},
                              {"learning_rate", s.learning_rate},
                              {"max_iters", s.max_iters},
                              {"world_size", acc.world_size()},
                              {"dtype", s.dtype}});
  }
  acc.print("Training on ", acc.world_size(), " process", acc.world_size() == 1 ? "" : "es", " x ",
            acc.threads(), " thread", acc.threads() == 1 ? "" : "s", " (", acc.device(), ", ",
            s.dtype, "): ", model->num_parameters(), " parameters, ",
            s.batch_size * s.gradient_accumulation_steps * acc.world_size() * s.model.block_size,
            " tokens per iteration, lr ", scheduler.schedule().describe(),
            start_iter > 0 ? ", resumed at iteration " + std::to_string(start_iter) : "");

  const int64_t checkpoint_interval =
      s.checkpoint_interval > 0 ? s.checkpoint_interval : s.eval_interval;
  // --compile: the same step as one graph per input shape (a CUDA graph replayed on a GPU; the
  // same eager step on the CPU). Clipping reads nothing on the host there, and only the
  // synchronising micro-step's graph clips and steps.
  std::optional<accelerant::GraphStep> compiled;
  if (s.compile) {
    compiled.emplace(acc.compile(
        [&](const accelerant::GraphStep::Inputs& in) {
          torch::Tensor loss;
          {
            auto autocast = acc.autocast();
            loss = loss_of(net, in[0], in[1]);
          }
          acc.backward(loss);
          if (acc.sync_gradients()) {
            if (s.grad_clip > 0) acc.clip_grad_norm_tensor(net, s.grad_clip);
            opt.step();
            sched.step();
            opt.zero_grad();
          }
          return accelerant::GraphStep::Outputs{loss.detach()};
        },
        accelerant::GraphStepOptions().name("gpt")));
  }
  double last_loss = std::numeric_limits<double>::quiet_NaN();
  std::optional<accelerant::ProgressBar> progress;
  const auto training_started = std::chrono::steady_clock::now();
  for (;; ++loop.iter) {
    const int64_t iter = loop.iter;
    // Saved before this iteration's evaluation, so that a resumed run repeats that evaluation
    // with the same batches and prints what the uninterrupted run printed.
    if (iter > start_iter && iter % checkpoint_interval == 0) acc.save_state();
    if (iter % s.eval_interval == 0 || iter == s.max_iters) {
      // eval mode and no gradients inside; one all-reduce for both means, weighted by tokens.
      auto losses = acc.evaluate(net, [&](accelerant::MeanMetrics& metrics) {
        for (auto [name, stream] :
             {std::pair{"train/loss", &train_eval}, std::pair{"val/loss", &val_eval}}) {
          for (int64_t i = 0; i < s.eval_iters; ++i) {
            auto batch = stream->next();
            auto autocast = acc.autocast();
            metrics.add(name, loss_of(net, batch), static_cast<double>(batch.target.numel()));
          }
        }
      });
      if (progress) progress->close();
      progress.reset();
      const double val_loss = losses.at("val/loss");
      char line[96];
      std::snprintf(line, sizeof line, "step %" PRId64 ": train loss %.4f, val loss %.4f", iter,
                    losses.at("train/loss"), val_loss);
      acc.print(line);
      if (!s.log_with.empty()) {
        acc.log({{"train/loss_estimate", losses.at("train/loss")},
                 {"val/loss", val_loss},
                 {"lr", opt.optimizer().param_groups()[0].options().get_lr()}},
                iter);
      }
      if (val_loss < loop.best_val_loss) {
        loop.best_val_loss = val_loss;
        if (iter > 0) acc.save_model(net, s.out_dir + "/best");  // safetensors, main process
      }
    }
    if (iter >= s.max_iters || s.eval_only) break;
    if (!progress) {
      progress.emplace(accelerant::ProgressBarOptions()
                           .total(s.max_iters)
                           .initial(iter)
                           .label("train")
                           .enabled(acc.is_main_process()));
    }
    // One iteration = gradient_accumulation_steps micro-batches; the gradients are all-reduced
    // on the last, and only then do clipping, the optimizer and the schedule act.
    for (int64_t micro = 0; micro < s.gradient_accumulation_steps; ++micro) {
      auto batch = train_batches.next();
      torch::Tensor loss;
      if (compiled) {
        loss = (*compiled)(batch)[0];  // accumulate() is the compiled step's own business
      } else {
        auto accumulating = acc.accumulate(net);
        {
          auto autocast = acc.autocast();
          loss = loss_of(net, batch);
        }
        acc.backward(loss);
        if (acc.sync_gradients()) {
          if (s.grad_clip > 0) acc.clip_grad_norm_(net, s.grad_clip);
          opt.step();
          sched.step();
          opt.zero_grad();
        }
      }
      if (micro == s.gradient_accumulation_steps - 1 && (iter + 1) % s.log_interval == 0) {
        last_loss = loss.item<double>();
        if (!s.log_with.empty()) acc.log({{"train/loss", last_loss}}, iter + 1);
      }
    }
    char postfix[32] = "";  // no loss shown before the first one is read
    if (!std::isnan(last_loss)) std::snprintf(postfix, sizeof postfix, "loss %.4f", last_loss);
    progress->update(iter + 1, postfix);
  }

  if (s.zero_stage == 3) {
    // What the step waited for the blocks' parameter all-gathers (the rest overlapped compute,
    // prefetched while another block ran): the cost stage 3 adds to stage 2's.
    const std::chrono::duration<double> training =
        std::chrono::steady_clock::now() - training_started;
    std::chrono::duration<double> waited{0};
    int64_t prefetches = 0;
    for (const auto& block : accelerant::sharded_blocks(*net)) {
      waited += block->stats().gather_wait;
      prefetches += block->stats().prefetches;
    }
    char line[160];
    std::snprintf(
        line, sizeof line,
        "ZeRO-3: waited %.3f s for parameter all-gathers in %.3f s of training (%.1f %%), "
        "%" PRId64 " gathers prefetched",
        waited.count(), training.count(), 100 * waited.count() / training.count(), prefetches);
    acc.print(line);
  }
  double whole_val_loss = 0;
  {
    // ZeRO stage 3: what follows runs the blocks a different number of times on each process (the
    // last share of windows may be one batch longer; only the main process samples), so their
    // parameters are gathered once for all of it instead of per block and call. Below stage 3
    // this does nothing.
    accelerant::GatheredParameters whole_blocks(*net);
    // The loss over the whole validation split (every window once, not 20 random batches): each
    // process takes a contiguous share of the windows, and the means are weighted by tokens.
    const int64_t windows_total = val_eval.contiguous_windows();
    const int64_t first = windows_total * acc.rank() / acc.world_size();
    const int64_t last = windows_total * (acc.rank() + 1) / acc.world_size();
    auto whole = acc.evaluate(net, [&](accelerant::MeanMetrics& metrics) {
      for (int64_t w = first; w < last; w += 64) {
        auto batch = val_eval.contiguous_batch(w, std::min<int64_t>(64, last - w));
        auto autocast = acc.autocast();
        metrics.add("val/loss", loss_of(net, batch), static_cast<double>(batch.target.numel()));
      }
    });
    whole_val_loss = whole.at("val/loss");
    acc.print("val loss over the whole validation split: ", [&] {
      char text[16];
      std::snprintf(text, sizeof text, "%.4f", whole_val_loss);
      return std::string(text);
    }());
    if (!s.log_with.empty()) acc.log({{"val/loss_whole_split", whole_val_loss}}, loop.iter);
    if (acc.is_main_process() && s.num_samples > 0 && s.max_new_tokens > 0) {
      for (const auto& text : sample_texts(*net, corpus.vocabulary, s)) {
        std::printf("---------------\n%s\n", text.c_str());
      }
      std::printf("---------------\n");
      std::fflush(stdout);
    }
  }
  acc.print("done: ", loop.iter, " iterations");
  acc.end_training();
  return whole_val_loss;
}

}  // namespace gpt
