#include "checkpoint/stream_positions.h"

#include <nlohmann/json.hpp>

#include "accelerant/checkpoint.h"
#include "base/bounded_input.h"
#include "base/text.h"

namespace accelerant::detail {
namespace {

using nlohmann::json;

template <class T>
T field(const json& doc, const char* name, const std::string& where) {
  auto it = doc.find(name);
  if (it == doc.end()) {
    throw CheckpointError(str(where, " has no \"", name, "\". Likely cause: the file was edited ",
                              "or damaged. Fix: use another checkpoint."),
                          where);
  }
  try {
    return it->get<T>();
  } catch (const json::exception&) {
    throw CheckpointError(str(where, ": \"", name, "\" is ", it->dump(),
                              ", not a number. Fix: ", "use another checkpoint."),
                          where);
  }
}

}  // namespace

std::string format_stream_position(const SavedStreamPosition& saved) {
  const StreamPosition& p = saved.position;
  const json doc = {{"rank", saved.rank},
                    {"world_size", saved.world_size},
                    {"shards", saved.shards},
                    {"epoch", p.epoch},
                    {"steps_done", p.steps_done},
                    {"shard", p.shard},
                    {"records", p.cursor.records},
                    {"lines", p.cursor.lines},
                    {"byte_offset", p.cursor.byte_offset},
                    {"records_passed", p.records_passed}};
  return doc.dump(2) + "\n";
}

SavedStreamPosition parse_stream_position(const std::string& text, const std::string& where) {
  std::string problem;
  const auto doc = parse_bounded_json(text, &problem);
  if (!doc || !doc->is_object()) {
    throw CheckpointError(str(where, ": ", doc ? "it is not a JSON object" : problem,
                              ". Fix: use another checkpoint."),
                          where);
  }
  SavedStreamPosition saved;
  saved.rank = field<int>(*doc, "rank", where);
  saved.world_size = field<int>(*doc, "world_size", where);
  saved.shards = field<size_t>(*doc, "shards", where);
  StreamPosition& p = saved.position;
  p.epoch = field<int64_t>(*doc, "epoch", where);
  p.steps_done = field<int64_t>(*doc, "steps_done", where);
  p.shard = field<int64_t>(*doc, "shard", where);
  p.cursor.records = field<int64_t>(*doc, "records", where);
  p.cursor.lines = field<int64_t>(*doc, "lines", where);
  p.cursor.byte_offset = field<int64_t>(*doc, "byte_offset", where);
  p.records_passed = field<int64_t>(*doc, "records_passed", where);
  return saved;
}

}  // namespace accelerant::detail
