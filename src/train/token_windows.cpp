#include "accelerant/token_windows.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "accelerant/error.h"
#include "base/text.h"

namespace accelerant {

struct TokenWindows::Impl {
  torch::Tensor tokens;      // 1-D, on the CPU, in its stored dtype (uint16 files as int16)
  bool unsigned_16 = false;  // tokens hold uint16 values in int16 elements
  std::string source;        // for messages: "a tensor" or the file's path
  TokenWindowOptions options;
  int64_t position = 0;
};

namespace {

// splitmix64: a well-mixed 64-bit value from (seed, rank, index), so that neighbouring batch
// indices and ranks get unrelated window positions.
uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

void check_options(const TokenWindowOptions& o, int64_t num_tokens, const std::string& source) {
  if (o.window() < 1 || o.batch_size() < 1) {
    throw Error(detail::str("TokenWindows over ", source, ": window ", o.window(),
                            " and batch_size ", o.batch_size(),
                            " must both be at least 1. Fix: set TokenWindowOptions().window(...) "
                            "(tokens per row, nanoGPT's block_size) and .batch_size(...)."));
  }
  if (num_tokens < o.window() + 1) {
    throw Error(detail::str("TokenWindows over ", source, ": ", num_tokens,
                            " tokens, but a window of ", o.window(),
                            " needs at least window + 1 = ", o.window() + 1,
                            " (its target is one token later). Fix: a smaller window, or more "
                            "data."));
  }
  if (o.rank() < 0) {
    throw Error(
        detail::str("TokenWindows: rank ", o.rank(), " is negative. Fix: a process index."));
  }
}

// Rows [start_i, start_i + window] of the token array as int64 data and target on `device`.
Batch gather_windows(const TokenWindows::Impl& impl, const torch::Tensor& starts) {
  const int64_t window = impl.options.window();
  const auto offsets = torch::arange(window + 1, torch::kLong);
  const auto index = starts.unsqueeze(1) + offsets.unsqueeze(0);  // [rows, window + 1]
  torch::Tensor rows = impl.tokens.index({index}).to(torch::kLong);
  if (impl.unsigned_16) rows = rows.bitwise_and(0xFFFF);  // int16 bits read back as uint16
  rows = rows.to(impl.options.device());
  return Batch(rows.narrow(1, 0, window), rows.narrow(1, 1, window));
}

}  // namespace

TokenWindows TokenWindows::from_tensor(const torch::Tensor& tokens, TokenWindowOptions options) {
  if (!tokens.defined() || tokens.dim() != 1 || !at::isIntegralType(tokens.scalar_type(), false)) {
    throw Error(detail::str(
        "TokenWindows::from_tensor needs a 1-D integer tensor of token ids; got ",
        tokens.defined() ? c10::str(tokens.scalar_type(), " of shape ", tokens.sizes())
                         : std::string("an undefined tensor"),
        ". Fix: pass the encoded text as one 1-D int64 (or int32, int16, uint8) tensor."));
  }
  check_options(options, tokens.numel(), "a tensor");
  auto impl = std::make_shared<Impl>();
  impl->tokens = tokens.device().is_cpu() ? tokens.contiguous() : tokens.to(torch::kCPU);
  impl->source = "a tensor";
  impl->options = std::move(options);
  return TokenWindows(std::move(impl));
}

TokenWindows TokenWindows::from_file(const std::string& path, TokenType type,
                                     TokenWindowOptions options) {
  // O_NONBLOCK: a FIFO named like a token file must be refused, not waited on at open().
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    throw Error(detail::str("TokenWindows: cannot open ", path, ": ", std::strerror(errno),
                            ". Fix: pass the path of a token file (e.g. nanoGPT's train.bin)."));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(detail::str("TokenWindows: ", path,
                            " is not a regular file (a directory, device, pipe or socket). Fix: "
                            "pass a file of token ids."));
  }
  const int64_t element = type == TokenType::kUInt8    ? 1
                          : type == TokenType::kUInt16 ? 2
                          : type == TokenType::kInt32  ? 4
                                                       : 8;
  const int64_t bytes = static_cast<int64_t>(st.st_size);
  if (bytes == 0 || bytes % element != 0) {
    ::close(fd);
    throw Error(detail::str("TokenWindows: ", path, " has ", bytes,
                            " bytes, not a whole number of ", element, "-byte tokens",
                            bytes == 0 ? " (it is empty)" : "",
                            ". Likely cause: another token type was written. Fix: pass the "
                            "TokenType the file was written with (nanoGPT writes uint16)."));
  }
  void* mapped = ::mmap(nullptr, static_cast<size_t>(bytes), PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);  // the mapping keeps the file
  if (mapped == MAP_FAILED) {
    throw Error(detail::str("TokenWindows: cannot map ", path,
                            " into memory: ", std::strerror(errno), "."));
  }
  const auto dtype = type == TokenType::kUInt8    ? torch::kByte
                     : type == TokenType::kUInt16 ? torch::kShort
                     : type == TokenType::kInt32  ? torch::kInt
                                                  : torch::kLong;
  const size_t length = static_cast<size_t>(bytes);
  // The tensor owns the mapping: unmapped when the last view of it goes.
  torch::Tensor tokens = torch::from_blob(
      mapped, {bytes / element}, [length](void* p) { ::munmap(p, length); },
      torch::TensorOptions(dtype));
  check_options(options, tokens.numel(), path);
  auto impl = std::make_shared<Impl>();
  impl->tokens = std::move(tokens);
  impl->unsigned_16 = type == TokenType::kUInt16;
  impl->source = path;
  impl->options = std::move(options);
  return TokenWindows(std::move(impl));
}

Batch TokenWindows::next() {
  Batch batch = batch_at(impl_->position);
  ++impl_->position;
  return batch;
}

Batch TokenWindows::batch_at(int64_t index) const {
  if (index < 0) {
    throw Error(detail::str("TokenWindows::batch_at(", index, "): batches count from 0."));
  }
  const auto& o = impl_->options;
  auto generator = at::make_generator<at::CPUGeneratorImpl>(
      mix(mix(o.seed()) ^ mix(static_cast<uint64_t>(o.rank()) + 0x1000) ^
          static_cast<uint64_t>(index)));
  // Starts in [0, tokens - window): every window has its target token.
  const auto starts = torch::randint(impl_->tokens.numel() - o.window(), {o.batch_size()},
                                     generator, torch::TensorOptions(torch::kLong));
  return gather_windows(*impl_, starts);
}

int64_t TokenWindows::position() const { return impl_->position; }

void TokenWindows::set_position(int64_t index) {
  if (index < 0) {
    throw Error(detail::str("TokenWindows::set_position(", index, "): positions count from 0."));
  }
  impl_->position = index;
}

int64_t TokenWindows::contiguous_windows() const {
  return (impl_->tokens.numel() - 1) / impl_->options.window();
}

Batch TokenWindows::contiguous_batch(int64_t first, int64_t rows) const {
  if (first < 0 || rows < 1 || first + rows > contiguous_windows()) {
    throw Error(detail::str(
        "TokenWindows::contiguous_batch(", first, ", ", rows, "): there are ", contiguous_windows(),
        " windows of ", impl_->options.window(),
        " tokens. Fix: first >= 0, rows >= 1, first + rows <= ", contiguous_windows(), "."));
  }
  const auto starts = torch::arange(first, first + rows, torch::kLong) * impl_->options.window();
  return gather_windows(*impl_, starts);
}

const TokenWindowOptions& TokenWindows::options() const { return impl_->options; }

int64_t TokenWindows::num_tokens() const { return impl_->tokens.numel(); }

TokenWindows TokenWindows::for_process(int rank, torch::Device device) const {
  auto impl = std::make_shared<Impl>(*impl_);
  impl->options.rank(rank).device(device);
  check_options(impl->options, impl->tokens.numel(), impl->source);
  impl->position = 0;
  return TokenWindows(std::move(impl));
}

namespace {
// What a saved position depends on: the batches at the same position are the same ones only
// over the same tokens with the same seed, window and batch size.
torch::Tensor identity_of(const TokenWindows::Impl& impl) {
  const auto& o = impl.options;
  return torch::tensor(std::vector<int64_t>{static_cast<int64_t>(o.seed()), o.window(),
                                            o.batch_size(), impl.tokens.numel()});
}
}  // namespace

void TokenWindows::save(torch::serialize::OutputArchive& archive) const {
  archive.write("position", torch::tensor(impl_->position, torch::kLong));
  archive.write("identity", identity_of(*impl_));
}

void TokenWindows::load(torch::serialize::InputArchive& archive) {
  torch::Tensor position, identity;
  archive.read("position", position);
  archive.read("identity", identity);
  const torch::Tensor mine = identity_of(*impl_);
  if (!torch::equal(identity, mine)) {
    const auto a = identity.accessor<int64_t, 1>();
    const auto b = mine.accessor<int64_t, 1>();
    throw Error(detail::str(
        "TokenWindows: the saved position was drawn with seed ", a[0], ", window ", a[1],
        ", batch_size ", a[2], " over ", a[3], " tokens; this stream has seed ", b[0], ", window ",
        b[1], ", batch_size ", b[2], " over ", b[3],
        " tokens, so the same position would be other batches. Fix: resume with the settings "
        "and data the checkpoint was written with, or start a new run (another project_dir)."));
  }
  impl_->position = position.item<int64_t>();
}

}  // namespace accelerant
