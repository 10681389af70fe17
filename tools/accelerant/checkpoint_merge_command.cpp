// accelerant checkpoint merge DIR OUT: a checkpoint (sharded by ZeRO or not) consolidated into
// safetensors weights and, with --optimizer, whole optimizer state. It reads LibTorch archives,
// so it runs in the helper; the front end lists it under `checkpoint` and forwards to it
// (libtorch_commands.cpp).
#include <accelerant/checkpoint_merge.h>

#include <iostream>
#include <memory>

#include "commands.h"
#include "human_bytes.h"

namespace accelerant::cli {
namespace {

struct MergeFlags {
  std::string dir, out;
  bool optimizer = false, force = false;
};

int run_merge(const MergeFlags& flags) {
  const MergedCheckpoint merged =
      merge_checkpoint(flags.dir, flags.out,
                       MergeCheckpointOptions().optimizer(flags.optimizer).overwrite(flags.force));
  std::cout << "merged " << flags.dir << " (step " << merged.step << ", " << merged.world_size
            << " process(es)";
  if (merged.sharded_optimizers > 0)
    std::cout << ", " << merged.sharded_optimizers << " optimizer(s) in ZeRO shards";
  std::cout << ") into " << merged.out_dir << ":\n";
  for (const auto* files : {&merged.models, &merged.optimizers}) {
    for (const MergedFile& f : *files) {
      std::cout << "  " << f.path << "  " << f.tensors << " tensors, "
                << human_bytes(static_cast<uint64_t>(f.bytes)) << "\n";
    }
  }
  if (merged.models.size() == 1) {
    std::cout << "Load the weights with accelerant::load_model_safetensors(model, \""
              << merged.out_dir << "\"), or in Python with safetensors.torch.load_file(\""
              << merged.models[0].path << "\").\n";
  }
  return 0;
}

}  // namespace

void add_checkpoint_merge_command(CLI::App& app, Action& action) {
  auto* checkpoint = app.add_subcommand("checkpoint", "Consolidate checkpoints");
  checkpoint->require_subcommand(1);
  auto flags = std::make_shared<MergeFlags>();
  auto* merge = checkpoint->add_subcommand(
      "merge",
      "Consolidate a checkpoint directory (sharded by ZeRO or not) into files that need neither\n"
      "Accelerant's checkpoint layout nor the number of processes that saved it:\n"
      "  OUT/model.safetensors    the model's weights (model_<i>.safetensors for several models),\n"
      "                           named as the model's named_parameters and named_buffers\n"
      "  OUT/optimizer_<i>.pt     with --optimizer: each optimizer's whole state, the ZeRO shards\n"
      "                           (rank_<r>/optimizer_<i>.pt) merged into what a run without ZeRO\n"
      "                           saves, so such a run's load_state takes it\n"
      "The checkpoint is verified first (sizes and CRC-32s against its manifest); OUT is written\n"
      "into a temporary directory beside it and renamed into place last, so a failure leaves no\n"
      "partial OUT. Runs in the LibTorch helper.");
  merge->add_option("DIR", flags->dir, "The checkpoint directory (holds manifest.json)")
      ->required();
  merge->add_option("OUT", flags->out, "The directory to write (new, or empty unless --force)")
      ->required();
  merge->add_flag("--optimizer", flags->optimizer,
                  "Also write each optimizer's whole state as OUT/optimizer_<i>.pt");
  merge->add_flag("-f,--force", flags->force,
                  "Replace OUT when it exists and is not empty (swapped in one rename)");
  merge->footer(
      "Examples:\n"
      "  accelerant checkpoint merge runs/exp1/checkpoints/checkpoint_3 runs/exp1/merged\n"
      "  accelerant checkpoint merge --optimizer runs/exp1/checkpoints/checkpoint_3 "
      "runs/exp1/merged\n"
      "\n"
      "Loading the weights:\n"
      "  C++:    accelerant::load_model_safetensors(*model, \"runs/exp1/merged\");\n"
      "  Python: safetensors.torch.load_file(\"runs/exp1/merged/model.safetensors\")\n"
      "The optimizer state: OUT/optimizer_<i>.pt is the optimizer_<i>.pt that a run without ZeRO\n"
      "saves (and its load_state reads) for the same model and optimizer.\n"
      "\n"
      "A missing rank_<r>/optimizer_<i>.pt means that rank's shard never reached DIR (checkpoints\n"
      "on machine-local disks): copy that rank's rank_<r>/ folder into DIR and merge again.");
  merge->callback([&action, flags] { action = [flags] { return run_merge(*flags); }; });
}

}  // namespace accelerant::cli
