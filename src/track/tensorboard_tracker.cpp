// TensorBoard event files (docs/observability.md "TensorBoard"): serialized Event messages in
// TFRecord framing, scalars as Summary.Value.simple_value with the "scalars" plugin named, the
// config as the hparams plugin's session start.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>

#include "track/builtin_trackers.h"
#include "track/tensorboard_event.pb.h"
#include "track/tracker_files.h"

namespace accelerant::detail {
namespace {

double unix_seconds() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

void append_le(std::string& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out += static_cast<char>((value >> (8 * i)) & 0xffu);
}

// TFRecord: u64 length, masked CRC32C of those 8 bytes, the data, masked CRC32C of the data,
// all little-endian.
std::string tfrecord(const std::string& data) {
  std::string record;
  append_le(record, data.size(), 8);
  append_le(record, masked_crc32c(record.data(), 8), 4);
  record += data;
  append_le(record, masked_crc32c(data.data(), data.size()), 4);
  return record;
}

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return "localhost";
  return name;
}

// The hparams plugin's session start: what makes TensorBoard's HPARAMS tab list the run with its
// hyper-parameters. No experiment summary (hparam and metric infos) is written: the metrics are
// not known at init, and without one TensorBoard derives the experiment from the session starts
// and every scalar tag of the run, so that the tab shows all of them.
tensorboard::Event hparams_event(const TrackerConfig& config, double now) {
  tensorboard::HParamsPluginData plugin_data;
  plugin_data.set_version(0);
  auto* start = plugin_data.mutable_session_start_info();
  start->set_start_time_secs(now);
  for (const auto& [name, value] : config) {
    auto& hparam = (*start->mutable_hparams())[name];  // a repeated name: the last one wins
    if (value.is_number()) {
      hparam.set_number_value(value.number());
    } else {
      hparam.set_string_value(value.text());
    }
  }
  tensorboard::Event event;
  event.set_wall_time(now);
  // No data (tensor) in the value: TensorBoard's readers give metadata-only values a null tensor.
  auto* summary_value = event.mutable_summary()->add_value();
  summary_value->set_tag("_hparams_/session_start_info");
  auto* plugin = summary_value->mutable_metadata()->mutable_plugin_data();
  plugin->set_plugin_name("hparams");
  plugin->set_content(plugin_data.SerializeAsString());
  return event;
}

class TensorBoardTracker : public Tracker {
 public:
  void init(const std::string& run_dir, const TrackerConfig& config) override {
    // The trailing counter keeps two trackers of one process in one second apart.
    static std::atomic<int> files_opened{0};
    const double now = unix_seconds();
    file_.open(run_dir + "/events.out.tfevents." + std::to_string(static_cast<int64_t>(now)) + "." +
               host_name() + "." + std::to_string(::getpid()) + "." +
               std::to_string(files_opened++));
    tensorboard::Event event;
    event.set_wall_time(now);
    event.set_file_version("brain.Event:2");
    file_.append(tfrecord(event.SerializeAsString()));
    if (!config.empty()) file_.append(tfrecord(hparams_event(config, now).SerializeAsString()));
    file_.flush();
  }
  void log(const TrackerScalars& values, int64_t step) override {
    tensorboard::Event event;
    event.set_wall_time(unix_seconds());
    event.set_step(step);
    for (const auto& [tag, value] : values) {
      auto* summary_value = event.mutable_summary()->add_value();
      summary_value->set_tag(tag);
      summary_value->set_simple_value(static_cast<float>(value));
      summary_value->mutable_metadata()->mutable_plugin_data()->set_plugin_name("scalars");
    }
    file_.append(tfrecord(event.SerializeAsString()));
    file_.flush_if_due(kTrackerFlushInterval);
  }
  void flush() override { file_.flush(); }
  void close() override { file_.close(); }

 private:
  AppendFile file_;
};

}  // namespace

std::shared_ptr<Tracker> make_tensorboard_tracker() {
  return std::make_shared<TensorBoardTracker>();
}

}  // namespace accelerant::detail
