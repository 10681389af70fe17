// The JSON files of a checkpoint: manifest.json, the table of contents that makes a checkpoint
// directory checkable, and state.json, its counters and data positions.
#include <cstdio>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <type_traits>

#include "accelerant/checkpoint.h"
#include "accelerant/error.h"
#include "base/bounded_input.h"
#include "base/text.h"
#include "checkpoint/checkpoint_layout.h"

namespace accelerant {
namespace {

using nlohmann::json;

const char* kFormatName = "accelerant-checkpoint";

std::string hex32(uint32_t v) {
  char text[9];
  std::snprintf(text, sizeof text, "%08x", v);
  return text;
}

// Typed access with errors that name the field.
template <class T>
T field(const json& object, const std::string& name, const std::string& where) {
  if (!object.is_object() || !object.contains(name)) {
    throw CheckpointError(
        detail::str(where, ": the field \"", name, "\" is missing. Likely cause: the file was ",
                    "edited or damaged. Fix: use another checkpoint."),
        where);
  }
  const json& value = object.at(name);
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    // nlohmann converts 3e52 or -1 to any integer type without a word (out of range is undefined
    // behaviour, found by fuzz/fuzz_checkpoint_json): accept only integers that fit T.
    constexpr uint64_t kMax = static_cast<uint64_t>(std::numeric_limits<T>::max());
    bool fits = false;
    if (value.is_number_unsigned()) {
      fits = value.get<uint64_t>() <= kMax;
    } else if (value.is_number_integer()) {
      const int64_t v = value.get<int64_t>();
      fits = v >= 0
                 ? static_cast<uint64_t>(v) <= kMax
                 : std::is_signed_v<T> && v >= static_cast<int64_t>(std::numeric_limits<T>::min());
    }
    if (!fits) {
      throw CheckpointError(
          detail::str(where, ": the field \"", name, "\" is ", value.dump(),
                      ", not an integer in the range of its type. Likely cause: the file was ",
                      "edited or damaged. Fix: use another checkpoint."),
          where);
    }
    return value.is_number_unsigned() ? static_cast<T>(value.get<uint64_t>())
                                      : static_cast<T>(value.get<int64_t>());
  }
  try {
    return value.get<T>();
  } catch (const json::exception&) {
    throw CheckpointError(
        detail::str(where, ": the field \"", name, "\" is ", object.at(name).dump(),
                    ", of the wrong type. Likely cause: the file was edited or damaged. ",
                    "Fix: use another checkpoint."),
        where);
  }
}

// Bounded (base/bounded_input.h, note "Bounded input"): a nesting bomb is refused, not parsed.
json parse_json(const std::string& text, const std::string& where) {
  std::string problem;
  if (text.size() > detail::layout::kMaxJsonBytes) {
    problem = detail::str("it has ", text.size(), " bytes, more than the limit of ",
                          detail::layout::kMaxJsonBytes);
  }
  std::optional<json> doc;
  if (problem.empty()) doc = detail::parse_bounded_json(text, &problem);
  if (!doc) {
    throw CheckpointError(
        detail::str(detail::said_of(where, problem), ". Likely cause: the file was ",
                    "damaged, or is not a file Accelerant wrote. Fix: use another checkpoint."),
        where);
  }
  return std::move(*doc);
}

}  // namespace

CheckpointManifest parse_checkpoint_manifest(const std::string& text, const std::string& where) {
  const json doc = parse_json(text, where);
  if (!doc.is_object() || !doc.contains("format") || !doc["format"].is_string() ||
      doc["format"] != kFormatName) {
    throw CheckpointError(
        detail::str(where, " is not an Accelerant checkpoint manifest (no \"format\": \"",
                    kFormatName, "\"). Fix: point at a directory written by save_state."),
        where);
  }
  CheckpointManifest m;
  m.format_version = field<int>(doc, "format_version", where);
  if (m.format_version < 1 || m.format_version > kCheckpointFormatVersion) {
    throw CheckpointError(
        detail::str(where, " has format version ", m.format_version,
                    "; this Accelerant reads versions 1 to ", kCheckpointFormatVersion,
                    ". Likely cause: it was written by a newer Accelerant (",
                    doc.value("accelerant_version", std::string("unknown")),
                    "). Fix: load it with that version ", "or newer."),
        where);
  }
  // Versions before kCheckpointFormatVersion are upgraded here, field by field, as they appear.
  m.accelerant_version = field<std::string>(doc, "accelerant_version", where);
  m.libtorch_version = field<std::string>(doc, "libtorch_version", where);
  m.created = field<std::string>(doc, "created", where);
  m.world_size = field<int>(doc, "world_size", where);
  m.step = field<int64_t>(doc, "step", where);
  m.epoch = field<int64_t>(doc, "epoch", where);
  const json contents = field<json>(doc, "contents", where);
  const std::string in_contents = where + " (contents)";
  m.models = field<int>(contents, "models", in_contents);
  m.optimizers = field<int>(contents, "optimizers", in_contents);
  m.schedulers = field<int>(contents, "schedulers", in_contents);
  m.data_loaders = field<int>(contents, "data_loaders", in_contents);
  m.custom_objects = field<int>(contents, "custom_objects", in_contents);
  m.scaler = field<bool>(contents, "scaler", in_contents);
  if (m.world_size < 1 || m.step < 0 || m.epoch < 0 || m.models < 0 || m.optimizers < 0 ||
      m.schedulers < 0 || m.data_loaders < 0 || m.custom_objects < 0) {
    throw CheckpointError(
        detail::str(where, ": a count is out of range (world_size ", m.world_size, ", step ",
                    m.step, ", epoch ", m.epoch, "). Likely cause: the file was edited or ",
                    "damaged. Fix: use another checkpoint."),
        where);
  }
  const json files = field<json>(doc, "files", where);
  if (!files.is_array()) {
    throw CheckpointError(
        detail::str(where, ": \"files\" is not a list. Fix: use another checkpoint."), where);
  }
  for (const auto& f : files) {
    const std::string in_file = where + " (an entry of files)";
    CheckpointFileEntry e;
    e.path = field<std::string>(f, "path", in_file);
    e.size = field<uint64_t>(f, "size", in_file);
    const std::string crc = field<std::string>(f, "crc32", in_file);
    char* end = nullptr;
    const unsigned long value = std::strtoul(crc.c_str(), &end, 16);
    if (e.path.empty() || e.path.front() == '/' || e.path.find("..") != std::string::npos ||
        crc.size() != 8 || end != crc.c_str() + crc.size()) {
      throw CheckpointError(
          detail::str(where, ": the file entry ", f.dump(), " is malformed (a relative path ",
                      "inside the checkpoint and an 8-digit hex crc32 expected). Fix: use ",
                      "another checkpoint."),
          where);
    }
    e.crc32 = static_cast<uint32_t>(value);
    m.files.push_back(std::move(e));
  }
  return m;
}

std::string format_checkpoint_manifest(const CheckpointManifest& m) {
  json files = json::array();
  for (const auto& f : m.files)
    files.push_back({{"path", f.path}, {"size", f.size}, {"crc32", hex32(f.crc32)}});
  json doc = {{"format", kFormatName},
              {"format_version", m.format_version},
              {"accelerant_version", m.accelerant_version},
              {"libtorch_version", m.libtorch_version},
              {"created", m.created},
              {"world_size", m.world_size},
              {"step", m.step},
              {"epoch", m.epoch},
              {"contents",
               {{"models", m.models},
                {"optimizers", m.optimizers},
                {"schedulers", m.schedulers},
                {"data_loaders", m.data_loaders},
                {"custom_objects", m.custom_objects},
                {"scaler", m.scaler}}},
              {"files", files}};
  return doc.dump(2) + "\n";
}

CheckpointTrainingState parse_checkpoint_state(const std::string& text, const std::string& where) {
  const json doc = parse_json(text, where);
  CheckpointTrainingState state;
  state.optimizer_steps = field<int64_t>(doc, "optimizer_steps", where);
  state.micro_steps = field<int64_t>(doc, "micro_steps", where);
  const json schedulers = field<json>(doc, "schedulers", where);
  const json loaders = field<json>(doc, "data_loaders", where);
  if (!schedulers.is_array() || !loaders.is_array()) {
    throw CheckpointError(
        detail::str(where,
                    ": \"schedulers\" and \"data_loaders\" must be lists. Likely cause: the ",
                    "file was edited or damaged. Fix: use another checkpoint."),
        where);
  }
  for (const auto& s : schedulers)
    state.scheduler_steps.push_back(field<unsigned>(s, "step_count", where + " (a scheduler)"));
  for (const auto& l : loaders) {
    const std::string in_loader = where + " (a data loader)";
    state.data_loaders.push_back(
        {field<int64_t>(l, "epoch", in_loader), field<int64_t>(l, "samples_done", in_loader),
         field<int64_t>(l, "dataset_size", in_loader), field<uint64_t>(l, "seed", in_loader),
         field<bool>(l, "shuffle", in_loader)});
  }
  return state;
}

std::string format_checkpoint_state(const CheckpointTrainingState& state) {
  json doc = {{"optimizer_steps", state.optimizer_steps},
              {"micro_steps", state.micro_steps},
              {"schedulers", json::array()},
              {"data_loaders", json::array()}};
  for (unsigned steps : state.scheduler_steps) doc["schedulers"].push_back({{"step_count", steps}});
  for (const auto& l : state.data_loaders) {
    doc["data_loaders"].push_back({{"epoch", l.epoch},
                                   {"samples_done", l.samples_done},
                                   {"dataset_size", l.dataset_size},
                                   {"seed", l.seed},
                                   {"shuffle", l.shuffle}});
  }
  return doc.dump(2) + "\n";
}

}  // namespace accelerant
