// TokenWindows: a batch is a pure function of (seed, rank, index), its target is its data one
// token later in the source, every start position is drawn and none past the last full window;
// the position moves, saves and loads (refusing another stream's archive); token files of every
// type map back to the values written (uint16 above 32767 included) and bad files are refused
// without hanging; the contiguous windows cover a split in order; and prepared on two processes
// each rank draws its own batches and save_state / load_state resumes every rank where it was.
#include <accelerant/accelerant.h>
#include <accelerant/token_windows.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <fstream>
#include <future>
#include <sstream>
#include <thread>

#include "test_support.h"

using namespace accelerant;
using accelerant::testing::contains;
using accelerant::testing::error_message;
using accelerant::testing::ScratchDir;

namespace {

// Token i is 3 * i + 7: a row's first token tells where its window starts.
torch::Tensor numbered_tokens(int64_t n) { return torch::arange(n, torch::kLong) * 3 + 7; }

TokenWindowOptions options(int64_t window, int64_t batch, uint64_t seed = 1, int rank = 0) {
  return TokenWindowOptions().window(window).batch_size(batch).seed(seed).rank(rank);
}

bool same_batch(const Batch& a, const Batch& b) {
  return torch::equal(a.data, b.data) && torch::equal(a.target, b.target);
}

// Writes `values` as `bytes`-byte little-endian integers, whatever this machine's byte order.
void write_tokens(const std::string& path, const std::vector<int64_t>& values, int bytes) {
  std::ofstream out(path, std::ios::binary);
  for (int64_t v : values) {
    const auto u = static_cast<uint64_t>(v);
    for (int b = 0; b < bytes; ++b) out.put(static_cast<char>((u >> (8 * b)) & 0xFF));
  }
}

// Every token of a stream whose window divides its length less one, read back through its
// contiguous windows.
std::vector<int64_t> read_back(const TokenWindows& windows) {
  const Batch all = windows.contiguous_batch(0, windows.contiguous_windows());
  auto flat = all.data.reshape({-1}).contiguous();
  std::vector<int64_t> values(flat.data_ptr<int64_t>(), flat.data_ptr<int64_t>() + flat.numel());
  values.push_back(all.target[-1][-1].item<int64_t>());  // the last window's last target
  return values;
}

}  // namespace

TEST(TokenWindows, ABatchIsAFunctionOfSeedRankAndIndex) {
  auto a = TokenWindows::from_tensor(numbered_tokens(10000), options(16, 4));
  auto b = TokenWindows::from_tensor(numbered_tokens(10000), options(16, 4));
  for (int64_t i = 0; i < 5; ++i) {
    EXPECT_EQ(a.position(), i);
    const Batch next = a.next();
    EXPECT_TRUE(same_batch(next, b.batch_at(i))) << "batch " << i;
    EXPECT_EQ(next.data.sizes(), (std::vector<int64_t>{4, 16}));
    EXPECT_EQ(next.data.scalar_type(), torch::kLong);
  }
  EXPECT_EQ(b.position(), 0) << "batch_at moved the stream";
  // Other ranks, other seeds and neighbouring indices draw other windows.
  auto rank1 = TokenWindows::from_tensor(numbered_tokens(10000), options(16, 4, 1, 1));
  auto seed2 = TokenWindows::from_tensor(numbered_tokens(10000), options(16, 4, 2, 0));
  for (int64_t i = 0; i < 5; ++i) {
    EXPECT_FALSE(same_batch(a.batch_at(i), rank1.batch_at(i))) << "batch " << i;
    EXPECT_FALSE(same_batch(a.batch_at(i), seed2.batch_at(i))) << "batch " << i;
    EXPECT_FALSE(same_batch(a.batch_at(i), a.batch_at(i + 1))) << "batch " << i;
  }
}

TEST(TokenWindows, TheTargetIsTheSourceOneTokenLater) {
  const auto tokens = numbered_tokens(500);
  auto windows = TokenWindows::from_tensor(tokens, options(8, 6));
  for (int64_t i = 0; i < 20; ++i) {
    const Batch batch = windows.next();
    for (int64_t r = 0; r < 6; ++r) {
      const int64_t start = (batch.data[r][0].item<int64_t>() - 7) / 3;
      EXPECT_TRUE(torch::equal(batch.data[r], tokens.narrow(0, start, 8)));
      EXPECT_TRUE(torch::equal(batch.target[r], tokens.narrow(0, start + 1, 8)));
    }
  }
}

// 21 tokens and windows of 4: starts 0..16 all have their 4 targets, 17 would not. 4000 draws
// reach every start and none beyond, about equally often.
TEST(TokenWindows, EveryStartIsDrawnAboutEquallyAndNoneRunsPastTheEnd) {
  auto windows = TokenWindows::from_tensor(torch::arange(21, torch::kLong), options(4, 8));
  std::vector<int64_t> count(21, 0);
  for (int64_t i = 0; i < 500; ++i) {
    const auto starts = windows.next().data.select(1, 0);
    for (int64_t r = 0; r < starts.numel(); ++r) ++count.at(starts[r].item<int64_t>());
  }
  for (int64_t s = 0; s <= 16; ++s) {
    EXPECT_GT(count[s], 4000 / 17 / 2) << "start " << s;
    EXPECT_LT(count[s], 4000 / 17 * 2) << "start " << s;
  }
  for (int64_t s = 17; s < 21; ++s) EXPECT_EQ(count[s], 0) << "start " << s;
}

TEST(TokenWindows, ThePositionMovesAndCopiesShareIt) {
  auto windows = TokenWindows::from_tensor(numbered_tokens(1000), options(8, 2));
  const Batch seventh = windows.batch_at(7);
  windows.set_position(7);
  EXPECT_TRUE(same_batch(windows.next(), seventh));
  EXPECT_EQ(windows.position(), 8);
  TokenWindows copy = windows;
  copy.next();
  EXPECT_EQ(windows.position(), 9);
  EXPECT_FALSE(error_message([&] { windows.set_position(-1); }).empty());
  EXPECT_EQ(windows.position(), 9);
  // for_process: rank 1's stream, from position 0, moving on its own.
  auto other = windows.for_process(1, torch::kCPU);
  EXPECT_EQ(other.position(), 0);
  EXPECT_EQ(other.options().rank(), 1);
  auto rank1 = TokenWindows::from_tensor(numbered_tokens(1000), options(8, 2, 1, 1));
  EXPECT_TRUE(same_batch(other.next(), rank1.batch_at(0)));
  EXPECT_EQ(windows.position(), 9);
}

TEST(TokenWindows, ASavedPositionLoadsOnlyIntoTheSameStream) {
  auto windows = TokenWindows::from_tensor(numbered_tokens(1000), options(8, 2));
  for (int i = 0; i < 5; ++i) windows.next();
  std::stringstream saved;
  {
    torch::serialize::OutputArchive archive;
    windows.save(archive);
    archive.save_to(saved);
  }
  auto load_into = [&](TokenWindows& target) {
    std::stringstream in(saved.str());
    torch::serialize::InputArchive archive;
    archive.load_from(in);
    target.load(archive);
  };
  auto resumed = TokenWindows::from_tensor(numbered_tokens(1000), options(8, 2));
  load_into(resumed);
  EXPECT_EQ(resumed.position(), 5);
  EXPECT_TRUE(same_batch(resumed.next(), windows.next()));
  // Another seed, window, batch size or token count: refused, the position left as it was.
  for (auto other : {TokenWindows::from_tensor(numbered_tokens(1000), options(8, 2, 9)),
                     TokenWindows::from_tensor(numbered_tokens(1000), options(9, 2)),
                     TokenWindows::from_tensor(numbered_tokens(1000), options(8, 3)),
                     TokenWindows::from_tensor(numbered_tokens(999), options(8, 2))}) {
    other.set_position(2);
    const std::string message = error_message([&] { load_into(other); });
    EXPECT_TRUE(contains(message, "Fix:")) << message;
    EXPECT_EQ(other.position(), 2);
  }
  // The rank is not part of it: every process loads the main process's position.
  auto rank1 = TokenWindows::from_tensor(numbered_tokens(1000), options(8, 2, 1, 1));
  load_into(rank1);
  EXPECT_EQ(rank1.position(), 5);
}

TEST(TokenWindows, TokenFilesOfEveryTypeReadBackTheValuesWritten) {
  ScratchDir dir;
  struct Case {
    TokenType type;
    int bytes;
    std::vector<int64_t> values;
  };
  const std::vector<Case> cases = {
      {TokenType::kUInt8, 1, {0, 1, 127, 128, 200, 255, 3}},
      {TokenType::kUInt16, 2, {0, 50256, 32767, 32768, 40000, 65535, 1}},
      {TokenType::kInt32, 4, {0, -5, 70000, 2147483647, 40000, 65536, 2}},
      {TokenType::kInt64, 8, {0, 1LL << 40, -1, 5000000000LL, 40000, 65536, 3}}};
  for (const auto& c : cases) {
    const std::string path = dir.path + "/tokens" + std::to_string(c.bytes) + ".bin";
    write_tokens(path, c.values, c.bytes);
    auto windows = TokenWindows::from_file(path, c.type, options(2, 1));
    EXPECT_EQ(windows.num_tokens(), 7);
    EXPECT_EQ(windows.contiguous_windows(), 3);
    EXPECT_EQ(read_back(windows), c.values) << c.bytes << "-byte tokens";
    // Random windows read the mapping too.
    const Batch batch = windows.next();
    EXPECT_EQ(batch.data.scalar_type(), torch::kLong);
    EXPECT_GE(batch.data.min().item<int64_t>(), c.bytes <= 2 ? 0 : -5);
  }
}

TEST(TokenWindows, BadFilesAndOptionsAreRefused) {
  ScratchDir dir;
  write_tokens(dir.path + "/odd.bin", {1, 2, 3}, 1);  // 3 bytes: not whole uint16 tokens
  EXPECT_TRUE(contains(error_message([&] {
                         TokenWindows::from_file(dir.path + "/odd.bin", TokenType::kUInt16,
                                                 options(1, 1));
                       }),
                       "not a whole number"))
      << "odd size";
  EXPECT_TRUE(contains(error_message([&] {
                         TokenWindows::from_file(dir.path + "/missing.bin", TokenType::kUInt16,
                                                 options(1, 1));
                       }),
                       "cannot open"));
  EXPECT_TRUE(contains(
      error_message([&] { TokenWindows::from_file(dir.path, TokenType::kUInt16, options(1, 1)); }),
      "not a regular file"));
  // Ten tokens hold windows of up to 9 (each needs one more token as its last target).
  write_tokens(dir.path + "/ten.bin", {0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, 2);
  EXPECT_EQ(TokenWindows::from_file(dir.path + "/ten.bin", TokenType::kUInt16, options(9, 1))
                .num_tokens(),
            10);
  EXPECT_TRUE(contains(error_message([&] {
                         TokenWindows::from_file(dir.path + "/ten.bin", TokenType::kUInt16,
                                                 options(10, 1));
                       }),
                       "window + 1"));
  for (const auto& f : std::vector<std::function<void()>>{
           [] { TokenWindows::from_tensor(torch::arange(10), options(0, 1)); },
           [] { TokenWindows::from_tensor(torch::arange(10), options(4, 0)); },
           [] { TokenWindows::from_tensor(torch::arange(10), options(4, 1, 0, -1)); },
           [] {
             TokenWindows::from_tensor(torch::zeros({4, 4}, torch::kLong), options(2, 1));
           },
           [] { TokenWindows::from_tensor(torch::zeros({10}), options(2, 1)); }}) {
    EXPECT_TRUE(contains(error_message(f), "Fix:")) << error_message(f);
  }
}

// A FIFO opened for reading blocks until a writer comes: it must be refused, not waited on. The
// call runs on a thread so that a hang fails this test instead of stalling the binary.
TEST(TokenWindows, AFifoIsRefusedWithoutWaitingForAWriter) {
  ScratchDir dir;
  const std::string fifo = dir.path + "/train.bin";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  auto result = std::make_shared<std::promise<std::string>>();
  auto answer = result->get_future();
  std::thread([result, fifo] {
    result->set_value(
        error_message([&] { TokenWindows::from_file(fifo, TokenType::kUInt16, options(4, 1)); }));
  }).detach();
  ASSERT_EQ(answer.wait_for(std::chrono::seconds(10)), std::future_status::ready)
      << "from_file waits on the FIFO";
  EXPECT_TRUE(contains(answer.get(), "not a regular file"));
}

TEST(TokenWindows, ContiguousWindowsCoverTheSplitInOrder) {
  const auto tokens = numbered_tokens(23);  // (23 - 1) / 5 = 4 windows; the last token a target
  auto windows = TokenWindows::from_tensor(tokens, options(5, 1));
  ASSERT_EQ(windows.contiguous_windows(), 4);
  const Batch all = windows.contiguous_batch(0, 4);
  EXPECT_TRUE(torch::equal(all.data.reshape({-1}), tokens.narrow(0, 0, 20)));
  for (int64_t i = 0; i < 4; ++i)
    EXPECT_TRUE(torch::equal(all.target[i], tokens.narrow(0, 5 * i + 1, 5))) << "window " << i;
  EXPECT_TRUE(same_batch(windows.contiguous_batch(2, 1),
                         Batch(all.data.narrow(0, 2, 1), all.target.narrow(0, 2, 1))));
  for (auto [first, rows] : std::vector<std::pair<int64_t, int64_t>>{{3, 2}, {-1, 1}, {0, 0}}) {
    EXPECT_TRUE(contains(error_message([&] { windows.contiguous_batch(first, rows); }), "Fix:"))
        << first << ", " << rows;
  }
  EXPECT_EQ(windows.position(), 0) << "contiguous batches moved the random stream";
}

namespace {

// On each rank: prepare the stream, resume from `load_dir` if given, draw `draws` batches (saving
// into `save_dir` after `save_after` of them); returns the drawn batches' data, concatenated.
torch::Tensor draw_prepared(int index, const std::string& load_dir, const std::string& save_dir,
                            int save_after, int draws) {
  Accelerator acc(AcceleratorOptions().cpu(true));
  auto prepared = acc.prepare(TokenWindows::from_tensor(numbered_tokens(5000), options(8, 3, 4)));
  if (!load_dir.empty()) acc.load_state(load_dir);
  std::vector<torch::Tensor> drawn;
  for (int i = 0; i < draws; ++i) {
    drawn.push_back(prepared.next().data);
    if (i + 1 == save_after) acc.save_state(save_dir);
  }
  // What this rank's stream draws, unprepared, at those positions (first row: the position).
  auto own = TokenWindows::from_tensor(numbered_tokens(5000), options(8, 3, 4, index));
  const int64_t first = prepared.position() - draws;
  for (int i = 0; i < draws; ++i) {
    if (!torch::equal(drawn[i], own.batch_at(first + i).data)) return torch::tensor({int64_t{-1}});
  }
  return torch::cat({torch::tensor({first}), torch::cat(drawn).reshape({-1})});
}

}  // namespace

TEST(TokenWindows, PreparedOnTwoProcessesEachRankDrawsItsOwnAndResumes) {
  ScratchDir scratch;
  const std::string dir = scratch.path + "/ckpt";
  const auto ranks = LaunchOptions()
                         .processes_per_node(2)
                         .collective_timeout(std::chrono::seconds(60))
                         .verbose(false);
  const auto whole =
      launch([dir](int index) { return draw_prepared(index, "", dir, 3, 6); }, ranks);
  const auto resumed =
      launch([dir](int index) { return draw_prepared(index, dir, "", 0, 3); }, ranks);
  const int64_t batch = 3 * 8;
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(whole[r].numel(), 1 + 6 * batch) << "rank " << r << " drew another rank's stream";
    ASSERT_EQ(resumed[r].numel(), 1 + 3 * batch) << "rank " << r << " drew another rank's stream";
    EXPECT_EQ(resumed[r][0].item<int64_t>(), 3) << "rank " << r << " resumed elsewhere";
    EXPECT_TRUE(torch::equal(resumed[r].narrow(0, 1, 3 * batch),
                             whole[r].narrow(0, 1 + 3 * batch, 3 * batch)))
        << "rank " << r;
  }
  EXPECT_FALSE(torch::equal(whole[0], whole[1])) << "both ranks drew the same windows";
}
