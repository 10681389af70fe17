// A small program the tests start as a separate process, to play a launcher "node" or a launcher
// that receives signals or dies.
//   launch_helper node NODE_RANK PORT    one of two nodes with 2 workers each; prints each result
//   launch_helper sleepy DIR             2 workers that write DIR/pid.<rank> and sleep
// and, as a worker started by `accelerant launch`:
//   launch_helper worker                 joins the group, all-reduces rank + 1, prints the sum
//   launch_helper park DIR               the same, then writes DIR/pid.<rank> and sleeps
//   launch_helper throw                  rank 1 dies of an uncaught exception
//   launch_helper launch_throw           the same from inside accelerant::launch (in place)
//   launch_helper stop                   rank 1 stops itself (SIGSTOP) after the first all-reduce
//   launch_helper early                  rank 1 returns after the first all-reduce, rank 0 runs a
//                                        second one
//   launch_helper train VICTIM WHERE DIR 9 steps of a small model through the Accelerator, with a
//                                        save into DIR after step 5; in generation 0 rank VICTIM
//                                        (-1: none) SIGKILLs itself WHERE: in the backward of step
//                                        5 (backward), before it (before), or as the others save
//                                        after step 5 (save); with WHERE pause every worker of
//                                        generation 0 waits after step 4 (DIR/paused says so)
//                                        until DIR/go exists; prints a digest of the result
//   launch_helper elastic DIR PAUSE [ZERO_STAGE]
//                                        9 steps of a small model with a checkpoint in DIR every
//                                        3 and auto_resume; with PAUSE=1 every worker of
//                                        generation 0 waits after step 4 (DIR/paused says so), to
//                                        be stopped, with PAUSE=2 until DIR/go exists; prints a
//                                        checksum of the result
#include <accelerant/accelerant.h>
#include <unistd.h>

#include <csignal>
#include <fstream>
#include <iostream>
#include <thread>

using namespace accelerant;

namespace {

// The data of train and elastic: 96 samples of 8 features in 3 classes, 8 to a batch, shuffled.
DataLoader small_data_loader() {
  torch::manual_seed(5);
  auto x = torch::randn({96, 8});
  auto y = torch::randint(0, 3, {96}, torch::kLong);
  return make_data_loader(x, y, DataLoaderOptions().batch_size(8).shuffle(true));
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "node" && argc == 4) {
    auto options = LaunchOptions()
                       .processes_per_node(2)
                       .num_nodes(2)
                       .node_rank(std::stoi(argv[2]))
                       .master_port(std::stoi(argv[3]))
                       .collective_timeout(std::chrono::seconds(30));
    auto results = launch(
        [](int index) {
          auto& state = ProcessState::get();
          auto sum = state.communicator().all_reduce(torch::tensor({index}), ReduceOp::kSum);
          return "rank=" + std::to_string(state.rank()) +
                 " world=" + std::to_string(state.world_size()) +
                 " node=" + std::to_string(state.node_rank()) +
                 " sum=" + std::to_string(sum.item<int64_t>());
        },
        options);
    for (const auto& line : results) std::cout << line << "\n";
    return 0;
  }
  if (mode == "sleepy" && argc == 3) {
    const std::string dir = argv[2];
    launch(
        [&dir](int index) {
          std::ofstream(dir + "/pid." + std::to_string(index)) << ::getpid() << "\n";
          std::this_thread::sleep_for(std::chrono::minutes(10));
        },
        LaunchOptions().processes_per_node(2).stop_grace_period(std::chrono::seconds(1)));
    return 0;
  }
  if (mode == "worker") {  // started by `accelerant launch`: join the group the environment names
    auto& state = ProcessState::get();
    auto sum = state.communicator().all_reduce(torch::tensor({state.rank() + 1}), ReduceOp::kSum);
    std::cout << "worker rank=" << state.rank() << " world=" << state.world_size()
              << " local=" << state.local_rank() << " sum=" << sum.item<int64_t>()
              << " path=" << state.communicator().all_reduce_path() << std::endl;
    return 0;
  }
  if (mode == "replaced") {  // `accelerant launch --recovery replace_failed_worker`: rank 1 dies
    auto& state = ProcessState::get();
    Communicator& comm = state.communicator();
    if (state.restart_count() == 0) {
      comm.all_reduce(torch::ones({1}));  // the group formed
      if (state.rank() == 1) ::raise(SIGKILL);
      try {
        comm.all_reduce(torch::ones({1}));
      } catch (const CollectiveError&) {
        state.regroup();  // with rank 1's replacement
      }
    }
    auto sum = comm.all_reduce(torch::tensor({state.rank() + 1}), ReduceOp::kSum);
    std::cout << "done rank " << state.rank() << " generation " << state.restart_count()
              << " in place " << state.env().recovers_in_place << " joins "
              << state.env().joins_running_group << " sum " << sum.item<int64_t>() << std::endl;
    return 0;
  }
  if (mode == "train" && argc == 5) {
    const int victim = std::stoi(argv[2]);
    const std::string where = argv[3], dir = argv[4];
    Accelerator acc(AcceleratorOptions().seed(11).fused_optimizers(false));
    auto& process = ProcessState::get();
    const int started_in = process.restart_count();
    torch::manual_seed(3);
    auto net = torch::nn::Sequential(torch::nn::Linear(8, 32), torch::nn::ReLU(),
                                     torch::nn::Dropout(0.2), torch::nn::Linear(32, 3));
    torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
    auto [model, opt, loader] = acc.prepare(net, sgd, small_data_loader());
    // The first layer's gradient comes last in backward: the others wait in its all-reduce.
    auto dies_now = [&](const char* here, int64_t after) {
      return where == here && process.restart_count() == 0 && acc.rank() == victim &&
             acc.state()->optimizer_steps == after;
    };
    model->parameters()[0].register_hook([&](torch::Tensor grad) {
      if (dies_now("backward", 4)) ::raise(SIGKILL);
      return grad;
    });
    while (loader.epoch() < 3) {
      for (auto& batch : loader) {
        if (where == "pause" && process.restart_count() == 0 && acc.state()->optimizer_steps == 4) {
          if (acc.is_main_process()) std::ofstream(dir + "/paused") << "4\n";
          for (int i = 0; i < 2400 && ::access((dir + "/go").c_str(), F_OK) != 0; ++i)
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
        opt.zero_grad();
        auto loss = torch::nn::functional::cross_entropy(model->forward(batch.data), batch.target);
        if (dies_now("before", 4)) ::raise(SIGKILL);
        acc.backward(loss);
        opt.step();
        if (acc.state()->optimizer_steps == 5) {
          if (dies_now("save", 5)) ::raise(SIGKILL);
          acc.save_state(dir + "/step_5_generation_" + std::to_string(process.restart_count()));
        }
      }
    }
    // FNV-1a over the parameters' bytes: equal digests, equal parameters bit for bit.
    uint64_t digest = 1469598103934665603ull;
    for (const auto& p : model->parameters()) {
      const auto values = p.detach().contiguous();
      const auto* bytes = static_cast<const unsigned char*>(values.data_ptr());
      for (int64_t i = 0; i < values.nbytes(); ++i) digest = (digest ^ bytes[i]) * 1099511628211ull;
    }
    std::cout << "trained rank=" << acc.rank() << " started_in_generation=" << started_in
              << " generation=" << process.restart_count()
              << " steps=" << acc.state()->optimizer_steps << " digest=" << std::hex << digest
              << std::dec << std::endl;
    return 0;
  }
  if (mode == "elastic" && (argc == 4 || argc == 5)) {
    const std::string dir = argv[2];
    const std::string pause = argv[3];
    Accelerator acc(AcceleratorOptions()
                        .seed(11)
                        .fused_optimizers(false)
                        .zero_stage(argc == 5 ? std::stoi(argv[4]) : 0)
                        .project_dir(dir + "/project")
                        .auto_resume(true));
    auto& process = ProcessState::get();
    torch::manual_seed(3);
    // No dropout: each process draws its own, which a different world would draw differently.
    auto net = torch::nn::Sequential(torch::nn::Linear(8, 32), torch::nn::ReLU(),
                                     torch::nn::Linear(32, 3));
    torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
    auto [model, opt, loader] = acc.prepare(net, sgd, small_data_loader());
    while (loader.epoch() < 3) {
      for (auto& batch : loader) {
        const int64_t before = acc.state()->optimizer_steps;
        if (pause != "0" && process.restart_count() == 0 && before == 4) {
          // Each rank's batch after step 4 was handed out (and looked at) when it waits here.
          std::ofstream(dir + "/paused." + std::to_string(acc.rank())) << "4\n";
          if (acc.is_main_process()) std::ofstream(dir + "/paused") << "4\n";
          if (pause == "1") std::this_thread::sleep_for(std::chrono::minutes(2));
          for (int i = 0; i < 2400 && ::access((dir + "/go").c_str(), F_OK) != 0; ++i)
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
        auto guard = acc.accumulate(model);
        acc.backward(
            torch::nn::functional::cross_entropy(model->forward(batch.data), batch.target));
        opt.step();
        opt.zero_grad();
        const int64_t steps = acc.state()->optimizer_steps;
        if (steps != before && steps % 3 == 0) acc.save_state();
      }
    }
    // Weighted by position, so that values trading places change it.
    double checksum = 0;
    for (const auto& p : model->parameters()) {
      const auto flat = p.detach().reshape(-1).to(torch::kDouble);
      checksum += (flat * torch::arange(1, flat.numel() + 1, torch::kDouble)).sum().item<double>();
    }
    std::printf(
        "elastic rank=%d world=%d accumulation=%lld generation=%d steps=%lld checksum=%.12g\n",
        acc.rank(), acc.world_size(),
        static_cast<long long>(acc.settings().gradient_accumulation_steps), process.restart_count(),
        static_cast<long long>(acc.state()->optimizer_steps), checksum);
    std::fflush(stdout);
    return 0;
  }
  if (mode == "settings") {  // started by `accelerant launch`: the Accelerator's view of the launch
    Accelerator accelerator;
    const auto& s = accelerator.settings();
    std::cout << "settings rank=" << accelerator.rank()
              << " gradient_accumulation_steps=" << s.gradient_accumulation_steps
              << " cpu=" << s.cpu << " downcast_bf16=" << s.downcast_bf16 << std::endl;
    return 0;
  }
  if (mode == "park" && argc == 3) {  // started by `accelerant launch`: join, all-reduce, then wait
    auto& state = ProcessState::get();
    auto sum = state.communicator().all_reduce(torch::tensor({state.rank() + 1}), ReduceOp::kSum);
    std::cout << "parked rank=" << state.rank() << " sum=" << sum.item<int64_t>() << std::endl;
    std::ofstream(std::string(argv[2]) + "/pid." + std::to_string(state.rank()))
        << ::getpid() << "\n";
    std::this_thread::sleep_for(std::chrono::minutes(10));
    return 0;
  }
  if (mode == "stop") {  // started by `accelerant launch`: rank 1 stops itself (SIGSTOP) mid-job
    auto& state = ProcessState::get();
    state.communicator().all_reduce(torch::tensor({1}), ReduceOp::kSum);
    std::cout << "joined rank=" << state.rank() << std::endl;
    if (state.rank() == 1) ::raise(SIGSTOP);
    state.communicator().all_reduce(torch::tensor({1}), ReduceOp::kSum);  // rank 0 waits here
    return 0;
  }
  if (mode == "early") {  // started by `accelerant launch`: rank 1 skips the second all-reduce
    auto& state = ProcessState::get();
    state.communicator().all_reduce(torch::tensor({1}), ReduceOp::kSum);
    std::cout << "joined rank=" << state.rank() << std::endl;
    if (state.rank() == 1) return 0;
    state.communicator().all_reduce(torch::tensor({1}), ReduceOp::kSum);  // rank 0 waits here
    return 0;
  }
  if (mode == "throw") {  // started by `accelerant launch`: dies of an uncaught exception
    ProcessState::get();
    if (ProcessState::get().rank() == 1)
      throw std::runtime_error("the data file shard-7 is corrupt");
    return 0;
  }
  if (mode == "launch_throw") {  // started by `accelerant launch`: launch() runs fn in place
    launch(
        [](int rank) {
          ProcessState::get();
          if (rank == 1) throw std::runtime_error("the data file shard-7 is corrupt");
          return 0;
        },
        LaunchOptions().processes_per_node(2));
    std::cout << "launch returned on rank " << ProcessState::get().rank() << std::endl;
    return 0;
  }
  if (mode == "skip") {  // started by `accelerant launch`: only rank 0 reduces (issue 22's mistake)
    Accelerator accelerator;
    if (accelerator.is_main_process()) accelerator.reduce(torch::ones({2}));
    accelerator.wait_for_everyone();  // the other ranks wait here, in another collective
    return 0;
  }
  std::cerr << "usage: launch_helper node NODE_RANK PORT | sleepy DIR | worker | settings | park "
               "DIR | throw | launch_throw | stop | skip | early\n";
  return 2;
}
