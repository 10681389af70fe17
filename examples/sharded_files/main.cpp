// Training from data on disk in sharded JSON Lines files, on 2 processes, resuming after a kill.
//
//   sharded_files                                  writes the data set, trains 3 epochs
//   sharded_files --kill_at_step 100               rank 1 is SIGKILLed right after the checkpoint
//                                                  of step 100; the group restarts and resumes
//   accelerant launch -n 2 --max_restarts 1 sharded_files --project_dir runs/s
//
// The data set is written first (if it is not there): 4 shards of uneven sizes, one record per
// line, {"x": [8 numbers], "label": 0-3}. The user's part is the parse function; the stream
// loader reads the files, shards them (shard j to rank j % 2 here, so the ranks' shares differ),
// reads ahead in worker threads and ends each epoch on both ranks at the same step, flagging the
// batches a rank repeats while the other still reads. The stream's position is in every
// checkpoint, so a restarted run continues at the same record on every rank.
#include <accelerant/accelerant.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

namespace {

struct Settings {
  int world_size = 2;
  int epochs = 3;
  int64_t batch_size = 16;
  int num_workers = 2;
  std::string project_dir = "sharded_files_run";
  int64_t checkpoint_every = 5;
  int64_t kill_at_step = 0;  // 0: no simulated crash
};

constexpr int kShards = 4;
const int kShardSizes[kShards] = {700, 150, 420, 90};  // uneven on purpose
constexpr int kFeatures = 8, kClasses = 4;

std::string shard_path(const std::string& dir, int j) {
  return dir + "/part-" + std::to_string(j) + ".jsonl";
}

// A learnable data set: the label is the argmax of a fixed linear map of x. Written once, each
// shard into a temporary file renamed into place, so a run killed while writing leaves none half
// written.
std::vector<std::string> write_data_set(const std::string& dir) {
  ::mkdir(dir.c_str(), 0755);
  torch::manual_seed(1234);
  const auto weights = torch::randn({kFeatures, kClasses});
  std::vector<std::string> paths;
  for (int j = 0; j < kShards; ++j) {
    paths.push_back(shard_path(dir, j));
    if (std::ifstream(paths.back()).good()) continue;
    const auto x = torch::randn({kShardSizes[j], kFeatures});
    const auto labels = x.matmul(weights).argmax(1);
    const std::string tmp = paths.back() + ".tmp." + std::to_string(::getpid());
    {
      std::ofstream out(tmp);
      for (int i = 0; i < kShardSizes[j]; ++i) {
        std::vector<float> row(x[i].data_ptr<float>(), x[i].data_ptr<float>() + kFeatures);
        out << nlohmann::json{{"x", row}, {"label", labels[i].item<int64_t>()}}.dump() << "\n";
      }
    }
    std::rename(tmp.c_str(), paths.back().c_str());
  }
  return paths;
}

// The one thing a user writes for data on disk: a record to a sample.
accelerant::Batch parse(const nlohmann::json& record) {
  return {torch::tensor(record.at("x").get<std::vector<float>>()),
          torch::tensor(record.at("label").get<int64_t>())};
}

void train(const std::vector<std::string>& shards, const Settings& s) {
  accelerant::Accelerator acc(accelerant::AcceleratorOptions()
                                  .seed(7)
                                  .project_dir(s.project_dir)
                                  .checkpoint_total_limit(2)
                                  .auto_resume(true));
  auto model = torch::nn::Sequential(torch::nn::Linear(kFeatures, 32), torch::nn::ReLU(),
                                     torch::nn::Linear(32, kClasses));
  torch::optim::Adam optimizer(model->parameters(), torch::optim::AdamOptions(1e-2));
  auto loader = accelerant::make_stream_loader(accelerant::jsonl_files(shards, parse),
                                               accelerant::StreamLoaderOptions()
                                                   .batch_size(s.batch_size)
                                                   .sharding(accelerant::StreamSharding::kByShard)
                                                   .num_workers(s.num_workers));
  auto [net, opt, batches] = acc.prepare(model, optimizer, loader);
  acc.auto_resume_now();  // the loop reads the epoch before its first batch
  const bool resumed = acc.state()->optimizer_steps > 0;
  while (batches.epoch() < s.epochs) {
    const int64_t epoch = batches.epoch();
    const int64_t resumed_at =
        batches.position().epoch == epoch ? batches.position().steps_done : 0;
    torch::Tensor counts = torch::zeros({3});  // loss sum, correct, records (real batches only)
    for (auto it = batches.begin(); it != batches.end(); ++it) {
      auto logits = net->forward(it->data);
      auto loss = torch::nn::functional::cross_entropy(logits, it->target);
      acc.backward(loss);
      opt.step();
      opt.zero_grad();
      if (!it.is_padding()) {  // padding repeats this rank's first batch: not counted
        counts += torch::stack({loss.detach() * it->target.size(0),
                                (logits.argmax(1) == it->target).sum().to(torch::kFloat),
                                torch::tensor(static_cast<float>(it->target.size(0)))});
      }
      const int64_t step = acc.state()->optimizer_steps;
      if (step % s.checkpoint_every == 0) {
        acc.save_state();
        if (step == s.kill_at_step && !resumed && acc.rank() == 1) {
          std::fprintf(stderr, "[rank 1] simulating a crash after the checkpoint of step %lld\n",
                       static_cast<long long>(step));
          std::raise(SIGKILL);
        }
      }
    }
    const auto total = acc.reduce(counts);
    const double records = total[2].item<double>();
    acc.print("epoch ", epoch + 1, "/", s.epochs, ": ", static_cast<int64_t>(records), " records",
              resumed_at > 0 ? " (resumed at step " + std::to_string(resumed_at) + ")" : "",
              ", loss ", total[0].item<double>() / records, ", accuracy ",
              100 * total[1].item<double>() / records, "%");
  }
  acc.print("done after ", acc.state()->optimizer_steps, " steps");
  acc.end_training();
}

}  // namespace

int main(int argc, char** argv) {
  Settings s;
  CLI::App app{
      "Train from sharded JSON Lines files on disk with a stream loader, resuming "
      "after a kill.\n"};
  app.add_option(accelerant::flag_names("world_size", "-n"), s.world_size,
                 "Processes to fork on this machine, the world size (ignored under a launcher)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--epochs", s.epochs, "Passes over the stream")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--batch_size", s.batch_size, "Records per step on each process")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--num_workers", s.num_workers, "Reader threads per process")
      ->capture_default_str();
  app.add_option("--project_dir", s.project_dir,
                 "The data set (DIR/data) and checkpoints (DIR/checkpoints); a run started "
                 "again resumes from the newest checkpoint")
      ->capture_default_str();
  app.add_option("--checkpoint_every", s.checkpoint_every, "Checkpoint every N steps")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--kill_at_step", s.kill_at_step,
                 "SIGKILL rank 1 right after the checkpoint of step N (a multiple of "
                 "--checkpoint_every), once; the group restarts and resumes")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  CLI11_PARSE(app, argc, argv);

  try {
    const auto options = accelerant::LaunchOptions()
                             .processes_per_node(s.world_size)
                             .max_restarts(s.kill_at_step > 0 ? 1 : 0);
    accelerant::prepare_launch(options);  // before forking, write the data single-threaded
    ::mkdir(s.project_dir.c_str(), 0755);
    // Under a launcher every rank runs this: the writes are idempotent and renamed into place.
    const auto shards = write_data_set(s.project_dir + "/data");
    accelerant::launch(train, std::cref(shards), std::cref(s), options);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sharded_files: %s\n", e.what());
    return 1;
  }
}
