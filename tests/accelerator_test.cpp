// The Accelerator in one process: option resolution, prepare, the optimizer, scheduler and
// loader wrappers, fp16 loss scaling, bf16, and the errors for bad input. The multi-process
// behaviour is in accelerator_distributed_test.cpp.
#include <accelerant/accelerant.h>
#include <gtest/gtest.h>
#include <sched.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <set>

#include "test_support.h"

using namespace accelerant;
using accelerant::testing::env_of;

namespace {

const auto error_of = accelerant::testing::error_message;

struct TempDir {
  std::string dir = accelerant::testing::make_temp_dir();
  ~TempDir() { accelerant::testing::remove_tree(dir); }
  const std::string& path() const { return dir; }
};

// Halves the learning rate on every step() (LibTorch's StepLR skips its first step).
struct HalvingScheduler : torch::optim::LRScheduler {
  using LRScheduler::LRScheduler;
  std::vector<double> get_lrs() override {
    auto lrs = get_current_lrs();
    for (auto& lr : lrs) lr *= 0.5;
    return lrs;
  }
};

torch::nn::Sequential small_mlp() {
  return torch::nn::Sequential(torch::nn::Linear(8, 16), torch::nn::Tanh(),
                               torch::nn::Linear(16, 3));
}

}  // namespace

// ---- option resolution ---------------------------------------------------------------------

TEST(AcceleratorSettings, OptionBeatsEnvironmentBeatsConfigBeatsDefault) {
  const ConfigValues config{{"mixed_precision", "bf16"},
                            {"gradient_accumulation_steps", "3"},
                            {"even_batches", "false"},
                            {"cpu", "true"},
                            {"seed", "7"}};
  auto env = env_of({{"ACCELERANT_GRADIENT_ACCUMULATION_STEPS", "2"}, {"ACCELERANT_SEED", "9"}});
  auto s = resolve_accelerator_settings(AcceleratorOptions().seed(11), env, config, "cfg.yaml");
  EXPECT_EQ(s.mixed_precision, MixedPrecision::kBf16);  // config
  EXPECT_EQ(s.gradient_accumulation_steps, 2);          // environment over config
  EXPECT_FALSE(s.even_batches);                         // config
  EXPECT_TRUE(s.cpu);                                   // config (the key `cpu`, docs/names.md)
  EXPECT_EQ(s.seed, std::optional<uint64_t>(11));       // option over both
  EXPECT_FALSE(s.split_batches);                        // default
  EXPECT_TRUE(s.cpu_defaults);                          // default
  EXPECT_EQ(s.sources.at("seed"), "option");
  EXPECT_EQ(s.sources.at("gradient_accumulation_steps"), "ACCELERANT_GRADIENT_ACCUMULATION_STEPS");
  EXPECT_NE(s.sources.at("mixed_precision").find("cfg.yaml"), std::string::npos);
  EXPECT_EQ(s.sources.count("split_batches"), 0u);
}

TEST(AcceleratorSettings, BadValuesNameTheirSourceAndTheFix) {
  auto none = env_of({});
  auto message = error_of([&] {
    resolve_accelerator_settings({}, none, {{"mixed_precision", "fp8"}});
  });
  EXPECT_NE(message.find("\"fp8\""), std::string::npos) << message;
  EXPECT_NE(message.find("bf16"), std::string::npos) << message;
  message = error_of([&] {
    resolve_accelerator_settings({}, env_of({{"ACCELERANT_GRADIENT_ACCUMULATION_STEPS", "0"}}), {});
  });
  EXPECT_NE(message.find("ACCELERANT_GRADIENT_ACCUMULATION_STEPS"), std::string::npos) << message;
  message = error_of([&] {
    resolve_accelerator_settings({}, none, {{"even_batches", "maybe"}}, "my.yaml");
  });
  EXPECT_NE(message.find("my.yaml (key even_batches)"), std::string::npos) << message;
  message = error_of([&] {
    resolve_accelerator_settings(AcceleratorOptions().gradient_accumulation_steps(-2), none, {});
  });
  EXPECT_NE(message.find("-2"), std::string::npos) << message;
}

TEST(AcceleratorSettings, ConfigPathFollowsTheEnvironment) {
  EXPECT_EQ(default_config_path(env_of({{"ACCELERANT_CONFIG_FILE", "/x/c.yaml"}, {"HOME", "/h"}})),
            "/x/c.yaml");
  EXPECT_EQ(default_config_path(env_of({{"XDG_CACHE_HOME", "/c"}, {"HOME", "/h"}})),
            "/c/accelerant/default_config.yaml");
  EXPECT_EQ(default_config_path(env_of({{"HOME", "/h"}})),
            "/h/.cache/accelerant/default_config.yaml");
}

TEST(AcceleratorSettings, MalformedConfigReportsLineAndColumn) {
  TempDir dir;
  const std::string path = dir.path() + "/bad.yaml";
  std::ofstream(path) << "mixed_precision: bf16\nseed: [1, 2\n";
  auto message = error_of([&] { read_config_values(path); });
  EXPECT_NE(message.find("line "), std::string::npos) << message;
  EXPECT_NE(message.find(path), std::string::npos) << message;
  EXPECT_TRUE(read_config_values(dir.path() + "/missing.yaml").empty());
  std::ofstream(path) << "mixed_precision: bf16\ndebug: false\n";
  EXPECT_EQ(read_config_values(path).at("mixed_precision"), "bf16");
}

// ---- construction and bad input ---------------------------------------------------------------

TEST(Accelerator, Fp16OnTheCpuSaysBf16IsTheCpuChoice) {
  auto message = error_of(
      [] { Accelerator acc(AcceleratorOptions().mixed_precision(MixedPrecision::kFp16)); });
  EXPECT_NE(message.find("fp16 needs a CUDA device"), std::string::npos) << message;
  EXPECT_NE(message.find("bf16"), std::string::npos) << message;
}

TEST(Accelerator, DowncastWithoutBf16IsRefused) {
  auto message = error_of([] { Accelerator acc(AcceleratorOptions().downcast_bf16(true)); });
  EXPECT_NE(message.find("downcast_bf16"), std::string::npos) << message;
}

TEST(Accelerator, PrepareOfAnEmptyModelPointerSaysHowToFix) {
  Accelerator acc;
  std::shared_ptr<torch::nn::LinearImpl> none;
  auto message = error_of([&] { acc.prepare(none); });
  EXPECT_NE(message.find("empty model pointer"), std::string::npos) << message;
}

TEST(Accelerator, AccumulateOnAModelNotPreparedIsAnError) {
  Accelerator acc;
  auto model = small_mlp();
  auto message = error_of([&] { auto guard = acc.accumulate(model); });
  EXPECT_NE(message.find("not prepared"), std::string::npos) << message;
}

TEST(Accelerator, BackwardNeedsAScalarLoss) {
  Accelerator acc;
  auto message = error_of([&] { acc.backward(torch::ones({3}, torch::requires_grad())); });
  EXPECT_NE(message.find("scalar loss"), std::string::npos) << message;
}

TEST(Accelerator, PrepareReturnsTheSameObjectsInOrder) {
  Accelerator acc(AcceleratorOptions().seed(3));
  auto model = small_mlp();
  torch::optim::SGD sgd(model->parameters(), 0.1);
  HalvingScheduler step_lr(sgd);
  auto loader = make_data_loader(torch::randn({10, 8}), torch::zeros({10}, torch::kLong),
                                 DataLoaderOptions().batch_size(4));
  auto [l, m, o, s] = acc.prepare(loader, model, sgd, step_lr);
  EXPECT_EQ(m.ptr(), model.ptr());
  EXPECT_EQ(&o.optimizer(), &sgd);
  EXPECT_EQ(&s.scheduler(), &step_lr);
  EXPECT_EQ(l.size(), 3);
  EXPECT_EQ(acc.world_size(), 1);
  EXPECT_TRUE(acc.is_main_process());
  auto same = acc.prepare(model);  // a single object comes back as itself
  EXPECT_EQ(same.ptr(), model.ptr());
}

// ---- the training step ----------------------------------------------------------------------

TEST(Accelerator, AccumulationStepsOnlyEveryNthMicroStepAndScalesTheLoss) {
  Accelerator acc(AcceleratorOptions().gradient_accumulation_steps(4));
  auto model = small_mlp();
  torch::optim::SGD sgd(model->parameters(), 0.1);
  HalvingScheduler halve(sgd);
  auto [m, o, s] = acc.prepare(model, sgd, halve);
  auto before = m->parameters()[0].clone();
  auto x = torch::randn({4, 8});
  int updates = 0;
  for (int micro = 1; micro <= 8; ++micro) {
    auto guard = acc.accumulate(m);
    acc.backward(m->forward(x).sum());
    EXPECT_EQ(acc.sync_gradients(), micro % 4 == 0) << "micro-step " << micro;
    if (o.step()) ++updates;
    s.step();
    o.zero_grad();
    if (micro == 3)
      EXPECT_TRUE(torch::equal(m->parameters()[0], before)) << "stepped while accumulating";
  }
  EXPECT_EQ(updates, 2);
  EXPECT_DOUBLE_EQ(sgd.param_groups()[0].options().get_lr(), 0.1 * 0.25);  // two scheduler steps
}

TEST(Accelerator, AccumulatedGradientEqualsTheGradientOfTheWholeBatch) {
  Accelerator acc(AcceleratorOptions().gradient_accumulation_steps(4));
  torch::manual_seed(0);
  auto model = small_mlp();
  auto m = acc.prepare(model);
  auto x = torch::randn({16, 8});
  auto y = torch::randint(0, 3, {16}, torch::kLong);
  for (int k = 0; k < 4; ++k) {
    auto guard = acc.accumulate(m);
    acc.backward(torch::nn::functional::cross_entropy(m->forward(x.narrow(0, 4 * k, 4)),
                                                      y.narrow(0, 4 * k, 4)));
  }
  auto accumulated = m->parameters()[0].grad().clone();
  m->zero_grad();
  torch::nn::functional::cross_entropy(m->forward(x), y).backward();
  EXPECT_TRUE(torch::allclose(accumulated, m->parameters()[0].grad(), 1e-5, 1e-6));
}

TEST(PreparedOptimizer, Fp16OverflowSkipsTheStepHalvesTheScaleAndKeepsTheParameters) {
  auto state = std::make_shared<TrainingState>();
  state->scaler = std::make_shared<GradScaler>();
  auto model = small_mlp();
  torch::optim::SGD sgd(model->parameters(), 0.1);
  HalvingScheduler halve(sgd);
  PreparedScheduler never_skipped_schedule(halve, state);
  PreparedOptimizer opt(sgd, state);
  for (auto& p : model->parameters()) p.mutable_grad() = torch::ones_like(p);
  model->parameters()[1].mutable_grad()[0] = std::numeric_limits<float>::infinity();
  std::vector<torch::Tensor> before;
  for (auto& p : model->parameters()) before.push_back(p.clone());
  EXPECT_FALSE(opt.step());
  EXPECT_TRUE(opt.step_was_skipped());
  never_skipped_schedule.step();
  EXPECT_DOUBLE_EQ(sgd.param_groups()[0].options().get_lr(), 0.1)
      << "the scheduler stepped on a skipped step";
  EXPECT_DOUBLE_EQ(state->scaler->current_scale(), 32768.0);
  for (size_t i = 0; i < before.size(); ++i)
    EXPECT_TRUE(torch::equal(model->parameters()[i], before[i]));
  // A finite (scaled) gradient steps and divides by the scale first.
  for (auto& p : model->parameters()) p.mutable_grad() = torch::full_like(p, 32768.0);
  EXPECT_TRUE(opt.step());
  EXPECT_TRUE(torch::allclose(model->parameters()[0], before[0] - 0.1));
  never_skipped_schedule.step();
  EXPECT_DOUBLE_EQ(sgd.param_groups()[0].options().get_lr(), 0.05);
}

TEST(Accelerator, ClipGradNormReturnsTheNormAndClips) {
  Accelerator acc;
  auto model = small_mlp();
  auto m = acc.prepare(model);
  for (auto& p : m->parameters()) p.mutable_grad() = torch::full_like(p, 3.0);
  int64_t count = 0;
  for (auto& p : m->parameters()) count += p.numel();
  const double norm = acc.clip_grad_norm_(m, 1.0);
  EXPECT_NEAR(norm, 3.0 * std::sqrt(static_cast<double>(count)), 1e-3);
  double clipped = 0;
  for (auto& p : m->parameters()) clipped += p.grad().pow(2).sum().item<double>();
  EXPECT_NEAR(std::sqrt(clipped), 1.0, 1e-4);
}

// ---- mixed precision ------------------------------------------------------------------------

namespace {
// Loss after `steps` SGD steps of a fixed MLP on fixed data, under `options`.
struct BriefRun {
  double first_loss = 0;
  double last_loss = 0;
  torch::ScalarType weight_dtype = torch::kFloat;
};

BriefRun train_briefly(AcceleratorOptions options, int steps) {
  Accelerator acc(options.cpu_defaults(false));
  torch::manual_seed(0);
  auto model =
      torch::nn::Sequential(torch::nn::Linear(32, 64), torch::nn::ReLU(), torch::nn::Linear(64, 4));
  torch::optim::SGD sgd(model->parameters(), 0.3);
  auto x = torch::randn({256, 32});
  auto y = (x.narrow(1, 0, 4).argmax(1)).to(torch::kLong);
  auto loader = make_data_loader(x, y, DataLoaderOptions().batch_size(64));
  auto [m, o, l] = acc.prepare(model, sgd, loader);
  BriefRun run;
  bool first = true;
  for (int epoch = 0; epoch * 4 < steps; ++epoch) {
    for (auto& batch : l) {
      torch::Tensor loss;
      {
        auto autocast = acc.autocast();
        loss = torch::nn::functional::cross_entropy(m->forward(batch.data).to(torch::kFloat),
                                                    batch.target);
      }
      acc.backward(loss);
      o.step();
      o.zero_grad();
      run.last_loss = loss.item<double>();
      if (first) run.first_loss = run.last_loss;
      first = false;
    }
  }
  run.weight_dtype = m->parameters()[0].scalar_type();
  return run;
}
}  // namespace

TEST(Accelerator, Bf16AutocastTracksFp32AndKeepsFp32MasterWeights) {
  auto fp32 = train_briefly(AcceleratorOptions(), 40);
  auto bf16 = train_briefly(AcceleratorOptions().mixed_precision(MixedPrecision::kBf16), 40);
  EXPECT_EQ(bf16.weight_dtype, torch::kFloat) << "autocast must not change the stored weights";
  EXPECT_NEAR(bf16.last_loss, fp32.last_loss, 0.05 * std::abs(fp32.last_loss) + 0.01);
  EXPECT_LT(bf16.last_loss, 0.9 * bf16.first_loss) << "bf16 training did not learn";
}

TEST(Accelerator, Bf16AutocastComputesMatmulsInBf16) {
  Accelerator acc(AcceleratorOptions().mixed_precision(MixedPrecision::kBf16));
  auto a = torch::randn({4, 4});
  auto autocast = acc.autocast();
  EXPECT_EQ(torch::mm(a, a).scalar_type(), torch::kBFloat16);
}

TEST(Accelerator, DowncastBf16StoresWeightsAndInputsInBf16AndReducesInFp32) {
  auto run = train_briefly(
      AcceleratorOptions().mixed_precision(MixedPrecision::kBf16).downcast_bf16(true), 40);
  EXPECT_EQ(run.weight_dtype, torch::kBFloat16);
  EXPECT_LT(run.last_loss, 0.9 * run.first_loss) << "downcast bf16 training did not learn";
  Accelerator acc(AcceleratorOptions().mixed_precision(MixedPrecision::kBf16).downcast_bf16(true));
  EXPECT_EQ(acc.reduce(torch::ones({2}, torch::kBFloat16)).scalar_type(), torch::kFloat);
  auto loader =
      acc.prepare(make_data_loader(torch::randn({4, 2}), torch::zeros({4}, torch::kLong)));
  for (auto& batch : loader) {
    EXPECT_EQ(batch.data.scalar_type(), torch::kBFloat16);
    EXPECT_EQ(batch.target.scalar_type(), torch::kLong);
  }
}

// ---- save ----------------------------------------------------------------------------------

TEST(Accelerator, SavedModelLoadsBackIntoAFreshModel) {
  Accelerator acc;
  auto model = small_mlp();
  TempDir dir;
  acc.save(model, dir.path() + "/model.pt");
  acc.save(torch::arange(5), dir.path() + "/t.pt");
  auto fresh = small_mlp();
  torch::load(fresh, dir.path() + "/model.pt");
  for (size_t i = 0; i < model->parameters().size(); ++i) {
    EXPECT_TRUE(torch::equal(fresh->parameters()[i], model->parameters()[i]));
  }
  torch::Tensor t;
  torch::load(t, dir.path() + "/t.pt");
  EXPECT_TRUE(torch::equal(t, torch::arange(5)));
  std::ifstream leftover(dir.path() + "/model.pt.tmp");
  EXPECT_FALSE(leftover.good()) << "the temporary file was left behind";
}

TEST(Accelerator, SetSeedMakesDrawsRepeatable) {
  Accelerator acc;
  acc.set_seed(5);
  auto a = torch::rand({3});
  acc.set_seed(5);
  EXPECT_TRUE(torch::equal(a, torch::rand({3})));
}

TEST(Accelerator, CpuDefaultsKeepAThreadCountTheProgramChose) {
  torch::set_num_threads(
      3);           // neither LibTorch's default nor cores / processes on any machine here
  Accelerator acc;  // cpu_defaults on
  EXPECT_EQ(acc.threads(), 3);
  EXPECT_EQ(torch::get_num_threads(), 3);
}

TEST(Accelerator, CpuDefaultsGiveOneProcessEveryUsableCore) {
  // Meaningful in a fresh process (CTest runs each test alone) with no thread variables set.
  if (std::getenv("OMP_NUM_THREADS") != nullptr) GTEST_SKIP() << "OMP_NUM_THREADS is set";
  cpu_set_t set;
  ASSERT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
  Accelerator acc;
  EXPECT_EQ(acc.threads(), CPU_COUNT(&set));
  EXPECT_EQ(torch::get_num_threads(), CPU_COUNT(&set));
}

// A task that srun started with -c 1 runs one thread, not every usable CPU: SLURM_CPUS_PER_TASK
// reaches the CPU defaults through the launch contract.
TEST(Accelerator, CpuDefaultsUnderSrunUseCpusPerTask) {
  if (std::getenv("OMP_NUM_THREADS") != nullptr) GTEST_SKIP() << "OMP_NUM_THREADS is set";
  cpu_set_t set;
  ASSERT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
  if (CPU_COUNT(&set) < 2) GTEST_SKIP() << "one usable CPU: -c 1 would change nothing";
  // A fresh process (CTest runs each test alone): the variables are read at the first
  // ProcessState, which this Accelerator creates.
  ::setenv("SLURM_PROCID", "0", 1);
  ::setenv("SLURM_NTASKS", "1", 1);
  ::setenv("SLURM_CPUS_PER_TASK", "1", 1);
  Accelerator acc;
  EXPECT_EQ(acc.threads(), 1);
  EXPECT_EQ(torch::get_num_threads(), 1);
}
