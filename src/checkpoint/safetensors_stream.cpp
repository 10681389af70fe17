#include "checkpoint/safetensors_stream.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "accelerant/error.h"
#include "base/text.h"
#include "checkpoint/durable_files.h"
#include "checkpoint/safetensors_format.h"

namespace accelerant::detail {
namespace {

struct DtypeName {
  torch::ScalarType type;
  const char* name;
};

// The names the safetensors specification gives to the dtypes LibTorch 1.13 has.
constexpr DtypeName kDtypes[] = {
    {torch::kBool, "BOOL"},  {torch::kUInt8, "U8"},      {torch::kInt8, "I8"},
    {torch::kInt16, "I16"},  {torch::kInt32, "I32"},     {torch::kInt64, "I64"},
    {torch::kHalf, "F16"},   {torch::kBFloat16, "BF16"}, {torch::kFloat, "F32"},
    {torch::kDouble, "F64"},
};

std::string supported_dtype_names() {
  std::vector<std::string> names;
  for (const auto& d : kDtypes) names.push_back(d.name);
  return join(names, ", ");
}

std::string shard_name(size_t k, size_t n) {
  char name[64];
  std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", k, n);
  return name;
}

bool is_weight_file(const std::string& name) {
  static const std::regex shard(R"(model-\d{5}-of-\d{5}\.safetensors)");
  return name == kSafetensorsSingleFile || name == kSafetensorsIndexFile ||
         std::regex_match(name, shard);
}

}  // namespace

const char* safetensors_dtype_name(torch::ScalarType type) {
  for (const auto& d : kDtypes) {
    if (d.type == type) return d.name;
  }
  return nullptr;
}

bool safetensors_dtype_from_name(const std::string& name, torch::ScalarType* type) {
  for (const auto& d : kDtypes) {
    if (name == d.name) {
      *type = d.type;
      return true;
    }
  }
  return false;
}

std::vector<std::pair<std::string, torch::Tensor>> model_tensors_in_file_order(
    const torch::nn::Module& model) {
  // The order readers expect to see them in.
  std::vector<std::pair<std::string, torch::Tensor>> state;
  for (const auto& p : model.named_parameters(/*recurse=*/true))
    state.emplace_back(p.key(), p.value());
  for (const auto& b : model.named_buffers(/*recurse=*/true))
    state.emplace_back(b.key(), b.value());
  return state;
}

uint64_t TensorLayout::bytes() const {
  uint64_t n = c10::elementSize(dtype);
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

TensorLayout layout_of(const std::string& name, const torch::Tensor& tensor) {
  return {name, tensor.scalar_type(), tensor.sizes().vec()};
}

std::string safetensors_header_bytes(const std::vector<TensorLayout>& tensors,
                                     const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::set<std::string> names;
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    if (t.name.empty() || t.name == "__metadata__") {
      throw Error(str("a safetensors tensor cannot be named \"", t.name,
                      "\". Fix: give every tensor a non-empty name other than __metadata__."));
    }
    if (!names.insert(t.name).second) {
      throw Error(str("the tensor name \"", t.name,
                      "\" appears twice; safetensors names are unique. Fix: rename one."));
    }
    const char* dtype = safetensors_dtype_name(t.dtype);
    if (!dtype) {
      throw Error(
          detail::str("tensor \"", t.name, "\" has dtype ", t.dtype,
                      ", which safetensors cannot hold here. Supported: ", supported_dtype_names(),
                      ". Fix: convert it (e.g. .to(torch::kFloat)) first."));
    }
    header[t.name] = {
        {"dtype", dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.bytes()}}};
    offset += t.bytes();
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data starts 8-byte aligned
  std::string out(8, '\0');
  const uint64_t n = text.size();
  std::memcpy(&out[0], &n, 8);  // little-endian hosts only (encode_safetensors checks)
  return out + text;
}

// ---- one file ------------------------------------------------------------------------------

SafetensorsFileWriter::SafetensorsFileWriter(const std::string& path,
                                             std::vector<TensorLayout> tensors,
                                             const std::string& what)
    : tensors_(std::move(tensors)) {
  const std::string header = safetensors_header_bytes(tensors_, {{"format", "pt"}});
  out_ = std::make_unique<DurableFileWriter>(path, what, /*replace=*/false);
  out_->append(header.data(), header.size());
}

SafetensorsFileWriter::~SafetensorsFileWriter() = default;

void SafetensorsFileWriter::write(const torch::Tensor& tensor) {
  if (next_ >= tensors_.size()) {
    throw Error(
        str("safetensors writer: all ", tensors_.size(), " planned tensors are written already."));
  }
  const TensorLayout& want = tensors_[next_];
  if (tensor.scalar_type() != want.dtype || tensor.sizes().vec() != want.shape) {
    throw Error(detail::str("safetensors writer: tensor \"", want.name, "\" was planned as ",
                            want.dtype, " ", c10::IntArrayRef(want.shape), " and is ",
                            tensor.scalar_type(), " ", tensor.sizes(), " now."));
  }
  const torch::Tensor cpu = tensor.detach().to(torch::kCPU).contiguous();
  out_->append(cpu.data_ptr(), want.bytes());
  ++next_;
}

bool SafetensorsFileWriter::complete() const { return next_ == tensors_.size(); }

void SafetensorsFileWriter::commit() {
  if (!complete()) {
    throw Error(str("safetensors writer: ", next_, " of ", tensors_.size(), " tensors written."));
  }
  out_->commit();
}

uint64_t SafetensorsFileWriter::size() const { return out_->size(); }
uint32_t SafetensorsFileWriter::crc32() const { return out_->crc32(); }

// ---- the writer ----------------------------------------------------------------------------

// Every file is written under a hidden temporary name and takes its own name only in finish(),
// all of them, then the index: a save that fails part-way leaves the earlier save's files as they
// were, never a mix of old and new files under the same names.
struct ModelSafetensorsWriter::Plan {
  std::string dir;
  std::vector<TensorLayout> tensors;
  std::vector<std::vector<size_t>> files;      // the tensors of each file, in order
  size_t next = 0;                             // the next tensor to write
  size_t file = 0;                             // the file being written
  std::unique_ptr<SafetensorsFileWriter> out;  // open while a file is written
  std::vector<std::string> written;            // temporary files complete so far
  bool finished = false;
  SavedModelFiles saved;

  std::string name_of(size_t k) const {
    return files.size() == 1 ? kSafetensorsSingleFile : shard_name(k + 1, files.size());
  }
  std::string temporary_of(size_t k) const { return dir + "/." + name_of(k) + ".partial"; }

  void open(size_t k) {
    std::vector<TensorLayout> layouts;
    for (size_t i : files[k]) layouts.push_back(tensors[i]);
    out = std::make_unique<SafetensorsFileWriter>(temporary_of(k), std::move(layouts),
                                                  "the model weights");
  }

  void close_file() {
    out->commit();
    out.reset();
    written.push_back(temporary_of(file));
  }

  ~Plan() {
    out.reset();
    if (!finished) {
      for (const auto& path : written) std::remove(path.c_str());
      if (file < files.size()) std::remove(temporary_of(file).c_str());
    }
  }
};

ModelSafetensorsWriter::ModelSafetensorsWriter(std::string dir, std::vector<TensorLayout> tensors,
                                               int64_t max_shard_bytes)
    : plan_(std::make_unique<Plan>()) {
  if (max_shard_bytes <= 0) {
    throw Error(str("max_shard_size must be positive; got ", max_shard_bytes,
                    " bytes. Fix: pass e.g. \"10GB\"."));
  }
  Plan& p = *plan_;
  p.dir = std::move(dir);
  p.tensors = std::move(tensors);
  // Greedy packing in model order; a tensor over the limit gets a file of its own.
  p.files.emplace_back();
  uint64_t file_bytes = 0;
  for (size_t i = 0; i < p.tensors.size(); ++i) {
    const uint64_t bytes = p.tensors[i].bytes();
    if (!p.files.back().empty() && file_bytes + bytes > static_cast<uint64_t>(max_shard_bytes)) {
      p.files.emplace_back();
      file_bytes = 0;
    }
    p.files.back().push_back(i);
    file_bytes += bytes;
    p.saved.total_bytes += static_cast<int64_t>(bytes);
  }
  // Every header is checked now, before any file is made.
  for (size_t k = 0; k < p.files.size(); ++k) {
    std::vector<TensorLayout> layouts;
    for (size_t i : p.files[k]) layouts.push_back(p.tensors[i]);
    safetensors_header_bytes(layouts, {});
  }
  make_directories(p.dir);
  p.open(0);
}

ModelSafetensorsWriter::~ModelSafetensorsWriter() = default;  // the Plan removes its files

void ModelSafetensorsWriter::write(const torch::Tensor& tensor) {
  Plan& p = *plan_;
  if (p.next >= p.tensors.size()) {
    throw Error(str("ModelSafetensorsWriter::write: all ", p.tensors.size(),
                    " planned tensors are written already."));
  }
  p.out->write(tensor);
  ++p.next;
  if (p.out->complete()) {
    p.close_file();
    if (++p.file < p.files.size()) p.open(p.file);
  }
}

SavedModelFiles ModelSafetensorsWriter::finish() {
  Plan& p = *plan_;
  if (p.tensors.empty()) {  // nothing planned: the empty file
    p.close_file();
    ++p.file;
  } else if (p.next != p.tensors.size()) {
    throw Error(str("ModelSafetensorsWriter::finish: ", p.next, " of ", p.tensors.size(),
                    " tensors written."));
  }
  // Every file is complete and on disk: now they take their names, the index last.
  for (size_t k = 0; k < p.files.size(); ++k) {
    const std::string final_path = p.dir + "/" + p.name_of(k);
    if (std::rename(p.temporary_of(k).c_str(), final_path.c_str()) != 0) {
      const int error = errno;
      throw CheckpointError(
          str("could not rename ", p.temporary_of(k), " to ", final_path, ": ",
              std::strerror(error), ". Fix: check that ", p.dir, " is writable, then save again."),
          final_path);
    }
    p.saved.weight_files.push_back(p.name_of(k));
  }
  p.finished = true;
  sync_directory(p.dir);
  if (p.files.size() > 1) {
    nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
    for (size_t k = 0; k < p.files.size(); ++k) {
      for (size_t i : p.files[k]) weight_map[p.tensors[i].name] = p.name_of(k);
    }
    nlohmann::ordered_json index = {{"metadata", {{"total_size", p.saved.total_bytes}}},
                                    {"weight_map", weight_map}};
    replace_file_durably(p.dir + "/" + kSafetensorsIndexFile, index.dump(2) + "\n",
                         "the safetensors index");
    p.saved.index_file = kSafetensorsIndexFile;
  }
  // Only now that the new set is complete: remove weight files of an earlier save it replaced.
  std::set<std::string> keep(p.saved.weight_files.begin(), p.saved.weight_files.end());
  if (!p.saved.index_file.empty()) keep.insert(p.saved.index_file);
  for (const auto& name : list_directory(p.dir)) {
    if (is_weight_file(name) && !keep.count(name)) std::remove((p.dir + "/" + name).c_str());
  }
  sync_directory(p.dir);
  return p.saved;
}

// ---- the mapped reader ---------------------------------------------------------------------

struct MappedModelWeights::Files {
  struct Mapping {
    void* base = MAP_FAILED;
    size_t size = 0;
  };
  struct Where {
    size_t mapping;
    uint64_t offset;  // from the mapping's start
    torch::ScalarType dtype;
    std::vector<int64_t> shape;
  };
  std::vector<Mapping> mappings;
  std::map<std::string, Where> tensors;
  std::map<std::string, std::vector<int64_t>> shapes;
  std::string dir;

  ~Files() {
    for (const auto& m : mappings) {
      if (m.base != MAP_FAILED) ::munmap(m.base, m.size);
    }
  }

  // Maps `path`, checks its header (and its BOOL data), and notes where each tensor lies.
  std::vector<std::string> map(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    struct stat st {};
    if (fd < 0 || ::fstat(fd, &st) != 0) {
      const int error = errno;
      if (fd >= 0) ::close(fd);
      throw CheckpointError(str("could not open ", path, ": ", std::strerror(error),
                                ". Fix: check that the file exists and is readable."),
                            path);
    }
    const size_t size = static_cast<size_t>(st.st_size);
    void* base = size > 0 ? ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0) : MAP_FAILED;
    const int error = errno;
    ::close(fd);
    if (base == MAP_FAILED) {
      throw CheckpointError(str("could not map ", path, " (", size,
                                " bytes): ", size == 0 ? "the file is empty" : std::strerror(error),
                                ". Fix: save the model again."),
                            path);
    }
    mappings.push_back({base, size});
    const char* bytes = static_cast<const char*>(base);
    uint64_t header_length = 0;
    if (size >= 8) std::memcpy(&header_length, bytes, 8);
    const size_t prefix = static_cast<size_t>(std::min<uint64_t>(size, 8 + header_length));
    const SafetensorsHeader header =
        parse_safetensors_header(std::string(bytes, prefix), size, path);
    uint64_t data_bytes = 0;
    for (const auto& e : header.tensors) data_bytes += e.data_end - e.data_begin;
    const uint64_t data_start = size - data_bytes;
    check_safetensors_data(header, bytes + data_start, path);
    std::vector<std::string> names;
    for (const auto& e : header.tensors) {
      torch::ScalarType type = torch::kFloat;
      safetensors_dtype_from_name(e.dtype, &type);  // the parser accepted only these
      tensors[e.name] = {mappings.size() - 1, data_start + e.data_begin, type, e.shape};
      shapes[e.name] = e.shape;
      names.push_back(e.name);
    }
    return names;
  }
};

MappedModelWeights::MappedModelWeights(const std::string& path, At at)
    : files_(std::make_unique<Files>()) {
  files_->dir = path;
  if (at == At::kFile) {
    files_->map(path);
    return;
  }
  for_each_model_safetensors_file(path,
                                  [this](const std::string& file) { return files_->map(file); });
}

MappedModelWeights::~MappedModelWeights() = default;

const std::map<std::string, std::vector<int64_t>>& MappedModelWeights::shapes() const {
  return files_->shapes;
}

torch::Tensor MappedModelWeights::tensor(const std::string& name) const {
  auto found = files_->tensors.find(name);
  if (found == files_->tensors.end()) {
    throw CheckpointError(str("the weights in ", files_->dir, " hold no tensor named \"", name,
                              "\". Fix: build the model as the one saved."),
                          files_->dir);
  }
  const Files::Where& w = found->second;
  char* at = static_cast<char*>(files_->mappings[w.mapping].base) + w.offset;
  // Read-only memory, viewed without a copy: callers copy out of it.
  return torch::from_blob(at, w.shape, torch::TensorOptions().dtype(w.dtype));
}

void MappedModelWeights::forget(const std::string& name) const {
  auto found = files_->tensors.find(name);
  if (found == files_->tensors.end()) return;
  const Files::Where& w = found->second;
  const Files::Mapping& m = files_->mappings[w.mapping];
  const uint64_t bytes = TensorLayout{name, w.dtype, w.shape}.bytes();
  // Whole pages around the tensor: a neighbour's page dropped too is only read again.
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t begin = w.offset / page * page;
  const uint64_t end = std::min<uint64_t>(m.size, (w.offset + bytes + page - 1) / page * page);
  if (end > begin) ::madvise(static_cast<char*>(m.base) + begin, end - begin, MADV_DONTNEED);
}

}  // namespace accelerant::detail
