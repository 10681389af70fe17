// accelerant estimate-memory: how much memory each rank needs to train a model of a given size,
// by ZeRO stage, world size, precision and optimizer, before buying or booking the GPUs. The
// model is memory_estimate.h; this file reads the inputs (a count or a safetensors header, no
// LibTorch) and prints the table or JSON.
#include <accelerant/error.h>
#include <accelerant/safetensors_header.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>

#include "commands.h"
#include "estimate_inputs.h"
#include "human_bytes.h"
#include "memory_estimate.h"

namespace accelerant::cli {
namespace {

struct EstimateFlags {
  std::string params, file, world_sizes = "1,2,4,8", zero_stages = "all", precision = "fp32",
                            optimizer = "adamw";
  std::string batch_size, activation_bytes_per_sample, seq_len, hidden_size, num_layers;
  std::string block_params;
  bool json = false;
};

// What is being trained: its parameter count, and where the count came from.
struct ModelSize {
  uint64_t parameters = 0;
  std::string source;  // "--params 125M" or the file
  size_t tensors = 0, left_out = 0;
  std::string largest_tensor;
  uint64_t largest_tensor_elements = 0;
  // Stage 3: the parameters of the largest block, gathered whole while it runs (0: not known),
  // and where that came from ("--block_params 85M", or the file's largest numbered group).
  uint64_t block_parameters = 0;
  std::string block_source;
};

// "blocks.3.attn.c_attn.weight" -> "blocks.3": the name up to its first numbered component, the
// unit a rule wraps (FSDP wraps each transformer layer); "" for a name without one.
std::string numbered_group(const std::string& name) {
  size_t begin = 0;
  while (begin < name.size()) {
    const size_t end = std::min(name.find('.', begin), name.size());
    const std::string part = name.substr(begin, end - begin);
    if (begin > 0 && !part.empty() && part.find_first_not_of("0123456789") == std::string::npos) {
      return name.substr(0, end);
    }
    begin = end + 1;
  }
  return "";
}

// 1,300,000,000: a count the reader can check digit groups of.
std::string grouped(uint64_t n) {
  std::string digits = std::to_string(n), text;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i && (digits.size() - i) % 3 == 0) text += ',';
    text += digits[i];
  }
  return text;
}

// The first column left-aligned, the numbers right-aligned under their headers.
void print_aligned(const std::vector<std::vector<std::string>>& cells, std::ostream& out) {
  std::vector<size_t> width(cells.front().size(), 0);
  for (const auto& row : cells)
    for (size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
  for (const auto& row : cells) {
    std::string line;
    for (size_t c = 0; c < row.size(); ++c) {
      const std::string pad(width[c] - row[c].size(), ' ');
      line += c == 0 ? row[c] + pad : "  " + pad + row[c];
    }
    out << line << "\n";
  }
}

uint64_t elements(const SafetensorsTensorInfo& t) {
  uint64_t n = 1;
  for (int64_t d : t.shape) n = checked_multiply(n, static_cast<uint64_t>(d), "tensor " + t.name);
  return n;
}

// Floating-point tensors are what an optimizer trains; integer and bool ones (position ids,
// masks, step counters) are buffers, left out and counted.
bool is_trainable_dtype(const std::string& dtype) {
  return dtype == "F64" || dtype == "F32" || dtype == "F16" || dtype == "BF16" ||
         dtype.rfind("F8", 0) == 0;
}

ModelSize model_from_file(const std::string& path) {
  std::error_code ignored;
  if (!std::filesystem::exists(path, ignored)) {
    throw Error(path +
                " does not exist. Fix: pass a .safetensors file (or a directory written by "
                "save_model), or the parameter count with --params (e.g. --params 1.3B).");
  }
  std::vector<SafetensorsTensorInfo> tensors;
  if (std::filesystem::is_directory(path, ignored)) {
    for (const auto& [name, info] : read_model_safetensors_header(path)) tensors.push_back(info);
  } else {
    tensors = read_safetensors_header(path).tensors;
  }
  ModelSize size;
  size.source = path;
  std::map<std::string, uint64_t> groups;
  for (const auto& t : tensors) {
    if (!is_trainable_dtype(t.dtype)) {
      ++size.left_out;
      continue;
    }
    ++size.tensors;
    const uint64_t n = elements(t);
    size.parameters += n;
    const std::string group = numbered_group(t.name);
    if (!group.empty()) groups[group] += n;
    if (n > size.largest_tensor_elements) {
      size.largest_tensor_elements = n;
      size.largest_tensor = t.name;
    }
  }
  if (size.parameters == 0) {
    throw Error(path +
                " holds no floating-point tensor, so no parameter to train. Fix: pass the "
                "model's weights, or --params.");
  }
  if (size.parameters > kMaxParameters) throw Error(path + " holds more than 10^15 parameters.");
  for (const auto& [group, n] : groups) {
    if (n > size.block_parameters) size.block_parameters = n, size.block_source = group;
  }
  return size;
}

std::string precision_text(TrainingPrecision p) {
  switch (p) {
    case TrainingPrecision::kFp32:
      return "fp32 weights and gradients";
    case TrainingPrecision::kBf16:
      return "bf16 weights and gradients, fp32 master copy";
    case TrainingPrecision::kFp16:
      return "fp16 weights and gradients, fp32 master copy";
  }
  return "";
}

std::string optimizer_text(OptimizerKind o) {
  switch (o) {
    case OptimizerKind::kAdamW:
      return "AdamW (2 fp32 moments)";
    case OptimizerKind::kAdam:
      return "Adam (2 fp32 moments)";
    case OptimizerKind::kSgdMomentum:
      return "SGD with momentum (1 fp32 buffer)";
    case OptimizerKind::kSgd:
      return "SGD without momentum (no state)";
  }
  return "";
}

std::string percent(uint64_t part, uint64_t whole) {
  char text[16];
  std::snprintf(text, sizeof text, "%.0f%%", whole ? 100.0 * part / whole : 0.0);
  return text;
}

struct Estimate {
  ModelSize model;
  TrainingPrecision precision;
  OptimizerKind optimizer;
  BytesPerParameter bytes;
  std::vector<RankMemory> rows;
  std::vector<uint64_t> stage0_totals;  // per row: stage 0's total at the same world size
  std::optional<Activations> activations;
};

void print_table(const Estimate& e) {
  const bool mixed = e.bytes.master > 0;
  std::cout << "Model:     " << grouped(e.model.parameters) << " parameters";
  if (!e.model.largest_tensor.empty()) {
    std::cout << " in " << e.model.tensors << " floating-point tensors of " << e.model.source
              << " (largest: " << e.model.largest_tensor << ", "
              << grouped(e.model.largest_tensor_elements) << ")";
    if (e.model.left_out) std::cout << "; " << e.model.left_out << " integer/bool buffers left out";
  }
  std::cout << "\nTraining:  " << precision_text(e.precision) << "; " << optimizer_text(e.optimizer)
            << "\n"
            << "Per rank:  parameters " << e.bytes.parameters << " B + gradients "
            << e.bytes.gradients << " B + optimizer " << e.bytes.optimizer << " B"
            << (mixed ? " + master " + std::to_string(e.bytes.master) + " B" : "")
            << " per parameter at stage 0;\n"
            << "           stage 1 divides optimizer" << (mixed ? " and master" : "")
            << " by the world size, stage 2 gradients too,\n"
            << "           stage 3 parameters too, plus one block gathered whole with its "
               "gradients\n           and the next block's parameters gathered ahead\n\n";

  const bool stage3 = std::any_of(e.rows.begin(), e.rows.end(),
                                  [](const RankMemory& r) { return r.zero_stage == 3; });
  std::vector<std::string> header = {"stage", "ranks", "B/param", "params", "grads", "optimizer"};
  if (mixed) header.push_back("master");
  if (stage3) {
    header.push_back("block");
    header.push_back("prefetch");
  }
  for (const char* h : {"total/rank", "vs stage 0", "largest buffer"}) header.push_back(h);
  if (e.activations) header.push_back("+ activations ~");
  std::vector<std::vector<std::string>> cells = {header};
  for (size_t i = 0; i < e.rows.size(); ++i) {
    const RankMemory& r = e.rows[i];
    char per_param[32];
    std::snprintf(per_param, sizeof per_param, "%.2f",
                  static_cast<double>(r.total()) / e.model.parameters);
    std::vector<std::string> row = {
        std::to_string(r.zero_stage), std::to_string(r.world_size), per_param,
        human_bytes(r.parameters, 2), human_bytes(r.gradients, 2),  human_bytes(r.optimizer, 2)};
    if (mixed) row.push_back(human_bytes(r.master, 2));
    if (stage3) {
      row.push_back(r.zero_stage == 3 ? human_bytes(r.gathered_block, 2) : "-");
      row.push_back(r.zero_stage == 3 ? human_bytes(r.prefetched_block, 2) : "-");
    }
    row.push_back(human_bytes(r.total(), 2));
    row.push_back(percent(r.total(), e.stage0_totals[i]));
    row.push_back(human_bytes(r.largest_buffer, 2));
    if (e.activations) row.push_back(human_bytes(r.total() + e.activations->bytes, 2));
    cells.push_back(row);
  }
  print_aligned(cells, std::cout);

  std::cout << "\n";
  if (e.activations) {
    std::cout << "Activations: ~" << human_bytes(e.activations->bytes, 2)
              << " per rank, an order of magnitude only:\n  " << e.activations->rule << "\n";
  } else {
    std::cout << "Activations are not included: add --batch_size with "
                 "--activation_bytes_per_sample,\n"
                 "or with --seq_len, --hidden_size and --num_layers, for an order of magnitude.\n";
  }
  if (stage3) {
    if (e.model.block_parameters > 0) {
      std::cout << "Stage 3's block: " << grouped(e.model.block_parameters) << " parameters ("
                << e.model.block_source
                << "),\n  whole with its gradients while its backward runs, and the next "
                   "block's parameters\n  gathered ahead meanwhile (the prefetch). Parameters "
                   "outside every Sharded block\n  stay whole on every rank: this counts them "
                   "as sharded.\n";
    } else {
      std::cout << "Stage 3's gathered block is not counted: its size is unknown. Pass "
                   "--block_params\n  (the largest Sharded block's parameters, e.g. one "
                   "transformer layer's).\n";
    }
  }
  std::cout << "Not included: the CUDA context, cached allocator blocks, gradient buckets in "
               "flight, temporaries.\n"
               "Accelerant's stage 2 adds about 3 buffers of the largest gradient bucket (25 MiB "
               "by default) to its 1/N of the gradients (docs/zero.md).\n";
}

void print_json(const Estimate& e) {
  nlohmann::ordered_json out;
  out["parameters"] = e.model.parameters;
  out["source"] = e.model.source;
  if (!e.model.largest_tensor.empty()) {
    out["tensors"] = e.model.tensors;
    out["buffers_left_out"] = e.model.left_out;
    out["largest_tensor"] = {{"name", e.model.largest_tensor},
                             {"elements", e.model.largest_tensor_elements}};
  }
  if (e.model.block_parameters > 0) {
    out["block_parameters"] = e.model.block_parameters;
    out["block_source"] = e.model.block_source;
  } else {
    out["block_parameters"] = nullptr;
  }
  out["precision"] = precision_name(e.precision);
  out["optimizer"] = optimizer_name(e.optimizer);
  out["bytes_per_parameter_stage0"] = {{"parameters", e.bytes.parameters},
                                       {"gradients", e.bytes.gradients},
                                       {"optimizer", e.bytes.optimizer},
                                       {"master", e.bytes.master}};
  if (e.activations) {
    out["activations_bytes"] = e.activations->bytes;
    out["activations_rule"] = e.activations->rule;
  } else {
    out["activations_bytes"] = nullptr;
  }
  out["rows"] = nlohmann::ordered_json::array();
  for (size_t i = 0; i < e.rows.size(); ++i) {
    const RankMemory& r = e.rows[i];
    nlohmann::ordered_json row = {{"zero_stage", r.zero_stage},
                                  {"world_size", r.world_size},
                                  {"parameters_bytes", r.parameters},
                                  {"gradients_bytes", r.gradients},
                                  {"optimizer_bytes", r.optimizer},
                                  {"master_bytes", r.master},
                                  {"gathered_block_bytes", r.gathered_block},
                                  {"prefetched_block_bytes", r.prefetched_block},
                                  {"total_bytes", r.total()},
                                  {"stage0_total_bytes", e.stage0_totals[i]},
                                  {"largest_buffer_bytes", r.largest_buffer}};
    if (e.activations) row["total_with_activations_bytes"] = r.total() + e.activations->bytes;
    out["rows"].push_back(row);
  }
  std::cout << out.dump(2) << "\n";
}

int estimate(const EstimateFlags& flags) {
  Estimate e{};  // precision and optimizer are set below, before any use
  if (flags.params.empty() == flags.file.empty()) {
    const char* what = flags.params.empty() ? "no model given" : "both --params and a file given";
    throw Error(std::string(what) +
                ". Fix: pass either the parameter count (--params 125M) or the model's weights "
                "(model.safetensors), e.g. `accelerant estimate-memory --params 1.3B`.");
  }
  if (!flags.params.empty()) {
    e.model.parameters = parse_count(flags.params, "--params", kMaxParameters);
    e.model.source = "--params " + flags.params;
  } else {
    e.model = model_from_file(flags.file);
  }
  e.precision = parse_precision(flags.precision);
  e.optimizer = parse_optimizer(flags.optimizer);
  e.bytes = bytes_per_parameter(e.precision, e.optimizer);
  e.activations =
      parse_activations(flags.batch_size, flags.activation_bytes_per_sample, flags.seq_len,
                        flags.hidden_size, flags.num_layers, e.precision);
  if (!flags.block_params.empty()) {
    e.model.block_parameters = parse_count(flags.block_params, "--block_params", kMaxParameters);
    e.model.block_source = "--block_params " + flags.block_params;
    if (e.model.block_parameters > e.model.parameters) {
      throw Error("--block_params " + flags.block_params + " is more than the model's " +
                  grouped(e.model.parameters) +
                  " parameters. Fix: the parameters of the largest Sharded block (one "
                  "transformer layer, say), a part of the model.");
    }
  }
  const std::vector<int64_t> world_sizes = parse_world_sizes(flags.world_sizes);
  for (int stage : parse_zero_stages(flags.zero_stages)) {
    for (int64_t n : world_sizes) {
      e.rows.push_back(
          estimate_rank_memory(e.model.parameters, e.bytes, stage, n, e.model.block_parameters));
      e.stage0_totals.push_back(estimate_rank_memory(e.model.parameters, e.bytes, 0, n).total());
    }
  }
  if (flags.json) {
    print_json(e);
  } else {
    print_table(e);
  }
  return 0;
}

}  // namespace

void add_estimate_memory_command(CLI::App& app, Action& action) {
  auto flags = std::make_shared<EstimateFlags>();
  auto* cmd = app.add_subcommand(
      "estimate-memory",
      "Per-rank memory for parameters, gradients and optimizer state by ZeRO stage, world size, "
      "precision and optimizer");
  cmd->add_option("FILE", flags->file,
                  "The model's weights: a .safetensors file or a directory written by save_model "
                  "(floating-point tensors are counted as parameters)");
  cmd->add_option("--params", flags->params,
                  "The parameter count instead of a file: 350000000, 350M, 1.3B, 70B (K, M, B, T)");
  cmd->add_option("--world_size", flags->world_sizes,
                  "Numbers of processes (GPUs) to show, comma-separated (default: 1,2,4,8)");
  cmd->add_option("--zero_stage", flags->zero_stages,
                  "ZeRO stages to show: 0, 1, 2, 3, a list (0,2) or all (default: all)");
  cmd->add_option("--precision", flags->precision,
                  "The weights' training dtype: fp32, bf16 or fp16 (16-bit ones with an fp32 "
                  "master copy) (default: fp32)");
  cmd->add_option("--optimizer", flags->optimizer,
                  "adamw, adam, sgd_momentum or sgd (default: adamw)");
  cmd->add_option("--batch_size", flags->batch_size,
                  "Samples per rank per step, for the activations' order of magnitude");
  cmd->add_option("--activation_bytes_per_sample", flags->activation_bytes_per_sample,
                  "Activation bytes one sample keeps for backward, if you measured it (e.g. 40M)");
  cmd->add_option("--seq_len", flags->seq_len, "Tokens per sample (transformer rule of thumb)");
  cmd->add_option("--hidden_size", flags->hidden_size, "Hidden size (transformer rule of thumb)");
  cmd->add_option("--num_layers", flags->num_layers, "Layers (transformer rule of thumb)");
  cmd->add_option("--block_params", flags->block_params,
                  "Stage 3: the parameters of the largest Sharded block, gathered whole while it "
                  "runs (e.g. 85M); from a file, the largest group of tensors named up to a "
                  "number (blocks.3.*) unless given");
  cmd->add_flag("--json", flags->json, "Print the exact bytes as JSON, for scripts");
  cmd->footer(
      "The model, per rank, with P parameters and N ranks (ceil(P/N) for a shard):\n"
      "  parameters  P x 4 B (fp32), P x 2 B (bf16/fp16); stage 3: /N\n"
      "  gradients   same dtype as the parameters; stages 2-3: /N\n"
      "  optimizer   fp32: adamw/adam 8 B (two moments), sgd_momentum 4 B, sgd 0; stages 1-3: /N\n"
      "  master      bf16/fp16 only: an fp32 copy, 4 B, that the optimizer updates; stages 1-3: "
      "/N\n"
      "  block       stage 3 only: one block's parameters and gradients whole, B x (4 + 4) B at\n"
      "              fp32 (B = --block_params), while its backward runs\n"
      "  prefetch    stage 3 only: the next block's parameters, gathered ahead, B x 4 B at fp32\n"
      "  Stage 0 is plain data parallelism (everything replicated). fp32 + adamw: 16 B/param at\n"
      "  stage 0; stage 2 on 4 ranks: 4 + 4/4 + 8/4 = 7 B/param; stage 3 on 4 ranks: 16/4 = 4\n"
      "  B/param plus the block and the prefetch.\n"
      "Accelerant's ZeRO (AcceleratorOptions::zero_stage, docs/zero.md) gives each rank 1/N of\n"
      "the optimizer state (the padding that aligns a shard for vector loads, at most 16\n"
      "elements per bucket and rank, is left out); its stage 2 keeps each rank's 1/N of the\n"
      "gradients plus about 3 buffers of the largest gradient bucket, which are not counted; its\n"
      "stage 3 shards the parameters of the model's Sharded blocks (the rest stays whole).\n"
      "Accelerant's mixed_precision bf16/fp16 today is\n"
      "autocast, which keeps weights and gradients fp32: estimate it with --precision fp32.\n"
      "Activations are left out unless asked for: --batch_size B with\n"
      "--activation_bytes_per_sample, or with --seq_len S --hidden_size H --num_layers L for a\n"
      "transformer's rule of thumb, B x 34 x S x H x L bytes at 16 bits (x 2 at fp32; about 17\n"
      "stored values per token, hidden unit and layer, attention scores not stored, no\n"
      "recomputation). Not counted: the CUDA context, cached allocator blocks, gradient buckets.\n"
      "\n"
      "Examples:\n"
      "  accelerant estimate-memory --params 1.3B\n"
      "  accelerant estimate-memory --params 7B --precision bf16 --world_size 8,16 --zero_stage 2\n"
      "  accelerant estimate-memory weights/model.safetensors --optimizer sgd_momentum\n"
      "  accelerant estimate-memory --params 125M --batch_size 8 --seq_len 2048 \\\n"
      "      --hidden_size 768 --num_layers 12\n"
      "  accelerant estimate-memory --params 350M --json | jq '.rows[0].total_bytes'");
  cmd->callback([&action, flags] { action = [flags] { return estimate(*flags); }; });
}

}  // namespace accelerant::cli
