// The front door's network side with real clients (libmoed_client) over
// UCX on loopback, in this process; a test thread plays the step thread and
// "serves" each row as 2 x + (its request id mod 7) + its position, so that
// ids and positions that crossed wrong show in the outputs.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "client/auth.h"
#include "client/client.h"
#include "client/ucx_am.h"
#include "runtime/ingress/front_door.h"
#include "tests/unit/raw_peer.h"
#include "tests/unit/test_support.h"

namespace moed::runtime::ingress {
namespace {

constexpr int kHidden = 512, kLayers = 2;

float served(float x, std::uint64_t id, std::uint32_t position) { return 2 * x + float(id % 7) + float(position); }

class NetworkDoorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    key_file_ = write_key("key", 'k');
    other_key_file_ = write_key("other", 'o');
  }
  void TearDown() override {
    for (std::size_t i = 0; i < doors_.size(); ++i) stop_door(i);
  }

  std::string write_key(const std::string& name, char fill) {
    const std::string path = tmp_.file(name);
    std::ofstream(path) << std::string(32, fill);
    ::chmod(path.c_str(), 0600);
    return path;
  }

  // A door (rank `doors_.size()`) with a thread of its own playing its step thread.
  FrontDoor& start(NetworkOptions network = {}) {
    if (network.listen.empty()) network.listen = {"127.0.0.1:0"};
    network.key = wire::read_key_file(key_file_);
    Limits limits;
    limits.max_wait = std::chrono::microseconds(0);
    ModelLayers layers;
    for (int l = 0; l < kLayers; ++l) layers.batch_of.push_back(l);
    const int rank = int(doors_.size());
    auto door = std::make_unique<FrontDoor>(tmp_.file("sock" + std::to_string(rank)), rank, 2, kHidden,
                                            std::move(layers), limits, network);
    auto& stepping = *stepping_.emplace_back(std::make_unique<std::atomic<bool>>(true));
    FrontDoor* d = door.get();
    steppers_.emplace_back([d, &stepping] {
      std::vector<LayerBatch> batches;
      while (stepping) {
        d->wait_for_work(std::chrono::microseconds(2000));
        d->take(batches);
        for (LayerBatch& b : batches)
          for (std::size_t r = 0; r < b.rows(); ++r)
            for (std::size_t c = 0; c < std::size_t(kHidden); ++c) {
              float& v = b.x[r * kHidden + c];
              v = served(v, b.request_ids[r], b.positions[r]);
            }
        d->complete(batches);
      }
    });
    doors_.push_back(std::move(door));
    if (!door_) door_ = doors_.front().get();
    return *doors_.back();
  }
  void stop_stepping(std::size_t i) {
    *stepping_[i] = false;
    if (steppers_[i].joinable()) steppers_[i].join();
  }
  void stop_door(std::size_t i) {
    stop_stepping(i);
    doors_[i].reset();
  }

  std::string address() const { return door_->network_addresses().at(0); }
  client::Options options(const std::string& key_file) const {
    client::Options o;
    o.key_file = key_file;
    o.timeout_ms = 30'000;
    o.reconnect_ms = 0;
    return o;
  }

  struct Rows {
    std::vector<float> x;
    std::vector<std::uint64_t> ids;
    std::vector<std::uint32_t> positions;
  };
  static Rows rows(std::size_t n) {
    Rows r;
    for (std::size_t i = 0; i < n * kHidden; ++i) r.x.push_back(float(i % 1000) * 0.25f - 3);
    for (std::size_t i = 0; i < n; ++i) r.ids.push_back(1000 + i * 3), r.positions.push_back(std::uint32_t(i % 11));
    return r;
  }
  static std::vector<float> forward(client::Client& c, int layer, const Rows& r) {
    std::vector<float> y(r.x.size());
    c.forward(layer, r.x.data(), r.ids.size(), r.ids.data(), r.positions.data(), y.data());
    return y;
  }

  test::TempDir tmp_;
  std::string key_file_, other_key_file_;
  std::vector<std::unique_ptr<FrontDoor>> doors_;
  FrontDoor* door_ = nullptr;  // the first
  std::vector<std::unique_ptr<std::atomic<bool>>> stepping_;
  std::vector<std::thread> steppers_;
};

TEST_F(NetworkDoorTest, ANetworkClientGetsTheBitsOfAClientOnTheHost) {
  start();
  EXPECT_EQ(address().rfind("ucx://127.0.0.1:", 0), 0u) << address();
  std::ifstream listed(FrontDoor::network_file(tmp_.file("sock0"), 0));
  std::string line;
  std::getline(listed, line);
  EXPECT_EQ(line, address());
  client::Client net(address(), options(key_file_));
  client::Client local(door_->path());
  EXPECT_EQ(net.hidden(), kHidden);
  EXPECT_EQ(net.layers(), kLayers);
  // 1 row (eager), and more rows than a submit holds (rendezvous, split by forward()).
  for (std::size_t n : {std::size_t(1), std::size_t(net.max_rows()) + 44}) {
    const Rows r = rows(n);
    const std::vector<float> a = forward(net, 1, r), b = forward(local, 1, r);
    ASSERT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << n << " rows";
    for (std::size_t i = 0; i < n; ++i)
      ASSERT_EQ(a[i * kHidden + 5], served(r.x[i * kHidden + 5], r.ids[i], r.positions[i])) << "row " << i;
  }
  EXPECT_EQ(door_->network_counters().logged_in, 1u);
  EXPECT_EQ(door_->counters().clients, 2u);
}

TEST_F(NetworkDoorTest, Bf16RowsAndSeveralSlotsInFlight) {
  start();
  client::Client c(address(), options(key_file_));
  const Rows r = rows(8);
  std::vector<int> slots;
  for (int k = 0; k < c.slots(); ++k) {
    const int s = c.acquire();
    auto* out = static_cast<std::uint16_t*>(c.rows(s));
    for (std::size_t i = 0; i < r.x.size(); ++i) out[i] = wire::float_to_bf16(r.x[i] + float(k));
    std::memcpy(c.request_ids(s), r.ids.data(), 8 * sizeof(std::uint64_t));
    std::memcpy(c.positions(s), r.positions.data(), 8 * sizeof(std::uint32_t));
    c.submit(s, 0, 8, wire::DType::bf16);
    slots.push_back(s);
  }
  for (int k = 0; k < int(slots.size()); ++k) {
    c.wait(slots[std::size_t(k)]);
    const auto* y = static_cast<const std::uint16_t*>(c.rows(slots[std::size_t(k)]));
    for (std::size_t i = 0; i < 8; ++i) {
      const float x = wire::bf16_to_float(wire::float_to_bf16(r.x[i * kHidden] + float(k)));
      ASSERT_EQ(y[i * kHidden], wire::float_to_bf16(served(x, r.ids[i], r.positions[i]))) << "slot " << k << " row " << i;
    }
    c.release(slots[std::size_t(k)]);
  }
}

TEST_F(NetworkDoorTest, AWrongKeyGetsNothingAndOthersAreServed) {
  start();
  client::Client good(address(), options(key_file_));
  try {
    client::Client bad(address(), options(other_key_file_));
    FAIL() << "a client with another key was let in";
  } catch (const client::Error& e) {
    EXPECT_EQ(e.status(), wire::Status::forbidden);
    EXPECT_NE(std::string(e.what()).find("does not hold the cluster's key"), std::string::npos) << e.what();
  }
  EXPECT_EQ(door_->network_counters().auth_failures, 1u);
  EXPECT_EQ(door_->network_counters().logged_in, 1u);
  const Rows r = rows(3);
  const std::vector<float> y = forward(good, 0, r);
  EXPECT_EQ(y[0], served(r.x[0], r.ids[0], r.positions[0]));
  EXPECT_TRUE(test::wait_until([&] { return door_->network_counters().endpoints == 1; },
                               "the refused client's endpoint to be closed"));
}

TEST_F(NetworkDoorTest, NoKeyFileOrAnOpenOneIsRefusedBeforeConnecting) {
  start();
  try {
    client::Client c(address(), options(""));
    FAIL() << "connected without a key";
  } catch (const client::Error& e) {
    EXPECT_NE(std::string(e.what()).find("key_file"), std::string::npos) << e.what();
  }
  ::chmod(key_file_.c_str(), 0644);
  try {
    client::Client c(address(), options(key_file_));
    FAIL() << "read a key others may read";
  } catch (const client::Error& e) {
    EXPECT_NE(std::string(e.what()).find("mode 0644"), std::string::npos) << e.what();
  }
  EXPECT_EQ(door_->network_counters().connections, 0u);
}

using test::RawPeer;

wire::Nonce challenge_of(RawPeer& p) {
  std::string error;
  auto f = p.next();
  EXPECT_TRUE(f && f->type == wire::Type::challenge);
  return wire::decode_challenge(f->payload, error).value().nonce;
}

TEST_F(NetworkDoorTest, AReplayedLoginIsRefused) {
  start();
  const wire::Key key = wire::read_key_file(key_file_);
  wire::Login login;
  login.hello = {2, 16};
  login.client_nonce = wire::make_nonce();
  std::vector<std::byte> recorded;
  {
    RawPeer first(address());
    login.proof = wire::client_proof(key, challenge_of(first), login.client_nonce, login.hello);
    recorded = wire::encode(login);
    first.send(recorded);
    auto accepted = first.next();
    ASSERT_TRUE(accepted && accepted->type == wire::Type::accepted);
  }
  RawPeer replay(address());
  challenge_of(replay);  // a fresh nonce: the recorded proof answers another
  replay.send(recorded);
  auto answer = replay.next();
  ASSERT_TRUE(answer && answer->type == wire::Type::error);
  std::string error;
  EXPECT_EQ(wire::decode_error(answer->payload, error)->status, wire::Status::forbidden);
  EXPECT_EQ(door_->network_counters().auth_failures, 1u);
  EXPECT_EQ(door_->network_counters().logged_in, 1u);
}

TEST_F(NetworkDoorTest, StalledAndFloodingHandshakesAreCutOffWhileServingGoesOn) {
  NetworkOptions network;
  network.handshake_timeout = std::chrono::milliseconds(300);
  network.max_handshakes = 3;
  network.max_handshakes_per_peer = 3;
  start(network);
  client::Client good(address(), options(key_file_));
  std::vector<std::unique_ptr<RawPeer>> stalling;
  for (int i = 0; i < 6; ++i) stalling.push_back(std::make_unique<RawPeer>(address()));
  for (auto& p : stalling) p->next();  // a challenge, or the rejection
  EXPECT_TRUE(test::wait_until([&] { return door_->network_counters().handshakes_refused >= 3; },
                               "three of six handshakes to be refused"));
  const Rows r = rows(2);
  EXPECT_EQ(forward(good, 0, r)[0], served(r.x[0], r.ids[0], r.positions[0]));  // served meanwhile
  EXPECT_TRUE(test::wait_until([&] { return door_->network_counters().handshake_timeouts == 3; },
                               "the three stalled handshakes to time out"));
  EXPECT_EQ(door_->network_counters().handshakes_refused, 3u);
  client::Client later(address(), options(key_file_));  // room again
  EXPECT_EQ(forward(later, 1, r)[0], served(r.x[0], r.ids[0], r.positions[0]));
}

TEST_F(NetworkDoorTest, ASilentClientIsLetGoAndAnIdleOneComesBack) {
  NetworkOptions network;
  network.ping_interval = std::chrono::milliseconds(100);
  network.silence_timeout = std::chrono::milliseconds(200);
  start(network);
  {
    // Logged in, then never runs again: it answers no ping.
    const wire::Key key = wire::read_key_file(key_file_);
    RawPeer mute(address());
    wire::Login login;
    login.hello = {1, 16};
    login.client_nonce = wire::make_nonce();
    login.proof = wire::client_proof(key, challenge_of(mute), login.client_nonce, login.hello);
    mute.send(wire::encode(login));
    ASSERT_EQ(mute.next()->type, wire::Type::accepted);
    EXPECT_TRUE(test::wait_until([&] { return door_->network_counters().silences == 1; },
                                 "the silent client to be let go"));
    EXPECT_TRUE(test::wait_until([&] { return door_->counters().clients == 0; }, "its session to be dropped"));
  }
  // A client that makes no call for longer is let go too, and connects
  // again at its next call, unnoticed but for the count.
  client::Options o = options(key_file_);
  o.reconnect_ms = 10'000;
  client::Client idle(address(), o);
  const Rows r = rows(3);
  EXPECT_EQ(forward(idle, 0, r)[0], served(r.x[0], r.ids[0], r.positions[0]));
  EXPECT_TRUE(test::wait_until([&] { return door_->network_counters().silences == 2; }, "the idle client to be let go"));
  EXPECT_EQ(forward(idle, 1, r)[kHidden], served(r.x[kHidden], r.ids[1], r.positions[1]));
  EXPECT_EQ(idle.reconnects(), 1u);
}

int open_fds() {
  int n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) ++n;
  return n;
}

TEST_F(NetworkDoorTest, ClientsLeaveNothingBehind) {
  start();
  const Rows r = rows(300);
  auto one_client = [&] {
    client::Client c(address(), options(key_file_));
    forward(c, 0, r);
  };
  one_client();  // UCX's first use in this process opens what it keeps
  ASSERT_TRUE(test::wait_until([&] { return door_->counters().clients == 0; }, "the first client to be dropped"));
  const int fds = open_fds();
  for (int i = 0; i < 3; ++i) one_client();
  EXPECT_TRUE(test::wait_until(
      [&] {
        const NetworkCounters n = door_->network_counters();
        return door_->counters().clients == 0 && n.endpoints == 0 && n.outstanding == 0;
      },
      "every client's endpoint, operations and session to be gone"));
  EXPECT_EQ(open_fds(), fds);
  EXPECT_EQ(door_->network_counters().logged_in, 4u);
}

TEST_F(NetworkDoorTest, SeveralHomesShareTheWorkAndTheBits) {
  for (client::Spread spread : {client::Spread::round_robin, client::Spread::least_loaded}) {
    for (std::size_t i = 0; i < steppers_.size(); ++i) stop_stepping(i);
    doors_.clear(), door_ = nullptr;
    steppers_.clear(), stepping_.clear();
    FrontDoor& a = start();
    FrontDoor& b = start();
    client::Options o = options(key_file_);
    o.spread = spread;
    client::Client c({a.network_addresses().at(0), b.network_addresses().at(0)}, o);
    const Rows r = rows(std::size_t(c.max_rows()) * 3 + 5);
    const std::vector<float> y = forward(c, 1, r);
    for (std::size_t i = 0; i < r.ids.size(); ++i)
      ASSERT_EQ(y[i * kHidden + 7], served(r.x[i * kHidden + 7], r.ids[i], r.positions[i])) << "row " << i;
    // Slots in flight at once spread over both.
    std::vector<int> slots;
    for (int k = 0; k < c.slots(); ++k) {
      const int s = c.acquire();
      std::memcpy(c.rows(s), r.x.data(), kHidden * sizeof(float));
      c.request_ids(s)[0] = 5, c.positions(s)[0] = 1;
      c.submit(s, 0, 1);
      slots.push_back(s);
    }
    for (int s : slots) {
      c.wait(s);
      EXPECT_EQ(static_cast<const float*>(c.rows(s))[0], served(r.x[0], 5, 1));
      c.release(s);
    }
    EXPECT_GT(a.counters().submits_served, 1u) << "spread " << int(spread);
    EXPECT_GT(b.counters().submits_served, 1u) << "spread " << int(spread);
  }
}

TEST_F(NetworkDoorTest, AHomeLostIsFailedOverWithWhatWasInFlight) {
  FrontDoor& a = start();
  FrontDoor& b = start();
  const std::string lost = b.network_addresses().at(0);
  client::Options o = options(key_file_);
  o.reconnect_ms = 20'000;
  client::Client c({a.network_addresses().at(0), lost}, o);
  stop_stepping(1);  // rank 1 takes its submits and never answers: they are in flight there when it goes
  std::vector<int> slots;
  for (int k = 0; k < c.slots(); ++k) {
    const int s = c.acquire();
    std::fill_n(static_cast<float*>(c.rows(s)), kHidden, float(k));
    c.request_ids(s)[0] = std::uint64_t(k), c.positions(s)[0] = 2;
    c.submit(s, 1, 1);
    slots.push_back(s);
  }
  ASSERT_TRUE(test::wait_until([&] { return b.counters().submits_queued >= 1; }, "rank 1 to hold a submit"));
  doors_[1].reset();  // gone: its clients' connections end
  for (int k = 0; k < int(slots.size()); ++k) {
    c.wait(slots[std::size_t(k)]);
    EXPECT_EQ(static_cast<const float*>(c.rows(slots[std::size_t(k)]))[3], served(float(k), std::uint64_t(k), 2))
        << "slot " << k;
    c.release(slots[std::size_t(k)]);
  }
  EXPECT_EQ(c.reconnects(), 1u);
  const Rows r = rows(40);
  EXPECT_EQ(forward(c, 0, r)[kHidden * 39], served(r.x[kHidden * 39], r.ids[39], r.positions[39]));  // served by a alone
}

TEST_F(NetworkDoorTest, SeveralHomesMustAllBeNetworkAddresses) {
  FrontDoor& a = start();
  for (const std::vector<std::string>& homes :
       {std::vector<std::string>{a.path(), a.path()}, std::vector<std::string>{a.network_addresses().at(0), a.path()}}) {
    try {
      client::Client c(homes, options(key_file_));
      FAIL() << "a client with homes that are not all ucx:// addresses";
    } catch (const client::Error& e) {
      EXPECT_NE(std::string(e.what()).find("several homes must all be ucx:// addresses"), std::string::npos) << e.what();
    }
  }
}

TEST_F(NetworkDoorTest, AHomeDownAtFirstIsLeftOut) {
  FrontDoor& a = start();
  FrontDoor& b = start();
  const std::string down = b.network_addresses().at(0);
  stop_door(1);
  client::Client c({down, a.network_addresses().at(0)}, options(key_file_));
  EXPECT_EQ(c.rank(), 0);
  const Rows r = rows(3);
  EXPECT_EQ(forward(c, 0, r)[0], served(r.x[0], r.ids[0], r.positions[0]));
}

}  // namespace
}  // namespace moed::runtime::ingress
