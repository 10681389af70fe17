#include "comm/shm_all_reduce.h"

#include <linux/futex.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <iterator>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include "accelerant/environment.h"
#include "base/file_io.h"
#include "base/text.h"
#include "comm/shared_memory_segment.h"
#include "comm/store_exchange.h"

namespace accelerant::detail {
namespace {

constexpr uint64_t kMagic = 0x61636365'6c73686dULL;  // "accelshm"
constexpr int kMaxRanks = 256;
constexpr size_t kDefaultChunkBytes = 256 * 1024;
// Ends the message of an error that only a bug in Accelerant can cause.
constexpr const char* kInternalFix =
    ". Likely cause: a bug in Accelerant (the Communicator broke an invariant of this class). Fix: "
    "report it "
    "with the full message.";
constexpr size_t kAlign = 64;  // a cache line: the ranks' parts never share one

// One rank's corner of the control block, on a cache line of its own.
struct alignas(64) RankControl {
  std::atomic<uint32_t>
      arrivals;  // barriers this rank has reached (wraps; compared as a difference)
  std::atomic<uint32_t>
      sleepers;  // peers asleep on `arrivals`, so that arriving wakes only when needed
  std::atomic<int32_t> pid;
  // The collective this rank is in: written before its first barrier, read by the peers after
  // it (the barrier publishes them), so that ranks that disagree fail instead of mixing data.
  uint64_t call_count;  // elements of the whole tensor (size * shard for the sharded kinds)
  int32_t call_dtype;
  int32_t call_op;
  int32_t call_kind;  // a CallKind
};

// What a rank's collective is, for the check that every rank is in the same one.
enum CallKind : int32_t { kAllReduce = 0, kReduceScatter = 1, kAllGather = 2 };

const char* kind_name(int32_t kind) {
  switch (kind) {
    case kReduceScatter:
      return "reduce-scatter";
    case kAllGather:
      return "all-gather";
    default:
      return "all-reduce";
  }
}

struct ControlBlock {
  uint64_t magic;
  uint32_t ranks;
  uint64_t chunk_bytes;
  std::atomic<int32_t> aborted_by;  // -1, or the rank that gave up
  RankControl rank[kMaxRanks];
};
static_assert(std::atomic<uint32_t>::is_always_lock_free, "futex words must be plain atomics");

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

size_t chunk_bytes_from_env() {
  const std::string setting = environment_value("ACCELERANT_SHM_CHUNK_BYTES").value_or("");
  if (setting.empty()) return kDefaultChunkBytes;
  const char* text = setting.c_str();
  char* end = nullptr;
  const unsigned long long value = std::strtoull(text, &end, 10);
  if (*end != '\0' || value < 4096 || value > (1ull << 30)) {
    throw Error(
        str("ACCELERANT_SHM_CHUNK_BYTES is \"", text, "\"; expected a number of bytes from 4096 ",
            "to 1073741824. Fix: unset it (default ", kDefaultChunkBytes, ") or correct it."));
  }
  return round_up(static_cast<size_t>(value), kAlign);
}

long futex(std::atomic<uint32_t>* word, int op, uint32_t value, const timespec* timeout) {
  return ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op, value, timeout, nullptr, 0);
}

// A process that exited but was not yet reaped (a zombie) still answers kill(pid, 0).
bool process_gone(pid_t pid) {
  if (::kill(pid, 0) != 0) return errno == ESRCH;
  const std::string text = read_proc_file("/proc/" + std::to_string(pid) + "/stat");
  const size_t paren = text.rfind(')');
  return paren != std::string::npos && paren + 2 < text.size() &&
         (text[paren + 2] == 'Z' || text[paren + 2] == 'X');
}

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// Combines part [begin, end) of a chunk over every rank's slot in rank order,
// ((s0 + s1) + s2) + ..., into the result chunk and this rank's own tensor. Blocks of a few KB
// keep the running result in L1 while each further rank's values are folded in.
// `own` may be one of `slots` (this rank's part is read from its tensor): each block is written
// back to it only after the block was read, and only `result` needs to be restrict.
template <class T, class Combine>
void reduce_part(T* __restrict result, T* own, const std::vector<const T*>& slots, size_t begin,
                 size_t end, Combine combine) {
  constexpr size_t kBlock = 2048;
  for (size_t b = begin; b < end; b += kBlock) {
    const size_t e = std::min(end, b + kBlock);
    const T* s0 = slots[0];
    const T* s1 = slots[1];
    for (size_t i = b; i < e; ++i) result[i] = combine(s0[i], s1[i]);
    for (size_t r = 2; r < slots.size(); ++r) {
      const T* s = slots[r];
      for (size_t i = b; i < e; ++i) result[i] = combine(result[i], s[i]);
    }
    std::memcpy(own + b, result + b, (e - b) * sizeof(T));
  }
}

// Calls f(T{}) with T the C++ type of `dtype`, one of the dtypes the segment reduces.
template <class F>
void with_reduced_type(torch::ScalarType dtype, const char* caller, F&& f) {
  switch (dtype) {
    case torch::kFloat:
      return f(float{});
    case torch::kDouble:
      return f(double{});
    case torch::kInt:
      return f(int32_t{});
    case torch::kLong:
      return f(int64_t{});
    default:
      throw Error(str(caller, ": unsupported dtype ", c10::toString(dtype), kInternalFix));
  }
}

// Folds `parts` (one per rank, at least two) element by element in rank order,
// ((p0 + p1) + p2) + ..., into `out`: reduce_part's order and blocks, so the same bits.
template <class T, class Combine>
void fold_parts(T* __restrict out, const std::vector<const T*>& parts, size_t n, Combine combine) {
  constexpr size_t kBlock = 2048;
  for (size_t b = 0; b < n; b += kBlock) {
    const size_t e = std::min(n, b + kBlock);
    const T* p0 = parts[0];
    const T* p1 = parts[1];
    for (size_t i = b; i < e; ++i) out[i] = combine(p0[i], p1[i]);
    for (size_t r = 2; r < parts.size(); ++r) {
      const T* p = parts[r];
      for (size_t i = b; i < e; ++i) out[i] = combine(out[i], p[i]);
    }
  }
}

// What keeps this rank alone from the shared-memory path (empty: nothing), and in `chunk` the
// slot size ACCELERANT_SHM_CHUNK_BYTES asks for.
std::string local_problem(int size, bool hierarchical, size_t& chunk) {
  std::string failure;
  try {
    chunk = chunk_bytes_from_env();
  } catch (const std::exception& e) {
    failure = e.what();
  }
  if (size < (hierarchical ? 1 : 2) || size > kMaxRanks) {
    failure = str(size, " ranks on this machine (from 2 to ", kMaxRanks, " supported)");
  }
  return failure;
}

std::vector<uint8_t> to_bytes(const std::string& text) {
  return std::vector<uint8_t>(text.begin(), text.end());
}

}  // namespace

struct ShmAllReduce::Shared {
  SharedMemorySegment segment;
  ControlBlock* control = nullptr;
  std::vector<char*> slots;  // one per rank
  char* result = nullptr;
  int rank = 0, size = 1;
  std::chrono::milliseconds timeout{0};
  uint32_t barriers = 0;       // barriers this rank has passed
  std::string broken;          // set after a failure
  std::vector<int> job_ranks;  // this group's ranks in the job, for messages (hierarchical groups)

  int job_rank(int r) const { return job_ranks.empty() ? r : job_ranks[static_cast<size_t>(r)]; }

  // connect's steps, in the order it runs them.
  // Rank 0: creates the segment and publishes its name (or why it could not) as shm/name.
  void create_and_publish(c10d::Store& store, size_t bytes, size_t chunk, std::string& failure);
  // Waits for shm/name; the other ranks map the segment it names and check that it was made for
  // their configuration. Sets `failure` when this rank cannot take part.
  void attach_published(c10d::Store& store, size_t bytes, size_t chunk, std::string& failure);
  // Points control, the slots and the result area into the mapped segment; writes our pid.
  void map_slots(size_t header, size_t chunk);

  std::mutex mutex;
  std::condition_variable wake;
  std::deque<std::packaged_task<void()>> queue;
  bool stopping = false;
  std::thread worker;

  void serve() {
    for (;;) {
      std::packaged_task<void()> task;
      {
        std::unique_lock<std::mutex> lock(mutex);
        wake.wait(lock, [&] { return stopping || !queue.empty(); });
        if (queue.empty()) return;
        task = std::move(queue.front());
        queue.pop_front();
      }
      task();
    }
  }

  [[noreturn]] void give_up(const std::string& reason) {
    broken = reason;
    int32_t none = -1;
    control->aborted_by.compare_exchange_strong(none, rank);
    for (int r = 0; r < size; ++r)
      futex(&control->rank[r].arrivals, FUTEX_WAKE, INT32_MAX, nullptr);
    throw ShmTransportError(reason);
  }

  // Arrives at the next barrier and waits until every rank has.
  void barrier(const std::chrono::steady_clock::time_point deadline) {
    ++barriers;
    RankControl& mine = control->rank[rank];
    mine.arrivals.store(barriers, std::memory_order_seq_cst);
    if (mine.sleepers.load(std::memory_order_seq_cst) > 0)
      futex(&mine.arrivals, FUTEX_WAKE, INT32_MAX, nullptr);
    for (int r = 0; r < size; ++r) {
      if (r != rank) wait_for(r, deadline);
    }
  }

  bool reached(RankControl& peer) const {
    return static_cast<int32_t>(peer.arrivals.load(std::memory_order_acquire) - barriers) >= 0;
  }

  void wait_for(int r, const std::chrono::steady_clock::time_point deadline) {
    RankControl& peer = control->rank[r];
    for (int spin = 0; spin < 4000; ++spin) {
      if (reached(peer)) return;
      cpu_relax();
    }
    for (;;) {
      if (reached(peer)) return;
      const char* kind = kind_name(control->rank[rank].call_kind);
      if (const int32_t by = control->aborted_by.load(); by >= 0) {
        give_up(str("rank ", job_rank(by), " gave up on the shared-memory ", kind,
                    " (it failed or timed out there)"));
      }
      const pid_t pid = peer.pid.load();
      if (pid > 0 && process_gone(pid)) {
        give_up(str("rank ", job_rank(r), " (pid ", pid,
                    ") exited while this rank waited for it in the shared-memory ", kind));
      }
      if (std::chrono::steady_clock::now() >= deadline) {
        give_up(str("rank ", job_rank(r), " did not reach the shared-memory ", kind,
                    " within the timeout of ", timeout.count(), " ms"));
      }
      // Sleep until the peer arrives, at most 5 ms between checks.
      const uint32_t seen = peer.arrivals.load(std::memory_order_acquire);
      peer.sleepers.fetch_add(1, std::memory_order_seq_cst);
      if (!reached(peer)) {
        const timespec nap{0, 5'000'000};
        futex(&peer.arrivals, FUTEX_WAIT, seen, &nap);
      }
      peer.sleepers.fetch_sub(1, std::memory_order_seq_cst);
    }
  }

  // After the first barrier of a collective: every rank must be in the same one.
  void check_same_call() {
    const RankControl& mine = control->rank[rank];
    for (int r = 0; r < size; ++r) {
      const RankControl& peer = control->rank[r];
      if (peer.call_count != mine.call_count || peer.call_dtype != mine.call_dtype ||
          peer.call_op != mine.call_op || peer.call_kind != mine.call_kind) {
        give_up(str("the ranks disagree about this ", kind_name(mine.call_kind), ": rank ",
                    job_rank(rank), " is in ", describe_call(mine), ", rank ", job_rank(r), " in ",
                    describe_call(peer),
                    ". Every rank must run the same collective on tensors of the same size and "
                    "dtype with the same operation, in the same order. Fix: make the ranks issue "
                    "the same collectives (pad per-rank lengths, e.g. pad_across_processes); "
                    "ACCELERANT_DEBUG_MODE=1 names the call that differs"));
      }
    }
  }

  static std::string describe_call(const RankControl& c) {
    return str(kind_name(c.call_kind), " of ", c.call_count, " ",
               c10::toString(static_cast<c10::ScalarType>(c.call_dtype)), " elements",
               c.call_kind == kAllGather
                   ? std::string()
                   : str(" (", to_string(static_cast<ReduceOp>(c.call_op)), ")"));
  }

  void begin(int32_t kind, size_t count, torch::ScalarType dtype, ReduceOp op) {
    RankControl& mine = control->rank[rank];
    mine.call_kind = kind;
    mine.call_count = count;
    mine.call_dtype = static_cast<int32_t>(dtype);
    mine.call_op = static_cast<int32_t>(op == ReduceOp::kMean ? ReduceOp::kSum : op);
  }

  template <class T>
  void all_reduce(T* data, size_t count, ReduceOp op, torch::ScalarType dtype) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    begin(kAllReduce, count, dtype, op);
    if (count == 0) {  // no chunk to carry the check: a barrier of its own on each side
      barrier(deadline);
      check_same_call();
      barrier(deadline);
      return;
    }
    const size_t chunk = control->chunk_bytes / sizeof(T);
    const size_t per_line = kAlign / sizeof(T);
    std::vector<const T*> sources(size);
    for (int r = 0; r < size; ++r) sources[r] = reinterpret_cast<const T*>(slots[r]);
    T* result = reinterpret_cast<T*>(this->result);
    T* mine = reinterpret_cast<T*>(slots[rank]);
    for (size_t offset = 0; offset < count; offset += chunk) {
      const size_t n = std::min(chunk, count - offset);
      const size_t part = round_up((n + size - 1) / size, per_line);
      const size_t begin = std::min(n, part * rank), end = std::min(n, begin + part);
      // The peers read only their own parts of this rank's slot, and this rank folds its own
      // part straight from `data`: (size - 1) / size of the chunk goes through the slot, not all
      // of it (on 2 ranks a fifth less memory traffic per element). Same values, same order.
      std::memcpy(mine, data + offset, begin * sizeof(T));
      std::memcpy(mine + end, data + offset + end, (n - end) * sizeof(T));
      sources[rank] = data + offset;
      barrier(deadline);  // every slot holds this chunk
      // Read before this chunk's second barrier, which no rank passes before all have read.
      if (offset == 0) check_same_call();
      switch (op) {
        case ReduceOp::kMax:
          reduce_part(result, data + offset, sources, begin, end,
                      [](T a, T b) { return std::max(a, b); });
          break;
        case ReduceOp::kMin:
          reduce_part(result, data + offset, sources, begin, end,
                      [](T a, T b) { return std::min(a, b); });
          break;
        default:
          reduce_part(result, data + offset, sources, begin, end, [](T a, T b) { return a + b; });
      }
      barrier(deadline);  // every part of the result is there, and no rank reads the slots any more
      // The other ranks' parts; this rank's own part is already in `data`. The result chunk is
      // not overwritten before every rank has passed the next chunk's first barrier.
      if (begin > 0) std::memcpy(data + offset, result, begin * sizeof(T));
      if (end < n) std::memcpy(data + offset + end, result + end, (n - end) * sizeof(T));
    }
  }

  // A window of `window` elements of every shard per step: part p of a rank's slot holds
  // elements [o, o + k) of its input's shard p; rank r folds part r of every slot into its output.
  template <class T>
  void reduce_scatter(const T* input, T* output, size_t shard, ReduceOp op,
                      torch::ScalarType dtype) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    begin(kReduceScatter, shard * static_cast<size_t>(size), dtype, op);
    const size_t per_line = kAlign / sizeof(T);
    size_t window = control->chunk_bytes / sizeof(T) / static_cast<size_t>(size);
    if (window > per_line) window = window / per_line * per_line;  // parts on cache lines
    std::vector<const T*> parts(size);
    T* mine = reinterpret_cast<T*>(slots[rank]);
    size_t offset = 0;
    do {  // at least one step, so that even an empty shard meets the check
      const size_t k = std::min(window, shard - offset);
      // This rank's own shard is folded straight from `input`: only the peers' parts go through
      // the slot (as in all_reduce).
      for (int p = 0; p < size; ++p) {
        if (p == rank) continue;
        std::memcpy(mine + p * window, input + p * shard + offset, k * sizeof(T));
      }
      barrier(deadline);  // every slot holds this window
      if (offset == 0) check_same_call();
      for (int q = 0; q < size; ++q) {
        parts[q] = q == rank
                       ? input + static_cast<size_t>(rank) * shard + offset
                       : reinterpret_cast<const T*>(slots[q]) + static_cast<size_t>(rank) * window;
      }
      switch (op) {
        case ReduceOp::kMax:
          fold_parts(output + offset, parts, k, [](T a, T b) { return std::max(a, b); });
          break;
        case ReduceOp::kMin:
          fold_parts(output + offset, parts, k, [](T a, T b) { return std::min(a, b); });
          break;
        default:
          fold_parts(output + offset, parts, k, [](T a, T b) { return a + b; });
      }
      barrier(deadline);  // no rank reads the slots any more
      offset += k;
    } while (offset < shard);
  }

  // Each rank's input through its slot, a slot's worth of bytes per step, to every rank.
  void all_gather(const char* input, char* output, size_t count, size_t element_bytes,
                  torch::ScalarType dtype) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    begin(kAllGather, count * static_cast<size_t>(size), dtype, ReduceOp::kSum);
    const size_t shard = count * element_bytes;
    const size_t window = control->chunk_bytes;
    size_t offset = 0;
    do {
      const size_t k = std::min(window, shard - offset);
      std::memcpy(slots[rank], input + offset, k);
      barrier(deadline);
      if (offset == 0) check_same_call();
      for (int q = 0; q < size; ++q) {
        char* to = output + q * shard + offset;
        if (q != rank) {
          std::memcpy(to, slots[q], k);
        } else if (to != input + offset) {  // in place (input is this part of output): nothing
          std::memcpy(to, input + offset, k);
        }
      }
      barrier(deadline);
      offset += k;
    } while (offset < shard);
  }

  void run_reduce_scatter(const torch::Tensor& input, const torch::Tensor& output, ReduceOp op) {
    if (!broken.empty())
      throw ShmTransportError(str("the shared-memory collectives broke earlier: ", broken));
    const size_t shard = static_cast<size_t>(output.numel());
    with_reduced_type(input.scalar_type(), "ShmAllReduce::run_reduce_scatter", [&](auto zero) {
      using T = decltype(zero);
      reduce_scatter(input.data_ptr<T>(), output.data_ptr<T>(), shard, op, input.scalar_type());
    });
  }

  void run_all_gather(const torch::Tensor& input, const torch::Tensor& output) {
    if (!broken.empty())
      throw ShmTransportError(str("the shared-memory collectives broke earlier: ", broken));
    all_gather(static_cast<const char*>(input.data_ptr()), static_cast<char*>(output.data_ptr()),
               static_cast<size_t>(input.numel()), input.element_size(), input.scalar_type());
  }

  std::future<void> enqueue(std::function<void()> work) {
    std::packaged_task<void()> task(std::move(work));
    auto done = task.get_future();
    {
      std::lock_guard<std::mutex> lock(mutex);
      queue.push_back(std::move(task));
    }
    wake.notify_one();
    return done;
  }

  // Rank 0's data to every rank, through rank 0's slot, chunk by chunk. Slots are written only
  // before a barrier and read only between it and the next, so the previous collective's readers
  // are done with them.
  void broadcast_from_first(char* data, size_t bytes) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    const size_t chunk = control->chunk_bytes;
    for (size_t offset = 0; offset < bytes; offset += chunk) {
      const size_t n = std::min(chunk, bytes - offset);
      if (rank == 0) std::memcpy(slots[0], data + offset, n);
      barrier(deadline);
      if (rank != 0) std::memcpy(data + offset, slots[0], n);
      barrier(deadline);
    }
  }

  CrossNodeAllReduce cross_node;  // set on node leaders of a hierarchical group

  void run(const torch::Tensor& tensor, ReduceOp op, bool hierarchical) {
    if (!broken.empty())
      throw ShmTransportError(str("the shared-memory collectives broke earlier: ", broken));
    const size_t count = static_cast<size_t>(tensor.numel());
    if (size > 1) {
      with_reduced_type(tensor.scalar_type(), "ShmAllReduce::run", [&](auto zero) {
        using T = decltype(zero);
        all_reduce(tensor.data_ptr<T>(), count, op, tensor.scalar_type());
      });
    }
    if (!hierarchical) return;
    // The node's result, reduced across the node leaders, then handed to the node's other ranks.
    if (rank == 0) {
      try {
        cross_node(tensor, op == ReduceOp::kMean ? ReduceOp::kSum : op);  // the caller divides
      } catch (const std::exception& e) {
        if (size == 1) throw;
        give_up(
            str("the all-reduce between node leaders failed on this node's leader: ", e.what()));
      }
    }
    if (size > 1)
      broadcast_from_first(static_cast<char*>(tensor.data_ptr()), count * tensor.element_size());
  }
};

void ShmAllReduce::Shared::create_and_publish(c10d::Store& store, size_t bytes, size_t chunk,
                                              std::string& failure) {
  std::string name;
  if (failure.empty()) {
    try {
      segment = SharedMemorySegment::create(bytes);
      auto* made = new (segment.data()) ControlBlock();
      made->magic = kMagic;
      made->ranks = static_cast<uint32_t>(size);
      made->chunk_bytes = chunk;
      made->aborted_by.store(-1);
      name = segment.name();
    } catch (const std::exception& e) {
      failure = e.what();
    }
  }
  store.set("shm/name", to_bytes(failure.empty() ? "ok " + name : "failed " + failure));
}

void ShmAllReduce::Shared::attach_published(c10d::Store& store, size_t bytes, size_t chunk,
                                            std::string& failure) {
  store.wait({"shm/name"}, timeout);
  const auto published = store.get("shm/name");
  const std::string answer(published.begin(), published.end());
  if (answer.rfind("failed ", 0) == 0) {
    failure = str("rank 0: ", answer.substr(7));
  } else if (rank != 0 && failure.empty()) {
    try {
      segment = SharedMemorySegment::open(answer.substr(3), bytes);
      auto* found = static_cast<ControlBlock*>(segment.data());
      if (found->magic != kMagic || found->ranks != static_cast<uint32_t>(size) ||
          found->chunk_bytes != chunk) {
        failure =
            "the segment was made for another configuration (ACCELERANT_SHM_CHUNK_BYTES or the "
            "number of "
            "ranks differs between ranks)";
      }
    } catch (const std::exception& e) {
      failure = e.what();
    }
  }
}

void ShmAllReduce::Shared::map_slots(size_t header, size_t chunk) {
  control = static_cast<ControlBlock*>(segment.data());
  control->rank[rank].pid.store(static_cast<int32_t>(::getpid()));
  char* base = static_cast<char*>(segment.data()) + header;
  for (int r = 0; r <= size; ++r) slots.push_back(base + chunk * static_cast<size_t>(r));
  result = slots.back();
  slots.pop_back();
}

std::unique_ptr<ShmAllReduce> ShmAllReduce::connect(c10d::Store& store, int rank, int size,
                                                    std::chrono::milliseconds timeout,
                                                    std::string* why_not, bool hierarchical,
                                                    std::vector<int> job_ranks) {
  auto self = std::unique_ptr<ShmAllReduce>(new ShmAllReduce());
  self->shared_ = std::make_unique<Shared>();
  Shared& s = *self->shared_;
  s.rank = rank;
  s.size = size;
  s.timeout = timeout;
  s.job_ranks = std::move(job_ranks);
  size_t chunk = kDefaultChunkBytes;
  std::string failure = local_problem(size, hierarchical, chunk);
  const size_t header = round_up(sizeof(ControlBlock), 4096);
  const size_t bytes = header + chunk * static_cast<size_t>(size + 1);

  // Rank 0 creates and publishes the name (or why it could not); the others map it.
  if (rank == 0) s.create_and_publish(store, bytes, chunk, failure);
  s.attach_published(store, bytes, chunk, failure);

  // Every rank says whether it is attached; all decide alike. Then the name goes from /dev/shm.
  const std::string reasons =
      failures_of(exchange_strings(store, "shm/attached/", rank, size,
                                   failure.empty() ? "ok" : failure, timeout),
                  [&s](int r) { return s.job_rank(r); });
  s.segment.unlink();
  if (!reasons.empty()) {
    if (why_not) *why_not = reasons;
    return nullptr;
  }
  s.map_slots(header, chunk);
  // Every pid is written before the first collective can wait on it.
  exchange_strings(store, "shm/ready/", rank, size, "ok", timeout);
  self->hierarchical_ = hierarchical;
  s.worker = std::thread([&s] { s.serve(); });
  return self;
}

ShmAllReduce::~ShmAllReduce() {
  if (!shared_) return;
  {
    std::lock_guard<std::mutex> lock(shared_->mutex);
    shared_->stopping = true;
  }
  shared_->wake.notify_all();
  if (shared_->worker.joinable()) shared_->worker.join();
}

bool ShmAllReduce::supports(const torch::Tensor& tensor) {
  if (tensor.is_cuda() || !tensor.is_contiguous()) return false;
  const auto type = tensor.scalar_type();
  return type == torch::kFloat || type == torch::kDouble || type == torch::kInt ||
         type == torch::kLong;
}

void ShmAllReduce::set_cross_node(CrossNodeAllReduce leaders_all_reduce) {
  if (!hierarchical_ || shared_->rank != 0) {
    throw Error(str("ShmAllReduce::set_cross_node: only on the first rank of a hierarchical group",
                    kInternalFix));
  }
  shared_->cross_node = std::move(leaders_all_reduce);
}

std::future<void> ShmAllReduce::submit(torch::Tensor tensor, ReduceOp op) {
  Shared& s = *shared_;
  if (hierarchical_ && s.rank == 0 && !s.cross_node) {
    throw Error(
        str("ShmAllReduce::submit: a hierarchical group's leader needs set_cross_node first",
            kInternalFix));
  }
  const bool hierarchical = hierarchical_;
  return s.enqueue(
      [&s, tensor = std::move(tensor), op, hierarchical] { s.run(tensor, op, hierarchical); });
}

std::future<void> ShmAllReduce::submit_reduce_scatter(torch::Tensor input, torch::Tensor output,
                                                      ReduceOp op) {
  if (hierarchical_ || !supports(input) || !output.is_contiguous() ||
      output.scalar_type() != input.scalar_type() ||
      input.numel() != output.numel() * shared_->size) {
    throw Error(
        str("ShmAllReduce::submit_reduce_scatter: a hierarchical group or tensors it "
            "cannot take",
            kInternalFix));
  }
  Shared& s = *shared_;
  return s.enqueue([&s, input = std::move(input), output = std::move(output), op] {
    s.run_reduce_scatter(input, output, op);
  });
}

std::future<void> ShmAllReduce::submit_all_gather(torch::Tensor input, torch::Tensor output) {
  if (hierarchical_ || input.is_cuda() || output.is_cuda() || !input.is_contiguous() ||
      !output.is_contiguous() || output.scalar_type() != input.scalar_type() ||
      output.numel() != input.numel() * shared_->size) {
    throw Error(
        str("ShmAllReduce::submit_all_gather: a hierarchical group or tensors it cannot "
            "take",
            kInternalFix));
  }
  Shared& s = *shared_;
  return s.enqueue([&s, input = std::move(input), output = std::move(output)] {
    s.run_all_gather(input, output);
  });
}

size_t ShmAllReduce::chunk_bytes() const { return shared_->control->chunk_bytes; }

}  // namespace accelerant::detail
