// Trackers: CRC32C against published vectors, the CSV and JSON Lines files byte for byte, the
// TensorBoard event file (scalars and the config as hparams) decoded by an independent reader
// (tests/tfevents_reader.py: Python's protobuf with its own message declarations, its own CRC32C),
// a corrupted file rejected and a cut-off one read up to the cut by that reader, a process killed
// with SIGKILL leaving everything up to its last flush, and on two forked processes only rank 0
// writing, with no collective (the ranks call log() different numbers of times).
#include <accelerant/accelerant.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <thread>

#include "test_support.h"
#include "track/builtin_trackers.h"  // kTrackerFlushInterval, to wait for a timed flush

using namespace accelerant;
namespace t = accelerant::testing;
using accelerant::testing::slurp;

namespace {

std::vector<std::string> event_files(const std::string& dir) {
  std::vector<std::string> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().filename().string().rfind("events.out.tfevents.", 0) == 0) {
      files.push_back(entry.path().string());
    }
  }
  return files;
}

// Runs the independent reader; returns its exit status and fills `records`.
int read_events(const std::string& path, std::vector<nlohmann::json>& records, std::string& out) {
  auto run = t::start_program({"/usr/bin/python3", t::test_file_path("tfevents_reader.py"), path});
  const int status = t::finish_program(run, out, std::chrono::seconds(60));
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    if (!line.empty() && line[0] == '{') records.push_back(nlohmann::json::parse(line));
  }
  return status;
}

std::vector<std::string> lines_of(const std::string& path) {
  std::vector<std::string> lines;
  std::istringstream in(slurp(path));
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

TEST(Crc32c, KnownVectors) {
  // RFC 3720 B.4 and the check value of CRC-32C.
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);
  std::string zeros(32, '\0'), ones(32, '\xff'), rising(32, '\0');
  for (int i = 0; i < 32; ++i) rising[i] = static_cast<char>(i);
  EXPECT_EQ(crc32c(zeros.data(), zeros.size()), 0x8A9136AAu);
  EXPECT_EQ(crc32c(ones.data(), ones.size()), 0x62A8AB43u);
  EXPECT_EQ(crc32c(rising.data(), rising.size()), 0x46DD794Eu);
  EXPECT_EQ(crc32c("", 0), 0u);
  const uint32_t crc = crc32c("123456789", 9);
  EXPECT_EQ(masked_crc32c("123456789", 9), ((crc >> 15) | (crc << 17)) + 0xa282ead8u);
}

TEST(Trackers, CsvIsLongFormatWithConfig) {
  t::ScratchDir dir;
  auto csv = make_tracker("csv");
  csv->init(dir.path, {{"lr", 0.001}, {"batch_size", 64}, {"optimizer", "adam,w"}});
  csv->log({{"loss", 0.5}, {"accuracy", 0.25}}, 1);
  csv->log({{"loss", 0.1}}, 2);
  csv->close();
  EXPECT_EQ(slurp(dir.path + "/config.csv"),
            "name,value\nlr,0.001\nbatch_size,64\noptimizer,\"adam,w\"\n");
  EXPECT_EQ(slurp(dir.path + "/scalars.csv"),
            "step,tag,value\n1,loss,0.5\n1,accuracy,0.25\n2,loss,0.1\n");
}

// Whole numbers stay whole ("%g" wrote 2000 as 2e+03 and 30 as 3e+01); every value is the shortest
// text that reads back as the same double.
TEST(Trackers, CsvWritesTheShortestTextThatReadsBackTheSameDouble) {
  t::ScratchDir dir;
  auto csv = make_tracker("csv");
  csv->init(dir.path, {{"max_steps", 2000}, {"warmup", 30.0}});
  csv->log({{"a", 123456789.0}, {"b", 1e-7}, {"c", 1e20}, {"d", 1.0 / 3}, {"e", -0.0625}}, 1);
  csv->close();
  EXPECT_EQ(slurp(dir.path + "/config.csv"), "name,value\nmax_steps,2000\nwarmup,30\n");
  EXPECT_EQ(slurp(dir.path + "/scalars.csv"),
            "step,tag,value\n1,a,123456789\n1,b,1e-07\n1,c,1e+20\n1,d,0.3333333333333333\n"
            "1,e,-0.0625\n");
}

// A run resumed in the same project_dir (auto_resume) continues the files instead of emptying them.
TEST(Trackers, ASecondRunInTheSameDirectoryAppends) {
  t::ScratchDir dir;
  for (int run = 0; run < 2; ++run) {
    for (const char* name : {"csv", "jsonl"}) {
      auto tracker = make_tracker(name);
      tracker->init(dir.path, {{"run", run}});
      tracker->log({{"loss", 1.0 + run}}, run);
      tracker->close();
    }
  }
  EXPECT_EQ(slurp(dir.path + "/scalars.csv"), "step,tag,value\n0,loss,1\n1,loss,2\n");
  EXPECT_EQ(slurp(dir.path + "/scalars.jsonl"),
            "{\"config\":{\"run\":0}}\n{\"step\":0,\"values\":{\"loss\":1.0}}\n"
            "{\"config\":{\"run\":1}}\n{\"step\":1,\"values\":{\"loss\":2.0}}\n");
}

TEST(Trackers, JsonlHasOneObjectPerLog) {
  t::ScratchDir dir;
  auto jsonl = make_tracker("jsonl");
  jsonl->init(dir.path, {{"lr", 0.001}, {"optimizer", "adamw"}});
  jsonl->log({{"loss", 0.5}, {"accuracy", 0.25}}, 1);
  jsonl->log({{"loss", 0.1}}, 2);
  jsonl->close();
  EXPECT_EQ(slurp(dir.path + "/scalars.jsonl"),
            "{\"config\":{\"lr\":0.001,\"optimizer\":\"adamw\"}}\n"
            "{\"step\":1,\"values\":{\"loss\":0.5,\"accuracy\":0.25}}\n"
            "{\"step\":2,\"values\":{\"loss\":0.1}}\n");
}

TEST(Trackers, UnknownNameIsRefusedWithTheChoices) {
  const auto message = t::error_message([] { make_tracker("wandb"); });
  EXPECT_TRUE(t::contains(message, "tensorboard")) << message;
}

TEST(Trackers, TensorBoardFileReadByAnIndependentReader) {
  t::ScratchDir dir;
  {
    Accelerator acc(AcceleratorOptions().project_dir(dir.path).log_with({"tensorboard"}));
    acc.init_trackers("run", {{"lr", 0.01}});
    for (int64_t step = 0; step < 5; ++step) acc.log({{"train/loss", 1.0 / (1 << step)}}, step);
    acc.log({{"eval/accuracy", 0.75}, {"eval/loss", 2.5}}, 4);
  }  // the destructor flushes and closes
  const auto files = event_files(dir.path + "/run");
  ASSERT_EQ(files.size(), 1u);
  EXPECT_TRUE(std::regex_match(std::filesystem::path(files[0]).filename().string(),
                               std::regex(R"(events\.out\.tfevents\.\d{10}\.[^.]+.*\.\d+\.\d+)")))
      << files[0];
  std::vector<nlohmann::json> records;
  std::string out;
  ASSERT_EQ(read_events(files[0], records, out), 0) << out;
  ASSERT_EQ(records.size(), 8u) << out;
  EXPECT_EQ(records[0]["file_version"], "brain.Event:2");
  EXPECT_EQ(records[1]["hparams"], nlohmann::json({{"lr", 0.01}})) << out;
  for (int64_t step = 0; step < 5; ++step) {
    const auto& record = records[2 + step];
    EXPECT_EQ(record["step"], step);
    EXPECT_EQ(record["values"]["train/loss"].get<double>(), 1.0 / (1 << step));
    EXPECT_EQ(record["plugins"]["train/loss"], "scalars");
    EXPECT_GT(record["wall_time"].get<double>(), 1.7e9);
  }
  EXPECT_EQ(records[7]["step"], 4);
  EXPECT_EQ(records[7]["values"]["eval/accuracy"].get<double>(), 0.75);
  EXPECT_EQ(records[7]["values"]["eval/loss"].get<double>(), 2.5);
}

// The config as the hparams plugin's session start, every name and value exactly: numbers as
// number_value (bools are numbers), texts as string_value, a 0 and an empty text included (a plain
// proto3 field would drop them on the wire).
TEST(Trackers, TensorBoardHasTheConfigAsHparams) {
  t::ScratchDir dir;
  const TrackerConfig config = {{"lr", 0.001},
                                {"batch_size", 64},
                                {"dropout", 0},
                                {"amp", true},
                                {"optimizer", "adamw"},
                                {"note", ""},
                                {"model/depth", -12},
                                {"seed", int64_t{9007199254740993}},
                                {"weight_decay", 1e-300},
                                {"name with spaces, \"quotes\"", "ü,√"}};
  auto tb = make_tracker("tensorboard");
  tb->init(dir.path, config);
  tb->log({{"loss", 0.5}}, 1);
  tb->close();
  const auto files = event_files(dir.path);
  ASSERT_EQ(files.size(), 1u);
  std::vector<nlohmann::json> records;
  std::string out;
  ASSERT_EQ(read_events(files[0], records, out), 0) << out;
  ASSERT_EQ(records.size(), 3u) << out;
  const auto& hparams = records[1];
  EXPECT_EQ(hparams["plugins"], nlohmann::json({{"_hparams_/session_start_info", "hparams"}}));
  EXPECT_EQ(hparams["values"], nlohmann::json::object());  // no scalar in it
  EXPECT_EQ(hparams["hparams_version"], 0);
  EXPECT_GT(hparams["start_time_secs"].get<double>(), 1.7e9);
  ASSERT_EQ(hparams["hparams"].size(), config.size()) << out;
  for (const auto& [name, value] : config) {
    SCOPED_TRACE(name);
    const auto& read = hparams["hparams"][name];
    if (value.is_number()) {
      EXPECT_EQ(hparams["hparam_kinds"][name], "number_value");
      EXPECT_EQ(read.get<double>(), value.number());
    } else {
      EXPECT_EQ(hparams["hparam_kinds"][name], "string_value");
      EXPECT_EQ(read.get<std::string>(), value.text());
    }
  }
  EXPECT_EQ(records[2]["values"]["loss"], 0.5);
}

// A scalar of exactly 0 is written as a value (the public format's simple_value is in a oneof);
// an empty config writes no hparams record.
TEST(Trackers, TensorBoardWritesAZeroScalar) {
  t::ScratchDir dir;
  auto tb = make_tracker("tensorboard");
  tb->init(dir.path, {});
  tb->log({{"loss", 0.0}, {"accuracy", -0.0}}, 0);
  tb->close();
  std::vector<nlohmann::json> records;
  std::string out;
  ASSERT_EQ(read_events(event_files(dir.path).at(0), records, out), 0) << out;
  ASSERT_EQ(records.size(), 2u) << out;
  EXPECT_EQ(records[1]["values"], nlohmann::json({{"loss", 0.0}, {"accuracy", -0.0}})) << out;
}

// What a writer killed in the middle of a flush can leave: a last record cut anywhere. The
// reader returns the whole records before it and reports the cut, as TensorBoard does.
TEST(Trackers, IndependentReaderStopsAtACutOffLastRecord) {
  t::ScratchDir dir;
  auto tb = make_tracker("tensorboard");
  tb->init(dir.path, {{"lr", 0.5}});
  tb->log({{"loss", 0.5}}, 3);
  tb->flush();
  const auto whole = std::filesystem::file_size(event_files(dir.path).at(0));
  tb->log({{"loss", 0.25}}, 4);
  tb->close();
  const auto file = event_files(dir.path).at(0);
  const std::string bytes = slurp(file);
  ASSERT_GT(bytes.size(), whole + 16);
  // Every cut inside the last record's header, data and CRC.
  for (size_t size = whole + 1; size < bytes.size(); size += 3) {
    std::ofstream(file, std::ios::binary | std::ios::trunc) << bytes.substr(0, size);
    std::vector<nlohmann::json> records;
    std::string out;
    ASSERT_EQ(read_events(file, records, out), 0) << "cut at " << size << ": " << out;
    ASSERT_EQ(records.size(), 4u) << "cut at " << size << ": " << out;
    EXPECT_EQ(records[2]["values"]["loss"], 0.5);
    EXPECT_EQ(records[3]["truncated_at"], whole);
  }
}

// A run resumed after a crash that cut the last line of scalars.csv or scalars.jsonl drops that
// fragment instead of gluing its first line onto it.
TEST(Trackers, AResumedRunDropsATornLastLine) {
  t::ScratchDir dir;
  std::ofstream(dir.path + "/scalars.csv") << "step,tag,value\n0,loss,1\n1,lo";
  std::ofstream(dir.path + "/scalars.jsonl") << "{\"config\":{}}\n{\"step\":1,\"val";
  for (const char* name : {"csv", "jsonl"}) {
    auto tracker = make_tracker(name);
    tracker->init(dir.path, {});
    tracker->log({{"loss", 2.0}}, 1);
    tracker->close();
  }
  EXPECT_EQ(slurp(dir.path + "/scalars.csv"), "step,tag,value\n0,loss,1\n1,loss,2\n");
  EXPECT_EQ(slurp(dir.path + "/scalars.jsonl"),
            "{\"config\":{}}\n{\"config\":{}}\n{\"step\":1,\"values\":{\"loss\":2.0}}\n");
  // Not even the header whole: the file starts again.
  std::ofstream(dir.path + "/scalars.csv", std::ios::trunc) << "step,ta";
  auto csv = make_tracker("csv");
  csv->init(dir.path, {});
  csv->close();
  EXPECT_EQ(slurp(dir.path + "/scalars.csv"), "step,tag,value\n");
}

TEST(Trackers, IndependentReaderRejectsACorruptedRecord) {
  t::ScratchDir dir;
  auto tb = make_tracker("tensorboard");
  tb->init(dir.path, {});
  tb->log({{"loss", 0.5}}, 3);
  tb->close();
  const auto files = event_files(dir.path);
  ASSERT_EQ(files.size(), 1u);
  std::string bytes = slurp(files[0]);
  bytes[bytes.size() - 6] ^= 0x01;  // inside the last record's data
  std::ofstream(files[0], std::ios::binary | std::ios::trunc) << bytes;
  std::vector<nlohmann::json> records;
  std::string out;
  EXPECT_NE(read_events(files[0], records, out), 0) << out;
  EXPECT_TRUE(t::contains(out, "bad data CRC")) << out;
}

// The child of the kill test: logs "loss" at steps 0-2 and flushes, logs 3-4, waits out the flush
// interval so that log() of step 5 flushes 3-5, logs 6-9 (left in memory), then tells the parent
// to kill it and waits for that. Exits 3 without telling when anything throws.
[[noreturn]] void log_until_killed(const std::string& dir, int ready_fd) {
  try {
    std::vector<std::shared_ptr<Tracker>> trackers;
    for (const char* name : {"csv", "jsonl", "tensorboard"}) {
      trackers.push_back(make_tracker(name));
      trackers.back()->init(dir, {{"lr", 0.5}});
    }
    auto log_steps = [&](int64_t first, int64_t last) {
      for (int64_t step = first; step <= last; ++step) {
        for (auto& tracker : trackers) tracker->log({{"loss", static_cast<double>(step)}}, step);
      }
    };
    log_steps(0, 2);
    for (auto& tracker : trackers) tracker->flush();
    log_steps(3, 4);
    std::this_thread::sleep_for(accelerant::detail::kTrackerFlushInterval +
                                std::chrono::milliseconds(200));
    log_steps(5, 5);
    log_steps(6, 9);
    if (::write(ready_fd, "k", 1) != 1) ::_exit(4);
    for (;;) ::pause();  // in scope: leaving it would destroy the trackers, which flushes them
  } catch (...) {
    ::_exit(3);
  }
}

// Whether a byte arrives on `fd` within `limit` (false at EOF: the child died without writing).
bool byte_arrives(int fd, std::chrono::milliseconds limit) {
  pollfd ready{fd, POLLIN, 0};
  char byte = 0;
  return ::poll(&ready, 1, static_cast<int>(limit.count())) == 1 && ::read(fd, &byte, 1) == 1;
}

// SIGKILL, so no flush at exit: every file holds exactly the steps up to the last flush (an
// explicit flush() and then log()'s own after the interval), nothing logged after it, and reads
// cleanly. The kill comes between flushes, so no record is cut off (a cut one: the test above).
TEST(Trackers, SigkillLeavesEverythingUpToTheLastFlush) {
  t::ScratchDir dir;
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(ready[0]);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // no orphan if the test process dies first
    log_until_killed(dir.path, ready[1]);
  }
  ::close(ready[1]);
  const bool logged = byte_arrives(ready[0], std::chrono::seconds(60));
  ::kill(child, SIGKILL);  // also when it is stuck: bounded either way
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ::close(ready[0]);
  ASSERT_TRUE(logged) << "the child did not log within 60 s; wait status " << status;
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;

  std::vector<std::string> csv = {"step,tag,value"}, jsonl = {R"({"config":{"lr":0.5}})"};
  for (int step = 0; step <= 5; ++step) {
    csv.push_back(std::to_string(step) + ",loss," + std::to_string(step));
    jsonl.push_back(R"({"step":)" + std::to_string(step) + R"(,"values":{"loss":)" +
                    std::to_string(step) + ".0}}");
  }
  EXPECT_EQ(lines_of(dir.path + "/scalars.csv"), csv);
  EXPECT_EQ(lines_of(dir.path + "/scalars.jsonl"), jsonl);
  const auto files = event_files(dir.path);
  ASSERT_EQ(files.size(), 1u);
  std::vector<nlohmann::json> records;
  std::string out;
  ASSERT_EQ(read_events(files[0], records, out), 0) << out;
  ASSERT_EQ(records.size(), 2u + 6u) << out;  // file_version, hparams, steps 0-5; no cut
  EXPECT_EQ(records[1]["hparams"], nlohmann::json({{"lr", 0.5}}));
  for (int step = 0; step <= 5; ++step) {
    EXPECT_EQ(records[2 + step]["step"], step);
    EXPECT_EQ(records[2 + step]["values"]["loss"], step);
  }
}

// A user's own tracker (the extension point for W&B, MLflow, ...), added before and after
// init_trackers: each is started with the run folder and config, gets every log() with its step,
// and is closed (which flushes) once by end_training, next to a built-in one. A tracker added
// after init_trackers used to be started with an empty config, losing the run's hyper-parameters.
struct RecordingTracker : Tracker {
  std::vector<std::string> calls;
  void init(const std::string& run_dir, const TrackerConfig& config) override {
    calls.push_back("init " + run_dir.substr(run_dir.rfind('/') + 1) + " " + config.at(0).first);
  }
  void log(const TrackerScalars& values, int64_t step) override {
    for (const auto& [tag, value] : values) {
      calls.push_back("log " + std::to_string(step) + " " + tag + "=" + std::to_string(value));
    }
  }
  void flush() override { calls.push_back("flush"); }
  void close() override { calls.push_back("close"); }
};

TEST(Trackers, AUsersOwnTrackerAddedBeforeOrAfterInitGetsEveryCallOnce) {
  t::ScratchDir dir;
  auto before = std::make_shared<RecordingTracker>();
  auto after = std::make_shared<RecordingTracker>();
  {
    Accelerator acc(AcceleratorOptions().project_dir(dir.path).log_with({"csv"}));
    acc.add_tracker(before);
    acc.init_trackers("run", {{"lr", 0.5}});
    acc.log({{"loss", 2.0}}, 1);
    acc.add_tracker(after);
    acc.log({{"loss", 1.0}, {"acc", 0.25}}, 2);
    acc.end_training();
  }
  // Flushes may come at any time (a timer); what else each got, in order:
  const auto without_flushes = [](std::vector<std::string> calls) {
    calls.erase(std::remove(calls.begin(), calls.end(), "flush"), calls.end());
    return calls;
  };
  EXPECT_EQ(without_flushes(before->calls),
            (std::vector<std::string>{"init run lr", "log 1 loss=2.000000", "log 2 loss=1.000000",
                                      "log 2 acc=0.250000", "close"}))
      << "closed once, by end_training, not again by the destructor";
  EXPECT_EQ(without_flushes(after->calls),
            (std::vector<std::string>{"init run lr", "log 2 loss=1.000000", "log 2 acc=0.250000",
                                      "close"}))
      << "started at once, with the run's config";
  EXPECT_EQ(slurp(dir.path + "/run/scalars.csv"),
            "step,tag,value\n1,loss,2\n2,loss,1\n2,acc,0.25\n")
      << "the built-in tracker beside them";
}

TEST(Trackers, LogBeforeInitTrackersSaysHowToFix) {
  Accelerator acc;
  const auto message = t::error_message([&] { acc.log({{"loss", 1.0}}, 0); });
  EXPECT_TRUE(t::contains(message, "init_trackers")) << message;
}

// Only rank 0 writes; rank 1 logs more often than rank 0 and another tag, so a log() that
// talked to other ranks would hang or mismatch, and a rank 1 that wrote would show its tag.
TEST(Trackers, OnlyTheMainProcessWritesAndNoCollective) {
  t::ScratchDir dir;
  const std::string project_dir = dir.path;
  auto results = launch(
      [project_dir](int index) {
        Accelerator acc(AcceleratorOptions().project_dir(project_dir).log_with({"csv", "jsonl"}));
        acc.init_trackers("run");
        const int calls = index == 0 ? 2 : 50;
        for (int step = 0; step < calls; ++step) {
          acc.log({{index == 0 ? "rank0" : "rank1", static_cast<double>(step)}}, step);
        }
        acc.end_training();
        return index;
      },
      LaunchOptions()
          .processes_per_node(2)
          .collective_timeout(std::chrono::seconds(60))
          .verbose(false));
  ASSERT_EQ(results.size(), 2u);
  EXPECT_EQ(slurp(project_dir + "/run/scalars.csv"), "step,tag,value\n0,rank0,0\n1,rank0,1\n");
  EXPECT_FALSE(t::contains(slurp(project_dir + "/run/scalars.jsonl"), "rank1"));
}

}  // namespace

// Every line the trackers can write, `accelerant report` reads back (issue 38: a 1 MB tag was
// written, then refused by the report). A record or a config over kMaxTrackerLineBytes is refused
// when logged, on every rank alike, before any file is touched; one just under it is written and
// read back by the report.
TEST(Trackers, EveryLineTheTrackersWriteTheReportReadsBack) {
  t::ScratchDir dir;
  Accelerator acc(AcceleratorOptions().project_dir(dir.path).log_with({"csv", "jsonl"}));
  const std::string huge(kMaxTrackerLineBytes, 'a');
  auto message = t::error_message([&] { acc.init_trackers("run", {{"notes", huge}}); });
  EXPECT_TRUE(t::contains(message, "init_trackers: the config of 1 values would be a line of"))
      << message.substr(0, 300);
  EXPECT_TRUE(t::contains(message, "Fix:")) << message.substr(0, 300);
  EXPECT_FALSE(std::filesystem::exists(dir.path + "/run")) << "nothing written";

  acc.init_trackers("run", {{"lr", 0.1}});
  message = t::error_message([&] { acc.log({{huge, 1.0}}, 1); });
  EXPECT_TRUE(t::contains(message, "log(step 1): this record of 1 scalars would be a line of"))
      << message.substr(0, 300);
  EXPECT_TRUE(t::contains(message, std::to_string(kMaxTrackerLineBytes) + "-byte line limit"))
      << message.substr(0, 300);
  // Many short tags whose record adds up past the limit are refused the same way.
  TrackerScalars many;
  for (int i = 0; i < 40000; ++i) many.emplace_back("train/some_tag_" + std::to_string(i), i);
  message = t::error_message([&] { acc.log(many, 2); });
  EXPECT_TRUE(t::contains(message, "this record of 40000 scalars")) << message.substr(0, 300);

  const std::string longest(kMaxTrackerLineBytes - 64, 'b');
  acc.log({{longest, 0.5}}, 3);
  acc.log({{"loss", 0.25}}, 4);
  acc.end_training();
  EXPECT_EQ(slurp(dir.path + "/run/scalars.jsonl").find("\"step\":1,"), std::string::npos);

  std::string output;
  auto run = t::start_program(
      {t::cli_path(), "report", dir.path + "/run", "-o", dir.path + "/report.html"});
  const int status = t::finish_program(run, output, std::chrono::seconds(60));
  EXPECT_TRUE(status >= 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0) << output;
  EXPECT_GT(std::filesystem::file_size(dir.path + "/report.html"), 0u) << output;
}
