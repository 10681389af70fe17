#include "accelerant/checkpoint_merge.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <vector>

#include "accelerant/checkpoint.h"
#include "accelerant/error.h"
#include "accelerant/fused_optimizer.h"
#include "accelerant/safetensors.h"
#include "base/file_io.h"
#include "base/text.h"
#include "checkpoint/checkpoint_layout.h"
#include "checkpoint/durable_files.h"
#include "checkpoint/safetensors_stream.h"
#include "checkpoint/state_pieces.h"

namespace accelerant {
namespace {

using detail::str;
namespace layout = detail::layout;

bool lists(const CheckpointManifest& m, const std::string& path) {
  for (const auto& f : m.files) {
    if (f.path == path) return true;
  }
  return false;
}

bool sharded(const CheckpointManifest& m, size_t optimizer) {
  return lists(m, layout::optimizer_shard_file(0, optimizer));
}

// verify_checkpoint would say "rank_1/optimizer_0.pt is missing"; a merge is often run where one
// machine's rank_<r>/ folders never arrived, so the shards get their own message with that fix.
void check_shards_present(const std::string& dir, const CheckpointManifest& m) {
  for (int i = 0; i < m.optimizers; ++i) {
    if (!sharded(m, static_cast<size_t>(i))) continue;
    for (int r = 0; r < m.world_size; ++r) {
      const std::string file = layout::optimizer_shard_file(r, static_cast<size_t>(i));
      if (!lists(m, file) || detail::path_exists(dir + "/" + file)) continue;
      throw CheckpointError(
          str("cannot merge ", dir, ": rank ", r, "'s shard of optimizer ", i, " (", file,
              ") is missing, though the manifest lists it. Under ZeRO every rank writes its own ",
              "shard into rank_<r>/ of the checkpoint; a run on several machines without a shared ",
              "file system leaves each machine's rank_<r>/ folders on that machine. Fix: copy ",
              "rank_", r, "/ from the machine that ran rank ", r, " into ", dir,
              ", or merge an older checkpoint. Nothing was written."),
          dir + "/" + file);
    }
  }
}

std::string without_trailing_slashes(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  return path;
}

// Refuses an `out_dir` that would lose data: a file, a non-empty directory without overwrite, or
// the checkpoint itself (or a folder around it, which overwrite would remove).
void check_out_dir(const std::string& dir, const std::string& out_dir, bool overwrite) {
  if (detail::path_exists(out_dir) && !detail::is_directory(out_dir)) {
    throw CheckpointError(str("cannot merge into ", out_dir, ": it is a file. Fix: pass a new ",
                              "directory (or remove the file)."),
                          out_dir);
  }
  namespace fs = std::filesystem;
  std::error_code ignored;
  const fs::path from = fs::weakly_canonical(dir, ignored),
                 to = fs::weakly_canonical(out_dir, ignored);
  auto inside = [](const fs::path& inner, const fs::path& outer) {
    auto [end, unused] = std::mismatch(outer.begin(), outer.end(), inner.begin(), inner.end());
    return end == outer.end();
  };
  if (inside(to, from) || inside(from, to)) {
    throw CheckpointError(
        str("cannot merge ", dir, " into ", out_dir, ": one holds the other, ",
            "and the merge would change the checkpoint it reads. Fix: pass ",
            "an OUT outside the checkpoint (e.g. ", from.parent_path().string(), "/merged)."),
        out_dir);
  }
  if (!overwrite && detail::is_directory(out_dir) && !detail::list_directory(out_dir).empty()) {
    throw CheckpointError(str("cannot merge into ", out_dir, ": it exists and is not empty, and ",
                              "nothing was written (it is not overwritten unless asked). Fix: ",
                              "pass a new directory, or --force (MergeCheckpointOptions::",
                              "overwrite) to replace it."),
                          out_dir);
  }
}

int64_t file_size(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? static_cast<int64_t>(st.st_size) : 0;
}

// Bytes of a checkpoint file; verify_checkpoint has checked it, so an empty read is a race.
std::string read_whole(const std::string& path) {
  std::string bytes = detail::read_file(path);
  if (bytes.empty() && file_size(path) != 0) {
    throw CheckpointError(str(path, " cannot be read. Fix: check its permissions."), path);
  }
  return bytes;
}

int64_t count_tensors(torch::serialize::InputArchive& archive) {
  int64_t n = 0;
  for (const std::string& key : archive.keys()) {
    torch::serialize::InputArchive nested;
    torch::Tensor tensor;
    if (archive.try_read(key, nested)) {
      n += count_tensors(nested);
    } else if (archive.try_read(key, tensor)) {
      ++n;
    }
  }
  return n;
}

// A sharded model's weights (ZeRO stage 3), safetensors already: copied a few MiB at a time, so
// that the merge never holds the whole model either.
MergedFile copy_model_weights(const std::string& dir, const std::string& tmp,
                              const std::string& name, size_t i) {
  const std::string file = dir + "/" + layout::model_weights_file(i);
  const auto tensors =
      detail::MappedModelWeights(file, detail::MappedModelWeights::At::kFile).shapes().size();
  std::FILE* in = std::fopen(file.c_str(), "rb");
  if (!in) throw CheckpointError(str(file, " cannot be read. Fix: check its permissions."), file);
  detail::DurableFileWriter out(tmp + "/" + name, "the model's weights", /*replace=*/false);
  std::vector<char> buffer(4u << 20);
  size_t n = 0;
  while ((n = std::fread(buffer.data(), 1, buffer.size(), in)) > 0) out.append(buffer.data(), n);
  const bool failed = std::ferror(in) != 0;
  std::fclose(in);
  if (failed) throw CheckpointError(str(file, " could not be read to its end."), file);
  out.commit();
  return {name, static_cast<int64_t>(tensors), static_cast<int64_t>(out.size())};
}

MergedFile write_model(const std::string& dir, const CheckpointManifest& m, const std::string& tmp,
                       const std::string& name, size_t i) {
  if (lists(m, layout::model_weights_file(i))) return copy_model_weights(dir, tmp, name, i);
  const std::string file = layout::model_file(i);
  auto archive = detail::archive_from_bytes(read_whole(dir + "/" + file), dir + "/" + file);
  SafetensorsContents contents;
  contents.metadata["format"] = "pt";  // what Hugging Face's loaders check for PyTorch weights
  for (const std::string& key : archive.keys()) {
    torch::Tensor tensor;
    if (archive.try_read(key, tensor)) contents.tensors.emplace_back(key, tensor);
  }
  write_safetensors(tmp + "/" + name, contents);
  return {name, static_cast<int64_t>(contents.tensors.size()), file_size(tmp + "/" + name)};
}

// Optimizer `i`'s shards merged into the archive a run without ZeRO saves
// (optimizer_state_bytes): a prepare-bound fused update's state under kFusedUpdater beside the
// wrapped optimizer's own save(); a fused type's at the top; the groups' options from rank 0.
std::string merged_optimizer_bytes(const std::string& dir, const CheckpointManifest& m, size_t i) {
  const std::string what = str(dir, "/", layout::optimizer_shard_file(0, i), " ... rank_",
                               m.world_size - 1, "/optimizer_", i, ".pt");
  std::vector<torch::serialize::InputArchive> archives(m.world_size), updaters(m.world_size);
  std::vector<torch::serialize::InputArchive*> shards;
  bool prepare_bound = false;
  // ZeRO stage 3: each process's state of its shares, laid out as these slots say (empty
  // otherwise); merge_share_states makes them whole.
  std::vector<detail::ShareSlot> share_slots;
  for (int r = 0; r < m.world_size; ++r) {
    const std::string path = dir + "/" + layout::optimizer_shard_file(r, i);
    archives[r] = detail::archive_from_bytes(read_whole(path), path);
    const detail::SavedShares saved = detail::saved_shares(archives[r], path);
    if (r == 0) share_slots = saved.slots;
    const bool nested = archives[r].try_read(detail::kFusedUpdater, updaters[r]);
    if (r == 0) prepare_bound = nested;
    if (nested != prepare_bound) {
      throw CheckpointError(
          str(path, " holds its fused state ", nested ? "under " : "outside ",
              detail::kFusedUpdater, ", rank 0's shard ", prepare_bound ? "under" : "outside",
              " it: the shards come from different runs. Fix: merge a checkpoint saved by one ",
              "run."),
          path);
    }
    shards.push_back(prepare_bound ? &updaters[r] : &archives[r]);
  }
  try {
    return detail::archive_to_bytes([&](torch::serialize::OutputArchive& out) {
      auto merge = [&](torch::serialize::OutputArchive& merged) {
        if (share_slots.empty()) {
          merge_optimizer_shards(shards, merged);
        } else {
          detail::merge_share_states(shards, share_slots, merged);
        }
      };
      if (prepare_bound) {
        detail::copy_archive(
            archives[0], out,
            {detail::kFusedUpdater, detail::kSharesOfProcesses, detail::kShareSlotsKey});
        torch::serialize::OutputArchive merged;
        merge(merged);
        out.write(detail::kFusedUpdater, merged);
      } else {
        merge(out);
        detail::copy_group_options(archives[0], out);
      }
    });
  } catch (const CheckpointError&) {
    throw;
  } catch (const std::exception& e) {
    throw CheckpointError(
        str("the shards of optimizer ", i, " (", what, ") do not fit together: ", e.what(),
            ". Likely cause: files from different runs were copied into one checkpoint. Fix: ",
            "merge a checkpoint as one run saved it. Nothing was written."),
        dir + "/" + layout::optimizer_shard_file(0, i));
  }
}

MergedFile write_optimizer(const std::string& dir, const CheckpointManifest& m,
                           const std::string& tmp, size_t i) {
  const std::string bytes = sharded(m, i) ? merged_optimizer_bytes(dir, m, i)
                                          : read_whole(dir + "/" + layout::optimizer_file(i));
  const std::string name = layout::optimizer_file(i);
  detail::write_file_durably(tmp + "/" + name, bytes, str("merged optimizer ", i));
  auto archive = detail::archive_from_bytes(bytes, tmp + "/" + name);
  return {name, count_tensors(archive), static_cast<int64_t>(bytes.size())};
}

}  // namespace

MergedCheckpoint merge_checkpoint(const std::string& dir, const std::string& out_dir_given,
                                  MergeCheckpointOptions options) {
  const std::string out_dir = without_trailing_slashes(out_dir_given);
  const CheckpointManifest unchecked = read_checkpoint_manifest(dir);
  check_shards_present(dir, unchecked);
  CheckpointManifest m;
  try {
    m = verify_checkpoint(dir);
  } catch (const CheckpointError& e) {
    throw CheckpointError(str("cannot merge: ", e.what(), " Nothing was written."), e.path());
  }
  check_out_dir(dir, out_dir, options.overwrite());

  MergedCheckpoint result;
  result.out_dir = out_dir;
  result.world_size = m.world_size;
  result.step = m.step;
  for (int i = 0; i < m.optimizers; ++i) result.sharded_optimizers += sharded(m, i) ? 1 : 0;

  // Written beside out_dir and renamed into place last: out_dir is whole or absent.
  const std::string tmp =
      str(detail::parent_of(out_dir), "/.", detail::base_name(out_dir), ".merging-", ::getpid());
  detail::remove_tree_quietly(tmp);
  try {
    detail::make_directories(tmp);
    for (int i = 0; i < m.models; ++i) {
      const std::string name =
          m.models == 1 ? "model.safetensors" : str("model_", i, ".safetensors");
      result.models.push_back(write_model(dir, m, tmp, name, static_cast<size_t>(i)));
    }
    if (options.optimizer()) {
      for (int i = 0; i < m.optimizers; ++i)
        result.optimizers.push_back(write_optimizer(dir, m, tmp, static_cast<size_t>(i)));
    }
    detail::sync_directory(tmp);
    detail::publish_directory(tmp, out_dir);
  } catch (...) {
    detail::remove_tree_quietly(tmp);
    throw;
  }
  for (auto* files : {&result.models, &result.optimizers}) {
    for (MergedFile& f : *files) f.path = out_dir + "/" + f.path;
  }
  return result;
}

}  // namespace accelerant
