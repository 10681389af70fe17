// Accelerator::profile and its ProfileScope (docs/observability.md "Profiler traces"): one
// recording of LibTorch's operators (base/torch_op_trace.h) and Accelerant's spans
// (base/trace_events.h), written per rank and merged by the main process.
//
// Threads: LibTorch's profiler is thread-local, so a recording starts and stops on one thread: the
// one that called profile() for a scope, the one that steps the optimizer for a step range (the
// training thread in both cases). The session is used from that thread only.
#include <ATen/record_function.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <exception>
#include <filesystem>
#include <iostream>
#include <map>
#include <system_error>

#include "accelerant/accelerator.h"
#include "accelerant/error.h"
#include "accelerant/process_state.h"
#include "accelerant/trace_files.h"
#include "accelerator/accelerator_impl.h"
#include "base/file_io.h"
#include "base/text.h"
#include "base/torch_op_trace.h"
#include "base/trace_events.h"
#include "comm/collective_label.h"

namespace accelerant {

namespace {

// One recording per process: LibTorch runs one profiler at a time and the span buffer is global.
std::atomic<bool> profile_active{false};

// Named lanes (add_trace_span_on_lane) get thread numbers far above LibTorch's, which count
// threads from 1, and below the device lanes of base/torch_op_trace.cpp.
constexpr int64_t kNamedLaneBase = 1000000;

nlohmann::json metadata(const char* what, int pid, int64_t tid, nlohmann::json args) {
  return {{"ph", "M"}, {"name", what}, {"pid", pid}, {"tid", tid}, {"args", std::move(args)}};
}

// Accelerant's spans and step markers as Chrome trace events.
void add_spans(const std::vector<detail::TraceRecord>& records, int pid, uint64_t main_thread,
               nlohmann::json& events) {
  std::map<std::string, int64_t> lanes;
  std::map<int64_t, std::string> thread_names{{static_cast<int64_t>(main_thread), "main thread"}};
  for (const auto& record : records) {
    int64_t tid = static_cast<int64_t>(record.thread_id);
    if (!record.lane.empty()) {
      auto it = lanes.emplace(record.lane, kNamedLaneBase + static_cast<int64_t>(lanes.size()));
      tid = it.first->second;
      thread_names[tid] = record.lane;
    }
    nlohmann::json e = {{"name", record.name},
                        {"cat", record.category},
                        {"pid", pid},
                        {"tid", tid},
                        {"ts", record.start_us}};
    if (record.kind == detail::TraceRecord::Kind::kStepEnd) {
      e["ph"] = "i";
      e["s"] = "p";  // a line across the whole process: every lane sees where the step ended
      e["args"] = {{"step", record.step}};
    } else {
      e["ph"] = "X";
      e["dur"] = record.duration_us;
      if (!record.args.empty()) {
        nlohmann::json args = nlohmann::json::object();
        for (const auto& [key, value] : record.args) args[key] = value;
        e["args"] = std::move(args);
      }
    }
    events.push_back(std::move(e));
  }
  for (const auto& [tid, name] : thread_names) {
    events.push_back(metadata("thread_name", pid, tid, {{"name", name}}));
    events.push_back(metadata("thread_sort_index", pid, tid, {{"sort_index", tid}}));
  }
}

// Every rank's `problem` ("" = none).
std::vector<std::string> gather_problems(const std::string& problem) {
  return ProcessState::get().communicator().gather_bytes(problem);
}

// "" when this process can create files in `dir` (created when missing), else why not.
std::string writable_problem(const std::string& dir, int rank) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) return "cannot create " + dir + " (" + error.message() + ")";
  const std::string probe = dir + "/.write_test_rank" + std::to_string(rank);
  if (!detail::write_file_atomically(probe, "")) {
    return "cannot write files in " + dir + " (" + std::strerror(errno) + ")";
  }
  std::filesystem::remove(probe, error);
  return "";
}

}  // namespace

struct ProfileScope::Session {
  int rank = 0;
  int size = 1;
  std::string rank_prefix;
  std::string dir;
  ProfileOptions options;
  bool cuda = false;
  enum class Phase { kWaiting, kRecording, kDone };
  Phase phase = Phase::kWaiting;
  uint64_t thread = 0;  // LibTorch's number of the recording thread

  // A session that never finished (its start failed) frees the process for another profile.
  ~Session() {
    if (phase != Phase::kDone) profile_active.store(false);
  }

  void start() {
    detail::TorchOpTraceOptions torch_options;
    torch_options.record_shapes = options.record_shapes();
    torch_options.record_memory = options.record_memory();
    torch_options.cuda = cuda;
    detail::start_torch_op_trace(torch_options);
    detail::start_trace_recording();
    thread = at::RecordFunction::currentThreadId();
    phase = Phase::kRecording;
  }

  // Ends the recording and writes the files. `together`: every rank is here (a stop or the last
  // step of a range), so wait for them and merge; otherwise (an exception unwinding this rank
  // alone) write this rank's file and return.
  void finish(bool together) {
    const bool was_recording = phase == Phase::kRecording;
    phase = Phase::kDone;
    detail::set_trace_step_listener(nullptr);
    profile_active.store(false);
    std::string problem;
    if (was_recording) {
      nlohmann::json events = detail::stop_torch_op_trace(rank);
      add_spans(detail::stop_trace_recording(), rank, thread, events);
      events.push_back(
          metadata("process_name", rank, 0, {{"name", "rank " + std::to_string(rank)}}));
      events.push_back(metadata("process_sort_index", rank, 0, {{"sort_index", rank}}));
      const nlohmann::json trace = {{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}};
      const std::string file = trace_rank_file(dir, rank);
      if (!detail::write_file_atomically(file, trace.dump())) {
        problem = "cannot write " + file + " (" + std::strerror(errno) + ")";
      }
    }
    // After end_training the ranks can no longer meet: the files stay unmerged.
    const bool can_meet = ProcessState::initialized();
    if (!together || !can_meet) {
      if (!problem.empty()) std::cerr << rank_prefix << "warning: profile: " << problem << "\n";
      if (!can_meet && rank == 0) {
        std::cerr << rank_prefix << "warning: profile stopped after end_training(), so " << dir
                  << "/trace.json was not merged. Fix: stop the ProfileScope before "
                     "end_training(), or run `accelerant trace merge "
                  << dir << "`.\n";
      }
      return;
    }
    // Doubles as the barrier the merge needs: every rank's file is written when it returns.
    detail::ScopedCollectiveLabel label("profile stop");
    const std::vector<std::string> problems = gather_problems(problem);
    if (rank == 0 && was_recording) merge();
    std::string failed;
    for (int r = 0; r < size; ++r) {
      if (!problems[r].empty()) failed += detail::str("\n  rank ", r, ": ", problems[r]);
    }
    if (!failed.empty()) {
      throw Error(rank_prefix + "profile: trace files not written:" + failed +
                  "\nLikely cause: the folder is full or was removed. Fix: give a writable "
                  "ProfileOptions::dir with free space.");
    }
  }

  void merge() {
    const TraceMergeResult merged = merge_trace_files(dir, size);
    if (merged.missing_files.empty()) return;
    std::cerr << rank_prefix << "warning: profile: " << dir
              << "/trace.json holds only the ranks whose files this machine sees; missing: "
              << detail::join(merged.missing_files, ", ")
              << ". Likely cause: those ranks ran on other machines and the folder is not "
                 "shared. Fix: copy their trace_rank<r>.json files here and run `accelerant "
                 "trace merge "
              << dir << "`.\n";
  }

  // The step-range listener (detail::trace_step_ended): start after step first-1, stop after
  // step last. Every rank steps together, so every rank stops at the same step.
  void on_step(int64_t step) {
    if (phase == Phase::kWaiting && step == options.first_step() - 1) {
      start();
    } else if (phase == Phase::kRecording && step >= options.last_step()) {
      finish(/*together=*/true);
    }
  }
};

ProfileScope::~ProfileScope() {
  if (!session_ || session_->phase == Session::Phase::kDone) return;
  const bool unwinding = std::uncaught_exceptions() > 0;
  try {
    session_->finish(/*together=*/!unwinding);
  } catch (const std::exception& e) {
    std::cerr << session_->rank_prefix << "warning: profile: " << e.what() << "\n";
  }
}

ProfileScope& ProfileScope::operator=(ProfileScope&& other) {
  if (this != &other) {
    stop();
    session_ = std::move(other.session_);
  }
  return *this;
}

void ProfileScope::stop() {
  if (!session_ || session_->phase == Session::Phase::kDone) return;
  session_->finish(/*together=*/true);
}

bool ProfileScope::recording() const {
  return session_ && session_->phase == Session::Phase::kRecording;
}

std::string ProfileScope::dir() const { return session_ ? session_->dir : std::string(); }

ProfileScope Accelerator::profile(const ProfileOptions& options) {
  communicator();  // throws, saying why, after end_training()
  const bool ranged = options.first_step() != 0 || options.last_step() != 0;
  if (ranged && (options.first_step() < 1 || options.last_step() < options.first_step())) {
    throw Error(detail::str(impl_->rank_prefix_, "profile: steps(", options.first_step(), ", ",
                            options.last_step(),
                            ") is not a range of optimizer steps. Give 1 <= first <= last, "
                            "e.g. steps(3, 5) records steps 3, 4 and 5."));
  }
  if (profile_active.exchange(true)) {
    throw Error(impl_->rank_prefix_ +
                "profile: a profile is already recording in this process. Fix: stop its "
                "ProfileScope (stop() or let it go) before starting another.");
  }
  auto session = std::make_shared<ProfileScope::Session>();  // clears profile_active when it goes
  session->rank = impl_->rank_;
  session->size = impl_->world_size_;
  session->rank_prefix = impl_->rank_prefix_;
  session->options = options;
  session->cuda = impl_->device_.is_cuda();
  session->dir = !options.dir().empty() ? options.dir()
                 : impl_->options_.project_dir().empty()
                     ? std::string("traces")
                     : impl_->options_.project_dir() + "/traces";
  // Every rank learns every rank's problem, so that all throw alike instead of some waiting at the
  // stop's barrier for a rank that already failed.
  detail::ScopedCollectiveLabel label("profile");
  const std::vector<std::string> problems =
      gather_problems(writable_problem(session->dir, impl_->rank_));
  std::string failed;
  for (size_t r = 0; r < problems.size(); ++r) {
    if (!problems[r].empty()) failed += detail::str("\n  rank ", r, ": ", problems[r]);
  }
  if (!failed.empty()) {
    throw Error(impl_->rank_prefix_ + "profile: cannot write the trace files to " + session->dir +
                ":" + failed +
                "\nFix: give a writable folder with ProfileOptions().dir(...) or "
                "AcceleratorOptions::project_dir.");
  }
  if (!ranged || options.first_step() == 1) {
    session->start();
  }
  if (ranged) {
    std::weak_ptr<ProfileScope::Session> weak = session;
    detail::set_trace_step_listener([weak](int64_t step) {
      if (auto s = weak.lock()) s->on_step(step);
    });
  }
  return ProfileScope(std::move(session));
}

}  // namespace accelerant
