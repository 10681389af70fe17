// Random fixed-length windows over a token array, as GPT training draws them: each row of a
// batch is `window` consecutive tokens starting at a uniformly random position, and its target is
// the same window shifted by one token.
//
//   auto tokens = accelerant::TokenWindows::from_file("train.bin", accelerant::TokenType::kUInt16,
//       accelerant::TokenWindowOptions().window(64).batch_size(12).seed(1337));
//   auto train = accelerator.prepare(tokens);     // this process's stream, batches on its device
//   for (int64_t step = accelerator.state()->optimizer_steps; step < max_steps; ++step) {
//     accelerant::Batch batch = train.next();     // batch.data [12, 64], batch.target [12, 64]
//     ...
//   }
//
// Steps, not epochs: there is no end and no epoch, only a position (the number of batches this
// stream has handed out). Batch i of a stream is a pure function of (seed, rank, i), so it needs
// no generator state: a run resumed at position i draws exactly the batches the uninterrupted
// run drew, and prepare() registers the position with save_state / load_state. Each process gets
// its own stream (rank), so processes draw different windows, as nanoGPT's DDP does.
//
// The token array is a 1-D integer tensor or a file of little-endian integers (nanoGPT's
// train.bin / val.bin are uint16) mapped into memory read-only: the windows are gathered from the
// mapping, so a corpus larger than memory costs only the pages that are read, and processes
// forked after the mapping share it.
#pragma once
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>
#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <string>

#include "accelerant/batch.h"
#include "accelerant/options.h"

namespace accelerant {

/// The integer type of a token file's elements (little-endian).
enum class TokenType { kUInt8, kUInt16, kInt32, kInt64 };

/// How TokenWindows draws its batches.
struct TokenWindowOptions {
  /// Tokens per row (nanoGPT's block_size). Must be at least 1 and less than the number of
  /// tokens. Default: 0 (unset: refused).
  ACCELERANT_OPTION(int64_t, window) = 0;
  /// Rows per batch on each process. Default: 1.
  ACCELERANT_OPTION(int64_t, batch_size) = 1;
  /// Seed of the window positions; with the rank and the batch index it decides each batch.
  /// Default: 0.
  ACCELERANT_OPTION(uint64_t, seed) = 0;
  /// Which process's stream to draw (each rank draws other windows); Accelerator::prepare sets
  /// it to the process index. Default: 0.
  ACCELERANT_OPTION(int, rank) = 0;
  /// Where the batches are put; Accelerator::prepare sets it to the Accelerator's device.
  /// Default: the CPU.
  ACCELERANT_OPTION(torch::Device, device) = torch::kCPU;
};

/// A stream of batches of random token windows (see the file comment). Copies share the token
/// array and the position.
class TokenWindows {
 public:
  /// Over a 1-D tensor of integer tokens (kept, not copied; moved to the CPU if elsewhere).
  /// Throws Error for another shape or dtype, or fewer than window + 1 tokens.
  static TokenWindows from_tensor(const torch::Tensor& tokens, TokenWindowOptions options);
  /// Over a file of `type` integers, mapped into memory read-only. Throws Error when the file
  /// cannot be opened or is not a regular file, its size is not a whole number of elements, or
  /// it holds fewer than window + 1 tokens.
  static TokenWindows from_file(const std::string& path, TokenType type,
                                TokenWindowOptions options);

  /// The batch at position(), then advances the position: `data` holds the windows, `target`
  /// the same windows one token later, both int64 [batch_size, window] on the device.
  Batch next();
  /// Batch `index` of this stream (what next() returns at that position), without moving.
  Batch batch_at(int64_t index) const;
  /// Batches handed out by next() so far (the next one's index).
  int64_t position() const;
  /// Moves the stream to batch `index` (what load_state does). Throws Error for index < 0.
  void set_position(int64_t index);

  /// Non-overlapping windows, in order: window i covers tokens [i * window, (i + 1) * window],
  /// its last token only as a target. For a loss over a whole split.
  int64_t contiguous_windows() const;
  /// `rows` of those windows starting at window `first`, as one batch (data and target as in
  /// next()). Throws Error when they run past contiguous_windows().
  Batch contiguous_batch(int64_t first, int64_t rows) const;

  /// The options, with the rank and device in force.
  const TokenWindowOptions& options() const;
  /// Tokens in the array.
  int64_t num_tokens() const;
  /// A stream over the same tokens for process `rank` with batches on `device`, at position 0
  /// and with a position of its own (what Accelerator::prepare makes).
  TokenWindows for_process(int rank, torch::Device device) const;

  /// The position, with what it depends on (seed, window, batch size, number of tokens).
  void save(torch::serialize::OutputArchive& archive) const;
  /// The position save() wrote. Throws Error, changing nothing, when the archive was saved over
  /// another token array or with other options (the positions would then mean other batches).
  void load(torch::serialize::InputArchive& archive);

  struct Impl;

 private:
  explicit TokenWindows(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<Impl> impl_;
};

}  // namespace accelerant
