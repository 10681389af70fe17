// Reading and checking a checkpoint directory without an Accelerator.
#include <sys/stat.h>

#include <algorithm>

#include "accelerant/checkpoint.h"
#include "accelerant/error.h"
#include "base/bounded_input.h"
#include "base/file_io.h"
#include "base/text.h"
#include "checkpoint/checkpoint_layout.h"
#include "checkpoint/durable_files.h"

namespace accelerant {
namespace {

// One of the checkpoint's JSON files, read within kMaxJsonBytes and never through a symbolic
// link (note "Bounded input" in base/bounded_input.h).
std::string read_json_file(const std::string& path) {
  const auto file =
      detail::read_bounded_file(path, detail::layout::kMaxJsonBytes, detail::Symlinks::kRefuse);
  if (!file.problem.empty()) {
    throw CheckpointError(
        detail::str(detail::said_of(path, file.problem),
                    file.problem == "it is a symbolic link"
                        ? ". Likely cause: the checkpoint was assembled by hand or tampered "
                          "with; a checkpoint holds its own files, never links. Fix: copy the "
                          "real file in its place, or use another checkpoint."
                        : ". Fix: check the file's permissions, or use another checkpoint."),
        path);
  }
  return file.bytes;
}

// The first component of `relative` (inside `dir`) that is a symbolic link, or "".
std::string first_symlink(const std::string& dir, const std::string& relative) {
  for (size_t slash = relative.find('/');; slash = relative.find('/', slash + 1)) {
    const std::string part = relative.substr(0, slash);
    struct stat st {};
    if (::lstat((dir + "/" + part).c_str(), &st) == 0 && S_ISLNK(st.st_mode)) return part;
    if (slash == std::string::npos) return "";
  }
}

// The files a manifest's counts and world size imply, each with its role.
std::vector<std::pair<std::string, std::string>> expected_files(const CheckpointManifest& m) {
  namespace layout = detail::layout;
  std::vector<std::pair<std::string, std::string>> files;
  for (int i = 0; i < m.models; ++i) {
    // Saved sharded (ZeRO stage 3), a model's weights are safetensors instead of an archive.
    const std::string weights = layout::model_weights_file(static_cast<size_t>(i));
    const bool streamed =
        std::any_of(m.files.begin(), m.files.end(),
                    [&](const CheckpointFileEntry& f) { return f.path == weights; });
    files.emplace_back(streamed ? weights : layout::model_file(static_cast<size_t>(i)), "model");
  }
  for (int i = 0; i < m.optimizers; ++i) {
    // Saved under ZeRO (rank 0's shard listed): every rank's shard instead of one whole file.
    const bool sharded =
        std::any_of(m.files.begin(), m.files.end(), [&](const CheckpointFileEntry& f) {
          return f.path == layout::optimizer_shard_file(0, static_cast<size_t>(i));
        });
    if (!sharded) {
      files.emplace_back(layout::optimizer_file(i), "optimizer");
      continue;
    }
    for (int r = 0; r < m.world_size; ++r) {
      files.emplace_back(layout::optimizer_shard_file(r, static_cast<size_t>(i)),
                         detail::str("optimizer ", i, "'s shard of rank ", r));
    }
  }
  for (int i = 0; i < m.custom_objects; ++i)
    files.emplace_back(layout::custom_file(i), "registered object");
  if (m.scaler) files.emplace_back(layout::kScalerFile, "fp16 loss scaler");
  files.emplace_back(layout::kStateFile, "training state");
  for (int r = 0; r < m.world_size; ++r)
    files.emplace_back(layout::rng_file(r), detail::str("random generators of rank ", r));
  return files;
}

// Whether the manifest's file list is the one its counts and world size imply: a file it
// needs but does not list would otherwise surface as LibTorch's "No such serialized tensor".
std::vector<std::string> role_problems(const CheckpointManifest& m) {
  std::vector<std::string> problems;
  const auto expected = expected_files(m);
  auto listed = [&](const std::string& path) {
    return std::any_of(m.files.begin(), m.files.end(),
                       [&](const CheckpointFileEntry& f) { return f.path == path; });
  };
  for (const auto& [path, role] : expected) {
    if (!listed(path)) {
      problems.push_back(detail::str(
          path, " (the ", role, ") is not in the manifest's file list ", "although its counts (",
          m.models, " model(s), ", m.optimizers, " optimizer(s), ", m.custom_objects,
          " registered object(s), world size ", m.world_size, ") need it"));
    }
  }
  // Optional: a rank's accumulated gradients, present only when saved mid-accumulation, and its
  // positions in stream loaders, present only when the run prepared some.
  auto optional_file = [&](const std::string& path) {
    for (int r = 0; r < m.world_size; ++r) {
      if (path == detail::layout::gradients_file(r)) return true;
      if (detail::layout::is_stream_file(path, r)) return true;
    }
    return false;
  };
  for (const auto& f : m.files) {
    const bool known =
        optional_file(f.path) || std::any_of(expected.begin(), expected.end(),
                                             [&](const auto& e) { return e.first == f.path; });
    if (!known) {
      problems.push_back(detail::str(f.path, " is in the manifest's file list but has no role in ",
                                     "a checkpoint of ", m.models, " model(s), ", m.optimizers,
                                     " optimizer(s), ", m.custom_objects,
                                     " registered object(s) and world size ", m.world_size));
    }
  }
  return problems;
}

}  // namespace

CheckpointManifest read_checkpoint_manifest(const std::string& dir) {
  if (!detail::is_directory(dir)) {
    throw CheckpointError(
        detail::str("no checkpoint at ", dir, ": it is not a directory. Fix: pass a directory ",
                    "written by save_state (e.g. <project_dir>/checkpoints/checkpoint_3)."),
        dir);
  }
  const std::string path = dir + "/manifest.json";
  if (!detail::path_exists(path)) {
    throw CheckpointError(
        detail::str(dir, " is not a complete checkpoint: it has no manifest.json. Likely cause: ",
                    "it is not a checkpoint directory, or a save into it was interrupted before ",
                    "it finished. Fix: use a complete checkpoint (latest_checkpoint() finds one)."),
        dir);
  }
  return parse_checkpoint_manifest(read_json_file(path), path);
}

CheckpointTrainingState read_checkpoint_state(const std::string& dir) {
  const std::string path = dir + "/state.json";
  if (!detail::path_exists(path)) {
    throw CheckpointError(
        detail::str(dir, " has no state.json. Likely cause: it was damaged or is not a checkpoint ",
                    "directory. Fix: run `accelerant checkpoint verify ", dir, "`, or use another ",
                    "checkpoint."),
        path);
  }
  return parse_checkpoint_state(read_json_file(path), path);
}

namespace {

std::string crc_problem(const std::string& file, uint32_t crc, uint32_t expected) {
  char text[64];
  std::snprintf(text, sizeof text, "CRC-32 %08x, the manifest says %08x", crc, expected);
  return detail::str(file, " is corrupted: ", text);
}

[[noreturn]] void throw_damaged(const std::string& dir, const std::vector<std::string>& problems,
                                const std::string& first_bad) {
  throw CheckpointError(
      detail::str("checkpoint ", dir, " is damaged: ", detail::join(problems, "; "),
                  ". Nothing was loaded. Likely cause: a disk or copy error, or the files were ",
                  "changed after saving. Fix: load an older checkpoint (or restore this one ",
                  "from a backup)."),
      first_bad);
}

// verify_checkpoint, and with `contents` false everything it checks but the files' CRC-32.
CheckpointManifest check_checkpoint(const std::string& dir, bool contents) {
  CheckpointManifest manifest = read_checkpoint_manifest(dir);
  std::vector<std::string> problems = role_problems(manifest);
  std::string first_bad = problems.empty() ? "" : dir + "/" + detail::layout::kManifestFile;
  for (const auto& f : manifest.files) {
    const std::string path = dir + "/" + f.path;
    struct stat st {};
    std::string problem;
    const std::string link = first_symlink(dir, f.path);
    if (!link.empty()) {
      problem = detail::str(link, " is a symbolic link (a checkpoint holds its own files; links ",
                            "are not followed)");
    } else if (::stat(path.c_str(), &st) != 0) {
      problem = detail::str(f.path, " is missing");
    } else if (static_cast<uint64_t>(st.st_size) != f.size) {
      problem = detail::str(f.path, " has ", st.st_size, " bytes, the manifest says ", f.size,
                            static_cast<uint64_t>(st.st_size) < f.size ? " (truncated)" : "");
    } else if (contents) {
      uint32_t crc = 0;
      if (!detail::crc32_of_file(path, &crc)) {
        problem = detail::str(f.path, " cannot be read");
      } else if (crc != f.crc32) {
        problem = crc_problem(f.path, crc, f.crc32);
      }
    }
    if (!problem.empty()) {
      if (first_bad.empty()) first_bad = path;
      problems.push_back(problem);
    }
  }
  if (!problems.empty()) throw_damaged(dir, problems, first_bad);
  return manifest;
}

}  // namespace

CheckpointManifest verify_checkpoint(const std::string& dir) { return check_checkpoint(dir, true); }

namespace detail {

CheckpointManifest verify_checkpoint_layout(const std::string& dir) {
  return check_checkpoint(dir, false);
}

namespace {

// The manifest's entry of `name`, or the damaged-checkpoint error.
const CheckpointFileEntry& listed_entry(const std::string& dir, const CheckpointManifest& manifest,
                                        const std::string& name) {
  const auto listed = std::find_if(manifest.files.begin(), manifest.files.end(),
                                   [&](const auto& f) { return f.path == name; });
  if (listed == manifest.files.end()) {
    throw_damaged(dir, {detail::str(name, " is not in the manifest's file list")},
                  dir + "/" + name);
  }
  return *listed;
}

// The damaged-checkpoint error when `name`'s size or CRC-32 is not the manifest's.
void check_size_and_crc(const std::string& dir, const CheckpointFileEntry& listed,
                        const std::string& name, uint64_t size, uint32_t crc) {
  if (size == listed.size && crc == listed.crc32) return;
  throw_damaged(
      dir,
      {size != listed.size ? detail::str(name, " has ", size, " bytes, the manifest says ",
                                         listed.size, " (changed while loading)")
                           : crc_problem(name, crc, listed.crc32)},
      dir + "/" + name);
}

}  // namespace

std::string read_checked_file(const std::string& dir, const CheckpointManifest& manifest,
                              const std::string& name) {
  const CheckpointFileEntry& listed = listed_entry(dir, manifest, name);
  const std::string path = dir + "/" + name;
  // JSON files are read within their bound (layout::kMaxJsonBytes), as everywhere else.
  const bool json = name.size() > 5 && name.compare(name.size() - 5, 5, ".json") == 0;
  std::string bytes = json ? read_json_file(path) : read_file(path);
  check_size_and_crc(dir, listed, name, bytes.size(), crc32_of(bytes));
  return bytes;
}

void check_listed_file(const std::string& dir, const CheckpointManifest& manifest,
                       const std::string& name) {
  const CheckpointFileEntry& listed = listed_entry(dir, manifest, name);
  const std::string path = dir + "/" + name;
  struct stat st {};
  uint32_t crc = 0;
  if (::stat(path.c_str(), &st) != 0 || !crc32_of_file(path, &crc)) {
    throw_damaged(dir, {detail::str(name, " cannot be read")}, path);
  }
  check_size_and_crc(dir, listed, name, static_cast<uint64_t>(st.st_size), crc);
}

}  // namespace detail

int64_t checkpoint_iteration(const std::string& path) {
  const std::string name = detail::base_name(path);
  const std::string prefix = "checkpoint_";
  if (name.compare(0, prefix.size(), prefix) != 0 || name.size() == prefix.size()) return -1;
  int64_t n = 0;
  for (size_t i = prefix.size(); i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9' || n > (INT64_MAX - 9) / 10) return -1;
    n = n * 10 + (name[i] - '0');
  }
  return n;
}

std::vector<std::string> list_checkpoints(const std::string& checkpoints_dir) {
  std::vector<std::pair<int64_t, std::string>> found;
  for (const auto& name : detail::list_directory(checkpoints_dir)) {
    const int64_t n = checkpoint_iteration(name);
    const std::string path = checkpoints_dir + "/" + name;
    if (n >= 0 && detail::path_exists(path + "/manifest.json")) found.emplace_back(n, path);
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> paths;
  for (auto& [n, path] : found) paths.push_back(std::move(path));
  return paths;
}

std::optional<std::string> latest_checkpoint(const std::string& checkpoints_dir) {
  auto all = list_checkpoints(checkpoints_dir);
  if (all.empty()) return std::nullopt;
  return all.back();
}

}  // namespace accelerant
