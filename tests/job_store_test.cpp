// The launcher's own job store (launch/job_store.h) against LibTorch's c10d::TCPStore: the
// workers' real c10d clients use every query type on our server, several at once, with waits that
// time out and waits that another client ends; Gloo rendezvouses through it; and our client also
// talks to c10d's own server. If LibTorch's protocol changes, these fail first.
#include "launch/job_store.h"

#include <accelerant/accelerant.h>
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <torch/torch.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <future>
#include <thread>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "accelerant/error.h"

using accelerant::detail::StoreClient;
using accelerant::detail::StoreReach;
using accelerant::detail::StoreServer;
using namespace std::chrono_literals;

namespace {

std::vector<uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }
std::string text(const std::vector<uint8_t>& b) { return {b.begin(), b.end()}; }

c10::intrusive_ptr<c10d::TCPStore> c10d_client(int port, std::chrono::milliseconds timeout = 10s) {
  c10d::TCPStoreOptions o;
  o.port = static_cast<std::uint16_t>(port);
  o.isServer = false;
  o.waitWorkers = false;
  o.timeout = timeout;
  return c10::make_intrusive<c10d::TCPStore>("127.0.0.1", o);
}

}  // namespace

TEST(JobStore, ServesEveryQueryTypeOfC10dClients) {
  StoreServer server(0, StoreReach::kThisMachine);
  ASSERT_GT(server.port(), 0);
  auto store = c10d_client(server.port());

  store->set("a", bytes("one"));            // SET
  EXPECT_EQ(text(store->get("a")), "one");  // WAIT then GET
  EXPECT_TRUE(store->check({"a"}));         // CHECK
  EXPECT_FALSE(store->check({"a", "absent"}));
  store->wait({"a"});  // WAIT on a key that is there

  EXPECT_EQ(store->add("n", 5), 5);  // ADD creates
  EXPECT_EQ(store->add("n", -2), 3);
  EXPECT_EQ(text(store->get("n")), "3");  // kept as decimal text

  // COMPARE_SET: replaced when expected matches, else the current value comes back; an absent key
  // is created only with an empty expected value.
  EXPECT_EQ(text(store->compareSet("a", bytes("one"), bytes("two"))), "two");
  EXPECT_EQ(text(store->compareSet("a", bytes("one"), bytes("three"))), "two");
  EXPECT_EQ(text(store->compareSet("c", {}, bytes("made"))), "made");
  EXPECT_EQ(text(store->compareSet("d", bytes("x"), bytes("y"))), "x");
  EXPECT_FALSE(store->check({"d"}));

  EXPECT_EQ(store->getNumKeys(), 3);   // a, n, c
  EXPECT_TRUE(store->deleteKey("c"));  // DELETE_KEY
  EXPECT_FALSE(store->deleteKey("c"));
  EXPECT_EQ(store->getNumKeys(), 2);

  // WATCH_KEY: the callback hears the change (on c10d's second connection).
  std::promise<std::string> heard;
  store->watchKey(
      "w", [&heard](c10::optional<std::string> old_value, c10::optional<std::string> new_value) {
        heard.set_value(old_value.value_or("<none>") + "->" + new_value.value_or("<none>"));
      });
  auto other = c10d_client(server.port());
  other->set("w", bytes("v1"));
  auto future = heard.get_future();
  ASSERT_EQ(future.wait_for(10s), std::future_status::ready);
  EXPECT_EQ(future.get(), "<none>->v1");
}

TEST(JobStore, CountsAddsFromSeveralClientsAtOnce) {
  StoreServer server(0, StoreReach::kThisMachine);
  constexpr int kClients = 6, kAdds = 200;
  std::vector<std::thread> threads;
  std::atomic<int> max_seen{0};
  for (int c = 0; c < kClients; ++c) {
    threads.emplace_back([&] {
      auto store = c10d_client(server.port());
      for (int i = 0; i < kAdds; ++i) {
        const int sum = static_cast<int>(store->add("counter", 1));
        int seen = max_seen.load();
        while (sum > seen && !max_seen.compare_exchange_weak(seen, sum)) {
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  auto store = c10d_client(server.port());
  EXPECT_EQ(store->add("counter", 0), kClients * kAdds);
  EXPECT_EQ(max_seen.load(), kClients * kAdds);
}

TEST(JobStore, WaitTimesOutWhenTheKeyNeverComes) {
  StoreServer server(0, StoreReach::kThisMachine);
  auto store = c10d_client(server.port());
  const auto start = std::chrono::steady_clock::now();
  EXPECT_ANY_THROW(store->wait({"never"}, 300ms));
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_GE(took, 290ms);
  EXPECT_LT(took, 5s);
}

TEST(JobStore, WaitEndsWhenAnotherClientSetsTheKeysLater) {
  StoreServer server(0, StoreReach::kThisMachine);
  auto waiter = c10d_client(server.port());
  auto setter = c10d_client(server.port());
  auto waited = std::async(std::launch::async, [&] {
    waiter->wait({"k1", "k2"}, 20s);
    return text(waiter->get("k2"));
  });
  std::this_thread::sleep_for(200ms);
  setter->set("k1", bytes("first"));
  EXPECT_EQ(waited.wait_for(300ms), std::future_status::timeout);  // k2 still missing
  setter->add("k2", 7);
  ASSERT_EQ(waited.wait_for(10s), std::future_status::ready);
  EXPECT_EQ(waited.get(), "7");
}

TEST(JobStore, GlooRendezvousesThroughIt) {
  StoreServer server(0, StoreReach::kThisMachine);
  constexpr int kRanks = 3;
  std::vector<std::future<float>> sums;
  for (int rank = 0; rank < kRanks; ++rank) {
    sums.push_back(std::async(std::launch::async, [&server, rank] {
      auto store = c10::make_intrusive<c10d::PrefixStore>("gloo", c10d_client(server.port()));
      auto options = c10d::ProcessGroupGloo::Options::create(std::chrono::milliseconds(20000));
      options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
      c10d::ProcessGroupGloo group(store, rank, kRanks, options);
      std::vector<at::Tensor> tensors{torch::full({4}, static_cast<float>(rank + 1))};
      group.allreduce(tensors)->wait();
      return tensors[0][0].item<float>();
    }));
  }
  for (auto& s : sums) EXPECT_EQ(s.get(), 6.0f);
}

TEST(JobStore, OurClientSharesKeysWithC10dClients) {
  StoreServer server(0, StoreReach::kThisMachine);
  StoreClient ours("127.0.0.1", server.port(), 5s, 5s);
  auto theirs = c10d_client(server.port());
  ours.set("from/ours", "hello");
  EXPECT_EQ(text(theirs->get("from/ours")), "hello");
  theirs->set("from/theirs", bytes("world"));
  EXPECT_EQ(ours.get("from/theirs"), "world");
  EXPECT_EQ(ours.add("count", 2), 2);
  EXPECT_EQ(theirs->add("count", 3), 5);
  EXPECT_TRUE(ours.check({"from/ours", "from/theirs"}));
  EXPECT_FALSE(ours.check({"nothing"}));
  // A timed-out wait leaves the client usable (it reconnects; 1.13 cannot cancel a wait).
  EXPECT_THROW(ours.wait({"nothing"}, 200ms), accelerant::Error);
  theirs->set("nothing", bytes("now"));
  EXPECT_EQ(ours.get("nothing"), "now");
  EXPECT_EQ(ours.add("count", 0), 5);
}

TEST(JobStore, OurClientTalksToC10dsServer) {
  c10d::TCPStoreOptions o;
  o.port = 0;
  o.isServer = true;
  o.waitWorkers = false;
  o.timeout = 10s;
  auto c10d_server = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", o);
  StoreClient ours("127.0.0.1", c10d_server->getPort(), 5s, 5s);
  ours.set("k", "v");
  EXPECT_EQ(text(c10d_server->get("k")), "v");
  EXPECT_EQ(ours.add("n", 4), 4);
  EXPECT_TRUE(ours.check({"k", "n"}));
  auto later = std::async(std::launch::async, [&] {
    std::this_thread::sleep_for(200ms);
    c10d_server->set("late", bytes("x"));
  });
  ours.wait({"late"}, 10s);
  EXPECT_EQ(ours.get("late"), "x");
}

TEST(JobStore, ClientSaysWhenNoStoreAnswers) {
  int port = 0;
  {
    StoreServer server(0, StoreReach::kThisMachine);
    port = server.port();
  }
  try {
    StoreClient ours("127.0.0.1", port, 300ms, 1s);
    FAIL() << "connected to a closed port";
  } catch (const accelerant::Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot connect to the job's store"), std::string::npos)
        << e.what();
  }
}

TEST(JobStore, ServerRefusesATakenPort) {
  StoreServer first(0, StoreReach::kThisMachine);
  EXPECT_THROW(StoreServer second(first.port(), StoreReach::kThisMachine), accelerant::Error);
}

namespace {

// An IPv4 address of this machine other than loopback ("" when it has none).
std::string non_loopback_address() {
  ifaddrs* all = nullptr;
  if (::getifaddrs(&all) != 0) return "";
  std::string found;
  for (ifaddrs* a = all; a && found.empty(); a = a->ifa_next) {
    if (!a->ifa_addr || a->ifa_addr->sa_family != AF_INET) continue;
    const auto* in = reinterpret_cast<const sockaddr_in*>(a->ifa_addr);
    if ((ntohl(in->sin_addr.s_addr) >> 24) == 127) continue;
    char text[INET_ADDRSTRLEN] = {};
    if (::inet_ntop(AF_INET, &in->sin_addr, text, sizeof text)) found = text;
  }
  ::freeifaddrs(all);
  return found;
}

bool connects(const std::string& host, int port) {
  try {
    StoreClient client(host, port, 300ms, 1s);
    return true;
  } catch (const accelerant::Error&) {
    return false;
  }
}

}  // namespace

// A value far beyond what a job keeps in its store (512 MB declared) closes that connection at
// once, before the launcher buffers any of it, and the store goes on serving (issue 38).
TEST(JobStoreSecurity, AHugeValueIsRefusedBeforeItIsBuffered) {
  StoreServer server(0, StoreReach::kThisMachine);
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(static_cast<uint16_t>(server.port()));
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof to), 0);
  std::string query(1, '\0');  // SET
  auto append_u64 = [&query](uint64_t v) { query.append(reinterpret_cast<char*>(&v), 8); };
  append_u64(1);
  query += "k";
  append_u64(uint64_t{512} << 20);  // the value's declared size; 1 MB of it follows
  query += std::string(1 << 20, 'x');
  ssize_t sent = 0;
  while (sent < static_cast<ssize_t>(query.size())) {
    const ssize_t n = ::send(fd, query.data() + sent, query.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;  // closed under us: what is expected
    sent += n;
  }
  timeval limit{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
  char byte = 0;
  const ssize_t got = ::recv(fd, &byte, 1, 0);
  const bool timed_out = got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
  EXPECT_TRUE(got == 0 || (got < 0 && !timed_out))
      << "the connection was kept open (recv " << got << ", waiting for the rest of the value)";
  ::close(fd);
  StoreClient client("127.0.0.1", server.port(), 5s, 5s);
  client.set("after", "still serving");
  EXPECT_EQ(client.get("after"), "still serving");
}

// A job on one machine: its store cannot be reached from the network (docs/security.md).
TEST(JobStoreSecurity, AStoreForOneMachineListensOnLoopbackOnly) {
  const std::string outside = non_loopback_address();
  if (outside.empty()) GTEST_SKIP() << "this machine has no non-loopback IPv4 address";
  StoreServer private_store(0, StoreReach::kThisMachine);
  EXPECT_TRUE(connects("127.0.0.1", private_store.port()));
  EXPECT_FALSE(connects(outside, private_store.port())) << "reached through " << outside;
  // The control: the same address reaches a store meant for several machines.
  StoreServer network_store(0, StoreReach::kNetwork);
  EXPECT_TRUE(connects(outside, network_store.port())) << "not reached through " << outside;
}

// Another process on the machine that connects to the job's store finds none of the job's keys
// where they would be without the secret: they live under ACCELERANT_JOB_SECRET, which only the
// workers are told.
TEST(JobStoreSecurity, TheJobsKeysLiveUnderASecretOnlyTheWorkersKnow) {
  auto seen = accelerant::launch(
      [](int index) {
        auto& state = accelerant::ProcessState::get();  // the rendezvous has written its keys
        const auto& env = state.env();
        std::string report = "secret of " + std::to_string(env.job_secret.size()) + " chars";
        if (index == 0) {
          StoreClient outsider("127.0.0.1", env.master_port, 5s, 5s);
          const std::string key = "accelerant/attempt_0/arrived/1";
          report += outsider.check({key}) ? ", found without the secret" : ", hidden";
          report += outsider.check({env.job_secret + "/" + key}) ? ", found with it" : ", lost";
        }
        state.wait_for_everyone();
        return report;
      },
      accelerant::LaunchOptions()
          .processes_per_node(2)
          .collective_timeout(std::chrono::seconds(30))
          .verbose(false));
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0], "secret of 32 chars, hidden, found with it");
  EXPECT_EQ(seen[1], "secret of 32 chars");
}
