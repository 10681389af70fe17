// accelerant checkpoint inspect|verify: look into checkpoints and saved weights without Python,
// without starting a training program and without LibTorch (manifests, state.json and
// safetensors headers are JSON).
#include <accelerant/checkpoint.h>
#include <accelerant/error.h>
#include <accelerant/safetensors_header.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <sstream>

#include "commands.h"
#include "human_bytes.h"

namespace accelerant::cli {
namespace {

// Without throwing: an unreadable path counts as absent and is reported as such.
bool exists(const std::string& path) {
  std::error_code ignored;
  return std::filesystem::exists(path, ignored);
}
bool is_directory(const std::string& path) {
  std::error_code ignored;
  return std::filesystem::is_directory(path, ignored);
}

enum class Kind { Checkpoint, CheckpointsFolder, SafetensorsFile, SafetensorsDir };

// What DIR is: one checkpoint, a folder of them (<project_dir>/checkpoints or the project dir
// itself), or safetensors weights. Throws with what was expected when it is none of these.
Kind kind_of(const std::string& path, std::string* checkpoints_folder) {
  if (!exists(path)) {
    throw CheckpointError(path +
                              " does not exist. Fix: pass a checkpoint directory (e.g. "
                              "<project_dir>/checkpoints/checkpoint_3), a folder of them, or "
                              "weights written by save_model.",
                          path);
  }
  if (!is_directory(path)) {
    if (path.size() > 12 && path.compare(path.size() - 12, 12, ".safetensors") == 0)
      return Kind::SafetensorsFile;
    throw CheckpointError(
        path +
            " is a file, not a checkpoint directory. Fix: pass the directory that holds its "
            "manifest.json, or a .safetensors file.",
        path);
  }
  if (exists(path + "/manifest.json")) return Kind::Checkpoint;
  if (exists(path + "/model.safetensors") || exists(path + "/model.safetensors.index.json")) {
    return Kind::SafetensorsDir;
  }
  for (const std::string& folder : {path, path + "/checkpoints"}) {
    if (!list_checkpoints(folder).empty()) {
      *checkpoints_folder = folder;
      return Kind::CheckpointsFolder;
    }
  }
  // Let the checkpoint reader say why it is not one (no manifest: an interrupted save...).
  read_checkpoint_manifest(path);
  return Kind::Checkpoint;
}

void print_checkpoint(const std::string& dir, const CheckpointManifest& m) {
  uint64_t total = 0;
  for (const auto& f : m.files) total += f.size;
  std::cout << "checkpoint     " << dir << "\n"
            << "format         accelerant-checkpoint version " << m.format_version << "\n"
            << "written by     Accelerant " << m.accelerant_version << ", LibTorch "
            << m.libtorch_version << ", " << m.created << "\n"
            << "world size     " << m.world_size << " process(es)\n"
            << "progress       step " << m.step << " (optimizer steps), epoch " << m.epoch << "\n"
            << "contents       " << m.models << " model(s), " << m.optimizers << " optimizer(s), "
            << m.schedulers << " scheduler(s), " << m.data_loaders << " data loader(s), "
            << m.custom_objects << " registered object(s), "
            << (m.scaler ? "an fp16 loss scaler" : "no loss scaler") << "\n";
  // The loader positions are what a resume continues from.
  try {
    size_t i = 0;
    for (const auto& loader : read_checkpoint_state(dir).data_loaders) {
      std::cout << "data loader " << i++ << "  epoch " << loader.epoch << ", "
                << loader.samples_done << " of " << loader.dataset_size << " samples done, seed "
                << loader.seed << (loader.shuffle ? ", shuffled" : ", in order") << "\n";
    }
  } catch (const CheckpointError& e) {
    std::cout << "data loaders   unreadable: " << e.what() << "\n";
  }
  std::cout << "files          " << m.files.size() << ", " << human_bytes(total) << "\n";
  for (const auto& f : m.files) {
    char crc[16];
    std::snprintf(crc, sizeof crc, "%08x", f.crc32);
    std::printf("  %-22s %12llu bytes  crc32 %s\n", f.path.c_str(),
                static_cast<unsigned long long>(f.size), crc);
  }
  std::fflush(stdout);
}

// A dtype as LibTorch prints it (what this command printed when it read tensors with LibTorch).
std::string dtype_text(const std::string& name) {
  static const std::map<std::string, std::string> kLibTorchNames = {
      {"BOOL", "Bool"}, {"U8", "Byte"},  {"I8", "Char"},       {"I16", "Short"}, {"I32", "Int"},
      {"I64", "Long"},  {"F16", "Half"}, {"BF16", "BFloat16"}, {"F32", "Float"}, {"F64", "Double"}};
  auto it = kLibTorchNames.find(name);
  return it != kLibTorchNames.end() ? it->second : name;
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

void print_tensors(const std::string& where, const std::vector<SafetensorsTensorInfo>& tensors) {
  uint64_t total = 0;
  for (const auto& t : tensors) total += t.data_end - t.data_begin;
  std::cout << "safetensors    " << where << "\n"
            << "tensors        " << tensors.size() << ", " << human_bytes(total) << "\n";
  for (const auto& t : tensors)
    std::cout << "  " << t.name << "  " << dtype_text(t.dtype) << " " << shape_text(t.shape)
              << "\n";
}

// "" when the checkpoint verifies, else verify_checkpoint's reason.
std::string verification_problem(const std::string& dir) {
  try {
    verify_checkpoint(dir);
    return "";
  } catch (const CheckpointError& e) {
    return e.what();
  }
}

int inspect(const std::string& path, bool as_json) {
  std::string folder;
  switch (kind_of(path, &folder)) {
    case Kind::Checkpoint: {
      const auto manifest = read_checkpoint_manifest(path);
      const std::string problem = verification_problem(path);
      if (as_json) {
        std::cout << format_checkpoint_manifest(manifest);
        if (!problem.empty()) std::cerr << "accelerant checkpoint inspect: " << problem << "\n";
      } else {
        print_checkpoint(path, manifest);
        std::cout << "verified       "
                  << (problem.empty() ? "yes: every file's size and CRC-32 match the manifest"
                                      : "NO: " + problem)
                  << "\n";
      }
      return problem.empty() ? 0 : 1;
    }
    case Kind::CheckpointsFolder: {
      // Every checkpoint_<n>, complete or not, each with what verify_checkpoint says of it.
      std::vector<std::pair<int64_t, std::string>> found;
      std::error_code ignored;
      for (const auto& entry : std::filesystem::directory_iterator(folder, ignored)) {
        const int64_t n = checkpoint_iteration(entry.path().filename().string());
        if (n >= 0 && is_directory(entry.path().string())) found.emplace_back(n, entry.path());
      }
      std::sort(found.begin(), found.end());
      int good = 0;
      std::ostringstream lines;
      for (const auto& [n, dir] : found) {
        lines << "  " << dir << "  ";
        if (!exists(dir + "/manifest.json")) {
          lines << "INCOMPLETE: no manifest.json (deleted, or a save that never finished)\n";
          continue;
        }
        try {
          const auto m = verify_checkpoint(dir);
          ++good;
          lines << "step " << m.step << ", epoch " << m.epoch << ", " << m.world_size
                << " process(es), " << m.created << ", verified\n";
        } catch (const CheckpointError& e) {
          lines << "DAMAGED: " << e.what() << "\n";
        }
      }
      std::cout << found.size() << " checkpoint(s) in " << folder << ", " << good
                << " verified (oldest first; auto_resume takes the newest verified one):\n"
                << lines.str();
      return good == static_cast<int>(found.size()) ? 0 : 1;
    }
    case Kind::SafetensorsFile: {
      const auto contents = read_safetensors_header(path);
      print_tensors(path, contents.tensors);
      for (const auto& [k, v] : contents.metadata)
        std::cout << "metadata       " << k << " = " << v << "\n";
      return 0;
    }
    case Kind::SafetensorsDir: {
      std::vector<SafetensorsTensorInfo> tensors;
      for (const auto& [name, info] : read_model_safetensors_header(path)) tensors.push_back(info);
      print_tensors(path, tensors);
      return 0;
    }
  }
  return 1;
}

int verify(const std::string& path) {
  std::string folder;
  switch (kind_of(path, &folder)) {
    case Kind::Checkpoint: {
      // The bytes here; what the files hold in the helper, which prints the verdict.
      const auto m = verify_checkpoint(path);
      uint64_t total = 0;
      for (const auto& f : m.files) total += f.size;
      std::cout << "bytes    " << path << ": " << m.files.size() << " files, " << human_bytes(total)
                << ", every size and CRC-32 matches the manifest\n";
      return run_helper({"checkpoint", "verify-contents", path}) == 0 ? 0 : 1;
    }
    case Kind::CheckpointsFolder: {
      int bad = 0;
      const auto all = list_checkpoints(folder);
      std::vector<std::string> contents{"checkpoint", "verify-contents"};
      for (const auto& dir : all) {
        try {
          verify_checkpoint(dir);
          contents.push_back(dir);  // its files' meaning is checked next, in the helper
        } catch (const CheckpointError& e) {
          ++bad;
          std::cout << "BAD " << dir << ": " << e.what() << "\n";
        }
      }
      if (contents.size() > 2) bad += run_helper(contents);
      std::cout << (all.size() - std::min<size_t>(bad, all.size())) << " of " << all.size()
                << " checkpoint(s) verified\n";
      return bad ? 1 : 0;
    }
    case Kind::SafetensorsFile: {
      const auto contents = verify_safetensors(path);
      std::cout << "OK " << path << ": " << contents.tensors.size()
                << " tensors, every header entry consistent\n";
      return 0;
    }
    case Kind::SafetensorsDir: {
      const auto tensors = verify_model_safetensors(path);
      std::cout << "OK " << path << ": " << tensors.size()
                << " tensors, the index and every shard consistent\n";
      return 0;
    }
  }
  return 1;
}

}  // namespace

void add_checkpoint_command(CLI::App& app, Action& action) {
  auto* checkpoint =
      app.add_subcommand("checkpoint", "Inspect, verify or merge checkpoints and saved weights");
  checkpoint->require_subcommand(1);
  checkpoint->footer(
      "Examples:\n"
      "  accelerant checkpoint inspect runs/exp1/checkpoints/checkpoint_3\n"
      "  accelerant checkpoint inspect runs/exp1          list the complete checkpoints\n"
      "  accelerant checkpoint verify runs/exp1/checkpoints/checkpoint_3\n"
      "  accelerant checkpoint merge --optimizer runs/exp1/checkpoints/checkpoint_3 merged\n"
      "                                                   model.safetensors, whole optimizer "
      "state\n"
      "  accelerant checkpoint inspect weights/           tensors saved by save_model "
      "(safetensors)");

  auto path = std::make_shared<std::string>();
  auto as_json = std::make_shared<bool>(false);
  auto* inspect_cmd = checkpoint->add_subcommand(
      "inspect", "Show what a checkpoint holds: versions, world size, step, data positions, files");
  inspect_cmd
      ->add_option(
          "DIR", *path,
          "A checkpoint directory, a folder of them (or the project_dir), a .safetensors file or "
          "a directory written by save_model")
      ->required();
  inspect_cmd->add_flag("--json", *as_json, "Print the checkpoint's manifest as JSON");
  inspect_cmd->footer(
      "Examples:\n"
      "  accelerant checkpoint inspect runs/exp1/checkpoints/checkpoint_3\n"
      "  accelerant checkpoint inspect --json runs/exp1/checkpoints/checkpoint_3 | jq .step\n"
      "  accelerant checkpoint inspect runs/exp1\n"
      "  accelerant checkpoint inspect weights/model.safetensors");
  inspect_cmd->callback(
      [&action, path, as_json] { action = [path, as_json] { return inspect(*path, *as_json); }; });

  auto* verify_cmd = checkpoint->add_subcommand(
      "verify",
      "Check every file's size and CRC-32 against the manifest, then what each file holds: a\n"
      "model's tensors, an optimizer's state, ZeRO shards of one save, generator states, of the\n"
      "checkpoint's step (read with LibTorch, in the helper). Exit 1 naming the bad files: files\n"
      "swapped between checkpoints, or edited with the checksums rewritten, are caught too.");
  verify_cmd
      ->add_option("DIR", *path, "A checkpoint directory, a folder of them, or safetensors weights")
      ->required();
  verify_cmd->footer(
      "Examples:\n"
      "  accelerant checkpoint verify runs/exp1/checkpoints/checkpoint_3\n"
      "  accelerant checkpoint verify runs/exp1/checkpoints     every checkpoint in the folder\n"
      "  accelerant checkpoint verify weights/                   safetensors index and shards");
  verify_cmd->callback([&action, path] { action = [path] { return verify(*path); }; });
}

}  // namespace accelerant::cli
