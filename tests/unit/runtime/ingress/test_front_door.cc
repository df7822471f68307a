// The front door with real clients (libmoed_client) in this process; a test
// thread plays the step thread: it takes the queued submits and "serves"
// them by doubling every value (any function of the row would do).
#include "runtime/ingress/front_door.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <thread>

#include "client/client.h"
#include "common/unix_socket.h"
#include "tests/unit/test_support.h"

namespace moed::runtime::ingress {
namespace {

constexpr int kHidden = 16, kLayers = 3;

// Every model layer an MoE layer, or (dense_first) model layer 0 dense and
// model layers 1 .. kLayers the MoE layers 0 .. kLayers - 1.
ModelLayers model_layers(bool dense_first = false) {
  ModelLayers layers;
  if (dense_first) layers.batch_of.push_back(-1), layers.dense = "model layer 0 is dense";
  for (int l = 0; l < kLayers; ++l) layers.batch_of.push_back(l);
  return layers;
}

class FrontDoorTest : public ::testing::Test {
 protected:
  void TearDown() override { stop_stepping(); }

  FrontDoor& start(Limits limits = {}, ModelLayers layers = model_layers()) {
    limits.max_wait = std::chrono::microseconds(0);
    door_ = std::make_unique<FrontDoor>(dir(), 0, 1, kHidden, std::move(layers), limits);
    return *door_;
  }
  std::string dir() const { return tmp_.file("sock"); }
  std::string path() const { return FrontDoor::socket_path(dir(), 0); }

  // One step: take, double every row, complete. Returns rows served per layer.
  std::vector<std::size_t> step() {
    door_->wait_for_work(std::chrono::microseconds(2000));
    door_->take(batches_);
    std::vector<std::size_t> rows;
    for (auto& b : batches_) {
      rows.push_back(b.rows());
      for (float& v : b.x) v *= 2;
    }
    door_->complete(batches_);
    return rows;
  }
  void keep_stepping() {
    stepping_ = true;
    stepper_ = std::thread([this] {
      while (stepping_) step();
    });
  }
  void stop_stepping() {
    stepping_ = false;
    if (stepper_.joinable()) stepper_.join();
  }

  // Waits for the door to have queued `n` submits since it started.
  bool door_queued(std::uint64_t n) const {
    return test::wait_until([&] { return door_->counters().submits_queued >= n; },
                            "the front door to have queued " + std::to_string(n) + " submits");
  }
  // Waits for the door to have dropped every client that went.
  bool door_has_no_clients() const {
    return test::wait_until([&] { return door_->counters().clients == 0; }, "the front door to hold no client");
  }

  static client::Options asking(std::uint32_t slots, std::uint32_t max_rows) {
    client::Options o;
    o.slots = slots, o.max_rows = max_rows, o.timeout_ms = 10'000;
    return o;
  }
  static client::Options reconnecting_within(int ms) {
    client::Options o;
    o.reconnect_ms = ms;
    return o;
  }
  // Acquires a slot, writes one row of ones and submits it at layer 0.
  static int submit_one(client::Client& c) {
    const int s = c.acquire();
    std::fill_n(static_cast<float*>(c.rows(s)), kHidden, 1.0f);
    c.submit(s, 0, 1);
    return s;
  }

  static std::vector<float> rows(std::size_t n, float first) {
    std::vector<float> x(n * kHidden);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = first + float(i);
    return x;
  }

  test::TempDir tmp_;
  std::unique_ptr<FrontDoor> door_;
  std::vector<LayerBatch> batches_;
  std::atomic<bool> stepping_{false};
  std::thread stepper_;
};

TEST_F(FrontDoorTest, ServesRowsThroughSharedMemory) {
  start();
  keep_stepping();
  client::Client c(path());
  EXPECT_EQ(c.hidden(), kHidden);
  EXPECT_EQ(c.layers(), kLayers);
  const std::vector<float> x = rows(5, 1.0f);
  std::vector<float> y(x.size());
  const std::vector<std::uint64_t> ids{1, 1, 2, 2, 3};
  const std::vector<std::uint32_t> pos{0, 1, 0, 1, 0};
  c.forward(2, x.data(), 5, ids.data(), pos.data(), y.data());
  for (std::size_t i = 0; i < x.size(); ++i) ASSERT_EQ(y[i], 2 * x[i]);
  EXPECT_EQ(door_->counters().submits_served, 1u);
  EXPECT_EQ(door_->counters().rows_served, 5u);
}

TEST_F(FrontDoorTest, TheStepSeesIdsPositionsAndLayers) {
  start();
  client::Client c(path());
  for (int layer : {0, 2}) {
    const int s = c.acquire();
    std::memcpy(c.rows(s), rows(2, float(layer)).data(), 2 * kHidden * sizeof(float));
    c.request_ids(s)[0] = 40 + layer, c.request_ids(s)[1] = 50;
    c.positions(s)[0] = 7, c.positions(s)[1] = 8;
    c.submit(s, layer, 2);
  }
  // Both submits are queued before the step takes them: one step serves both layers.
  ASSERT_TRUE(door_queued(2));
  door_->take(batches_);
  ASSERT_EQ(batches_[0].rows(), 2u);
  ASSERT_EQ(batches_[2].rows(), 2u);
  EXPECT_EQ(batches_[2].request_ids, (std::vector<std::uint64_t>{42, 50}));
  EXPECT_EQ(batches_[2].positions, (std::vector<std::uint32_t>{7, 8}));
  door_->complete(batches_);
  c.wait(0);
  c.wait(1);
}

// Clients send the model's own layer numbers: a dense layer is refused, saying
// so, and an MoE layer's rows reach the step as its MoE layer.
TEST_F(FrontDoorTest, ClientsSendModelLayerNumbers) {
  start({}, model_layers(true));
  client::Client c(path());
  EXPECT_EQ(c.layers(), kLayers + 1);
  int s = c.acquire();
  std::memcpy(c.rows(s), rows(1, 1.0f).data(), kHidden * sizeof(float));
  c.submit(s, 0, 1);
  try {
    c.wait(s);
    ADD_FAILURE() << "a dense layer was accepted";
  } catch (const client::Error& e) {
    EXPECT_EQ(e.status(), wire::Status::bad_request);
    EXPECT_NE(std::string(e.what()).find("layer 0 is a dense layer (model layer 0 is dense)"), std::string::npos)
        << e.what();
  }
  c.release(s);
  s = c.acquire();
  std::memcpy(c.rows(s), rows(2, 3.0f).data(), 2 * kHidden * sizeof(float));
  c.submit(s, kLayers, 2);  // the last model layer: MoE layer kLayers - 1
  ASSERT_TRUE(door_queued(1));
  door_->take(batches_);
  ASSERT_EQ(batches_.size(), std::size_t(kLayers));
  EXPECT_EQ(batches_[kLayers - 1].rows(), 2u);
  door_->complete(batches_);
  c.wait(s);
}

TEST_F(FrontDoorTest, Bf16RowsComeBackInBf16) {
  start();
  keep_stepping();
  client::Client c(path());
  const int s = c.acquire();
  auto* r = static_cast<std::uint16_t*>(c.rows(s));
  for (int i = 0; i < kHidden; ++i) r[i] = wire::float_to_bf16(1.5f + float(i));
  c.request_ids(s)[0] = 1, c.positions(s)[0] = 0;
  c.submit(s, 0, 1, wire::DType::bf16);
  c.wait(s);
  for (int i = 0; i < kHidden; ++i) EXPECT_EQ(wire::bf16_to_float(r[i]), 2 * (1.5f + float(i)));
}

// Every refusal names what was wrong, and the client can go on.
TEST_F(FrontDoorTest, BadSubmitsAreRefusedWithTheReason) {
  Limits limits;
  limits.max_rows = 8;
  start(limits);
  keep_stepping();
  client::Client c(path(), asking(2, 64));
  EXPECT_EQ(c.max_rows(), 8);  // granted fewer than asked
  auto expect_refusal = [&](int layer, std::uint32_t n, wire::Status status, const char* words) {
    const int s = c.acquire();
    std::fill_n(static_cast<float*>(c.rows(s)), 8 * kHidden, 1.0f);
    c.submit(s, layer, n);
    try {
      c.wait(s);
      ADD_FAILURE() << "accepted layer " << layer << " rows " << n;
    } catch (const client::Error& e) {
      EXPECT_EQ(e.status(), status) << e.what();
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
    c.release(s);
  };
  expect_refusal(kLayers, 1, wire::Status::bad_request, "layer 3 is out of range");
  expect_refusal(-1, 1, wire::Status::bad_request, "out of range");
  expect_refusal(0, 9, wire::Status::bad_request, "9 rows: a submit holds 1 to 8 rows");
  expect_refusal(0, 0, wire::Status::bad_request, "0 rows");
  // NaN or Inf: the submit fails; the same client's next submit is served.
  for (float bad : {std::nanf(""), INFINITY}) {
    const int s = c.acquire();
    std::vector<float> x = rows(3, 0.5f);
    x[kHidden + 4] = bad;
    std::memcpy(c.rows(s), x.data(), x.size() * sizeof(float));
    c.submit(s, 1, 3);
    try {
      c.wait(s);
      ADD_FAILURE() << "a non-finite row was served";
    } catch (const client::Error& e) {
      EXPECT_EQ(e.status(), wire::Status::not_finite);
      EXPECT_NE(std::string(e.what()).find("row 1"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("column 4"), std::string::npos) << e.what();
    }
    c.release(s);
  }
  std::vector<float> x = rows(2, 3.0f), y(x.size());
  const std::uint64_t ids[2] = {0, 0};
  const std::uint32_t pos[2] = {0, 1};
  c.forward(0, x.data(), 2, ids, pos, y.data());
  EXPECT_EQ(y[5], 2 * x[5]);
  EXPECT_GE(door_->counters().refused, 6u);
}

TEST_F(FrontDoorTest, TheClientLibraryKeepsOneSubmitPerSlot) {
  start();  // nobody steps: the first submit stays queued
  client::Client c(path());
  const int s = c.acquire();
  std::fill_n(static_cast<float*>(c.rows(s)), kHidden, 1.0f);
  c.submit(s, 0, 1);
  EXPECT_THROW(c.submit(s, 0, 1), client::Error);
  EXPECT_THROW(c.release(s), client::Error);
}

TEST_F(FrontDoorTest, TheDaemonRefusesASlotAlreadyInFlight) {
  start();
  // A hand-made client that ignores the rules: hello, then two submits on slot 0.
  UniqueFd fd = connect_unix_socket(path());
  auto send = [&](const std::vector<std::byte>& f) { ASSERT_EQ(::send(fd.get(), f.data(), f.size(), 0), ssize_t(f.size())); };
  send(wire::encode(wire::Hello{1, 4}));
  send(wire::encode(wire::Submit{1, 0, 0, 1, wire::DType::f32}));
  send(wire::encode(wire::Submit{2, 0, 0, 1, wire::DType::f32}));
  wire::FrameReader reader;
  std::string error;
  std::optional<wire::ErrorReply> busy;
  for (int i = 0; i < 100 && !busy; ++i) {
    std::byte buf[4096];
    const ssize_t n = ::recv(fd.get(), buf, sizeof buf, 0);
    ASSERT_GT(n, 0);
    reader.feed({buf, std::size_t(n)});
    while (auto f = reader.next(error))
      if (f->type == wire::Type::error) busy = wire::decode_error(f->payload, error);
  }
  ASSERT_TRUE(busy);
  EXPECT_EQ(busy->status, wire::Status::busy);
  EXPECT_EQ(busy->tag, 2u);
}

TEST_F(FrontDoorTest, GarbageEndsOnlyThatConnection) {
  start();
  keep_stepping();
  UniqueFd fd = connect_unix_socket(path());
  const char junk[] = "GET / HTTP/1.1\r\n\r\n";
  ASSERT_GT(::send(fd.get(), junk, sizeof junk, 0), 0);
  std::byte buf[4096];
  ssize_t total = 0, n;
  while ((n = ::recv(fd.get(), buf + total, sizeof buf - std::size_t(total), 0)) > 0) total += n;
  wire::FrameReader reader;
  reader.feed({buf, std::size_t(total)});
  std::string error;
  auto f = reader.next(error);
  ASSERT_TRUE(f) << error;
  auto reply = wire::decode_error(f->payload, error);
  ASSERT_TRUE(reply);
  EXPECT_EQ(reply->status, wire::Status::bad_request);
  EXPECT_NE(reply->message.find("bad magic"), std::string::npos) << reply->message;
  // Others are served as ever.
  client::Client c(path());
  std::vector<float> x = rows(1, 1.0f), y(kHidden);
  const std::uint64_t id = 0;
  const std::uint32_t pos = 0;
  c.forward(0, x.data(), 1, &id, &pos, y.data());
  EXPECT_EQ(y[3], 2 * x[3]);
}

TEST_F(FrontDoorTest, ClientsBeyondTheLimitAreToldSo) {
  Limits limits;
  limits.max_clients = 2;
  start(limits);
  client::Client a(path()), b(path());
  try {
    client::Client c(path());
    ADD_FAILURE() << "a third client was accepted";
  } catch (const client::Error& e) {
    EXPECT_EQ(e.status(), wire::Status::too_many_clients);
    EXPECT_NE(std::string(e.what()).find("at most 2 clients"), std::string::npos) << e.what();
  }
}

TEST_F(FrontDoorTest, ADisconnectMidRequestLeaksNothing) {
  start();
  const auto fds_before = std::distance(std::filesystem::directory_iterator("/proc/self/fd"), {});
  {
    client::Client c(path());
    const int s = c.acquire();
    std::fill_n(static_cast<float*>(c.rows(s)), 4 * kHidden, 1.0f);
    c.submit(s, 1, 4);
    // Gone before its answer, with the submit still queued.
  }
  ASSERT_TRUE(door_has_no_clients());
  EXPECT_EQ(door_->counters().clients, 0u);
  // A step takes nothing of it, and the next client is served.
  EXPECT_EQ(step(), (std::vector<std::size_t>{0, 0, 0}));
  {
    client::Client c(path());
    const int s = c.acquire();
    std::fill_n(static_cast<float*>(c.rows(s)), kHidden, 1.0f);
    const std::uint64_t queued_before = door_->counters().submits_queued;
    c.submit(s, 0, 1);
    // Taken into a step, then the client dies before the answer.
    ASSERT_TRUE(door_queued(queued_before + 1));
    EXPECT_EQ(step(), (std::vector<std::size_t>{1, 0, 0}));
  }
  ASSERT_TRUE(door_has_no_clients());
  step();
  EXPECT_EQ(door_->counters().clients, 0u);
  const auto fds_after = std::distance(std::filesystem::directory_iterator("/proc/self/fd"), {});
  EXPECT_EQ(fds_after, fds_before) << "file descriptors leaked";
}

TEST_F(FrontDoorTest, AFloodingClientDoesNotStarveAnother) {
  Limits limits;
  limits.max_tokens_per_step = 32;
  start(limits);
  client::Client flood(path(), asking(8, 32)), calm(path());
  for (int s = 0; s < 8; ++s) {
    ASSERT_EQ(flood.acquire(), s);
    std::fill_n(static_cast<float*>(flood.rows(s)), 32 * kHidden, 1.0f);
    flood.submit(s, 0, 32);  // each fills a whole step's budget
  }
  const int s = calm.acquire();
  std::fill_n(static_cast<float*>(calm.rows(s)), kHidden, 1.0f);
  calm.submit(s, 0, 1);
  ASSERT_TRUE(door_queued(9));  // all queued
  // The flood has 8 steps of work queued; the calm client is served within 2.
  step();
  step();
  calm.wait(s, 0);
}

// reconnect_ms = 0: a client fails at once when its daemon goes, as it always did.
TEST_F(FrontDoorTest, ShuttingDownAnswersWhatIsQueued) {
  start();
  client::Client c(path(), reconnecting_within(0));
  const int s = submit_one(c);
  ASSERT_TRUE(door_queued(1));
  door_.reset();
  try {
    c.wait(s, 5000);
    ADD_FAILURE() << "served after shutdown";
  } catch (const client::Error& e) {
    EXPECT_EQ(e.status(), wire::Status::shutting_down) << e.what();
  }
  EXPECT_EQ(c.reconnects(), 0u);
}

TEST_F(FrontDoorTest, WithoutReconnectALostConnectionFailsAtOnce) {
  start();
  client::Client c(path(), reconnecting_within(0));
  door_.reset();
  start();  // a new daemon on the same path is not looked for
  keep_stepping();
  try {
    c.wait(submit_one(c), 5000);
    ADD_FAILURE() << "served over a lost connection";
  } catch (const client::Error& e) {
    EXPECT_NE(std::string(e.what()).find("connection"), std::string::npos) << e.what();
  }
  EXPECT_EQ(c.reconnects(), 0u);
}

// The daemon goes away with a client's micro-batches in every state and
// comes back on the same socket (what `moed-mpirun --restart` does): the
// client's waits return the right outputs, late, with nothing lost.
TEST_F(FrontDoorTest, AClientReconnectsAndSubmitsAgainWhatWasInFlight) {
  start();
  client::Client c(path(), reconnecting_within(10'000));
  auto fill = [&](int slot, const std::vector<float>& x, std::uint64_t id) {
    std::memcpy(c.rows(slot), x.data(), x.size() * sizeof(float));
    for (std::size_t r = 0; r < x.size() / kHidden; ++r) c.request_ids(slot)[r] = id, c.positions(slot)[r] = std::uint32_t(r);
  };
  // Answered before the loss; the client has not read the answer yet.
  const std::vector<float> xa = rows(2, 1.0f);
  const int a = c.acquire();
  fill(a, xa, 1);
  c.submit(a, 0, 2);
  ASSERT_TRUE(door_queued(1));
  ASSERT_EQ(step()[0], 2u);
  // Taken into a step whose outputs were half written over the rows when the
  // daemon died, unanswered.
  const std::vector<float> xb = rows(3, 100.0f);
  const int b = c.acquire();
  fill(b, xb, 2);
  c.submit(b, 1, 3);
  ASSERT_TRUE(door_queued(2));
  door_->take(batches_);
  ASSERT_EQ(batches_.size(), std::size_t(kLayers)) << "the step never took slot b";
  ASSERT_EQ(batches_[1].rows(), 3u) << "the step never took slot b";
  std::fill_n(static_cast<float*>(c.rows(b)), kHidden + 3, -7.0f);
  batches_.clear();
  // Queued, in bf16: the stopping daemon answers it shutting_down.
  const int d = c.acquire();
  auto* bf = static_cast<std::uint16_t*>(c.rows(d));
  for (int i = 0; i < kHidden; ++i) bf[i] = wire::float_to_bf16(0.25f * float(i));
  c.request_ids(d)[0] = 3, c.positions(d)[0] = 0;
  c.submit(d, 2, 1, wire::DType::bf16);
  ASSERT_TRUE(door_queued(3));
  // Acquired and half filled.
  const std::vector<float> xe = rows(2, -3.0f);
  const int e = c.acquire();
  fill(e, xe, 4);
  const void* rows_before = c.rows(e);

  door_.reset();
  std::thread restart([&] {
    // Down a while (a downtime, not a wait: the client finds no socket, or
    // the new one, and reconnects once either way).
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
    start();
    keep_stepping();
  });
  c.wait(b);
  c.wait(d);
  c.wait(a);
  restart.join();

  EXPECT_EQ(c.reconnects(), 1u);
  const auto* ya = static_cast<const float*>(c.rows(a));
  const auto* yb = static_cast<const float*>(c.rows(b));
  for (std::size_t i = 0; i < xa.size(); ++i) ASSERT_EQ(ya[i], 2 * xa[i]) << i;
  for (std::size_t i = 0; i < xb.size(); ++i) ASSERT_EQ(yb[i], 2 * xb[i]) << i;
  bf = static_cast<std::uint16_t*>(c.rows(d));
  for (int i = 0; i < kHidden; ++i) ASSERT_EQ(wire::bf16_to_float(bf[i]), 0.5f * float(i)) << i;
  // The slot being filled kept its rows, ids and positions, at the same
  // address (the daemon granted the same slots again).
  EXPECT_EQ(c.rows(e), rows_before);
  EXPECT_EQ(std::memcmp(c.rows(e), xe.data(), xe.size() * sizeof(float)), 0);
  EXPECT_EQ(c.request_ids(e)[1], 4u);
  EXPECT_EQ(c.positions(e)[1], 1u);
  c.submit(e, 0, 2);
  c.wait(e);
  EXPECT_EQ(static_cast<const float*>(c.rows(e))[kHidden + 1], 2 * xe[kHidden + 1]);
  EXPECT_EQ(door_->counters().submits_served, 3u);  // b, d and e: a was not served twice
}

TEST_F(FrontDoorTest, AClientGivesUpAfterReconnectMs) {
  start();
  client::Client c(path(), reconnecting_within(300));
  const int s = c.acquire();
  const std::vector<float> x = rows(1, 2.0f);
  std::memcpy(c.rows(s), x.data(), x.size() * sizeof(float));
  c.submit(s, 0, 1);
  ASSERT_TRUE(door_queued(1));
  door_.reset();  // and nobody brings it back
  const auto t0 = std::chrono::steady_clock::now();
  try {
    c.wait(s, 60'000);  // far beyond reconnect_ms: giving up must be reconnect_ms's doing
    ADD_FAILURE() << "served with no daemon";
  } catch (const client::Error& e) {
    const std::string what = e.what();
    EXPECT_EQ(e.status(), wire::Status::shutting_down) << what;
    for (const char* words : {"could not connect again", "reconnect_ms 300", "No such file or directory", "errno 2"})
      EXPECT_NE(what.find(words), std::string::npos) << what;
  }
  const auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_GE(took, std::chrono::milliseconds(300));
  EXPECT_LT(took, std::chrono::seconds(10));
  EXPECT_EQ(c.reconnects(), 0u);
  // The slot holds its rows again, ready to be submitted or released.
  EXPECT_EQ(std::memcmp(c.rows(s), x.data(), x.size() * sizeof(float)), 0);
  c.release(s);
}

// A daemon that comes back and goes again before answering does not
// stretch the client's reconnect_ms: it counts from the first loss.
TEST_F(FrontDoorTest, ADaemonThatKeepsFallingDoesNotStretchReconnectMs) {
  start();
  client::Client c(path(), reconnecting_within(400));
  const int s = submit_one(c);
  std::atomic<bool> cycling{true};
  std::thread flapping([&] {
    while (cycling) {
      // Up until the client's submit is queued (the first, then each resubmit
      // after a reconnect), or the client has given up.
      while (cycling && door_->counters().submits_queued == 0)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      door_.reset();  // answers the resubmit shutting_down
      std::this_thread::sleep_for(std::chrono::milliseconds(20));  // down a while: a downtime, not a wait
      if (cycling) start();
    }
  });
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_THROW(c.wait(s, 60'000), client::Error);  // a stretched reconnect_ms would run to this timeout
  const auto took = std::chrono::steady_clock::now() - t0;
  cycling = false;
  flapping.join();
  EXPECT_LT(took, std::chrono::seconds(10));
  EXPECT_GE(c.reconnects(), 1u);
}

// A daemon that comes back granting less fails only the submits that no
// longer fit, with a message that says so.
TEST_F(FrontDoorTest, AReconnectGrantingLessFailsWhatNoLongerFits) {
  Limits before;
  before.max_slots = 4, before.max_rows = 8;
  start(before);
  client::Options options;
  options.slots = 4, options.max_rows = 8, options.reconnect_ms = 10'000;
  client::Client c(path(), options);
  const std::vector<float> x = rows(8, 1.0f);
  for (int s = 0; s < 4; ++s) ASSERT_EQ(c.acquire(), s);
  for (int s : {0, 1, 3}) std::memcpy(c.rows(s), x.data(), x.size() * sizeof(float));
  c.submit(0, 0, 2);
  c.submit(1, 0, 6);  // more rows than the new grant
  c.submit(3, 0, 1);  // a slot the new grant lacks
  ASSERT_TRUE(door_queued(3));
  door_.reset();
  Limits after;
  after.max_slots = 2, after.max_rows = 4;
  start(after);
  keep_stepping();
  c.wait(0);
  EXPECT_EQ(static_cast<const float*>(c.rows(0))[kHidden + 5], 2 * x[kHidden + 5]);
  for (int s : {1, 3}) {
    try {
      c.wait(s);
      ADD_FAILURE() << "slot " << s << " was served";
    } catch (const client::Error& e) {
      EXPECT_NE(std::string(e.what()).find("came back granting 2 slots of 4 rows"), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(c.slots(), 2);
  EXPECT_EQ(c.max_rows(), 4);
  EXPECT_THROW(c.rows(3), client::Error);
  c.release(1), c.release(3);
  EXPECT_EQ(c.acquire(), 1);
  EXPECT_THROW(c.acquire(), client::Error);  // slot 3 is gone
}

TEST_F(FrontDoorTest, AClientOfAnotherUidIsForbidden) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to connect as another uid";
  start();
  ASSERT_EQ(::chmod(tmp_.path().c_str(), 0755), 0);
  ASSERT_EQ(::chmod(dir().c_str(), 0711), 0);
  ASSERT_EQ(::chmod(path().c_str(), 0666), 0);  // only the uid check stands in the way
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(10);
    try {
      client::Client c(path());
      ::_exit(11);  // accepted
    } catch (const client::Error& e) {
      ::_exit(e.status() == wire::Status::forbidden ? 0 : 12);
    }
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_EQ(WEXITSTATUS(status), 0) << "10: setuid failed, 11: accepted, 12: another error";
}

TEST_F(FrontDoorTest, ABadDirIsAUsageError) {
  const std::string file = tmp_.write("a-file", "x");
  test::expect_error([&] { FrontDoor(file + "/sub", 0, 1, kHidden, model_layers(), Limits{}); }, ErrorKind::Usage,
                     {"[ingress].dir"});
}

}  // namespace
}  // namespace moed::runtime::ingress
