// The UCX backend in one process: three ranks as threads, each with its own
// UCX context and worker, connect over a ThreadBootstrap, run an exchange
// (blocks of 0 bytes, a few bytes and rendezvous size, landing at their
// offsets with the gaps between them untouched) and an RMA window's puts and
// flush, then tear down together. Once with UCX's default transports here
// (shared memory, cma) and once over tcp alone, where a put completes only
// while its target progresses its worker (each thread progresses its own, in
// its waits).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "comm/bootstrap.h"
#include "comm/transport.h"
#include "common/error.h"
#include "tests/unit/comm/run_ranks.h"
#include "tests/unit/comm/ucx_environment.h"

namespace moed::comm {
namespace {

constexpr int kRanks = 3;
constexpr std::size_t kGap = 16;  // untouched bytes before each receive block
constexpr std::byte kPoison{0xAB};

// The byte at `i` of what rank src sends rank dst (a window put, or an
// exchange block): a stream only they make.
std::byte pattern(int src, int dst, std::size_t i) {
  return std::byte((std::size_t(src) * 131 + std::size_t(dst) * 17 + i * 7 + (i >> 9)) & 0xFF);
}

// 0 bytes, a few, or past UCX's rendezvous threshold, by pair.
std::size_t block_bytes(int src, int dst) {
  switch ((src + 2 * dst) % 3) {
    case 0:
      return 0;
    case 1:
      return 37;
    default:
      return 300000 + std::size_t(src) * 1000;
  }
}

void exchange_exact_bytes(Transport& t) {
  const int me = t.rank();
  ExchangeLayout layout;
  for (int peer = 0; peer < kRanks; ++peer) {
    layout.send_bytes.push_back(block_bytes(me, peer));
    layout.recv_bytes.push_back(block_bytes(peer, me));
  }
  layout.send_offsets = ExchangeLayout::prefix_offsets(layout.send_bytes);
  layout.recv_offsets = ExchangeLayout::prefix_offsets(layout.recv_bytes);
  for (int peer = 0; peer < kRanks; ++peer) layout.recv_offsets[peer] += kGap * std::size_t(peer + 1);
  std::vector<std::byte> send(layout.send_total());
  for (int dst = 0; dst < kRanks; ++dst)
    for (std::size_t i = 0; i < layout.send_bytes[dst]; ++i) send[layout.send_offsets[dst] + i] = pattern(me, dst, i);
  std::vector<std::byte> recv(layout.recv_total() + kGap * kRanks, kPoison);

  t.exchange(send.data(), layout, recv.data(), "in-process exchange");

  for (int src = 0; src < kRanks; ++src) {
    const std::byte* block = recv.data() + layout.recv_offsets[src];
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < layout.recv_bytes[src]; ++i) wrong += block[i] != pattern(src, me, i);
    EXPECT_EQ(wrong, 0u) << "rank " << me << ": bytes from rank " << src << " differ";
    for (std::size_t g = 1; g <= kGap; ++g)
      EXPECT_EQ(block[-std::ptrdiff_t(g)], kPoison) << "rank " << me << ": the gap before rank " << src << "'s block";
  }
}

// Every rank puts kRegion bytes at its own offset of every rank's window.
void put_into_every_window(Transport& t) {
  constexpr std::size_t kRegion = 200000;
  const int me = t.rank();
  auto window = t.create_window(kRanks * kRegion, "in-process window");
  ASSERT_EQ(window->bytes(), kRanks * kRegion);
  std::vector<std::vector<std::byte>> sources(kRanks, std::vector<std::byte>(kRegion));  // until the flush
  for (int i = 0; i < kRanks; ++i) {
    const int target = (me + i) % kRanks;  // every rank starts with another target
    for (std::size_t b = 0; b < kRegion; ++b) sources[target][b] = pattern(me, target, b);
    window->put(target, std::size_t(me) * kRegion, sources[target].data(), kRegion);
  }
  window->flush("in-process flush");
  // Every rank's puts have landed once every rank has flushed; this
  // exchange progresses the worker for the ranks still flushing.
  std::uint64_t mine = 1, all[kRanks] = {};
  t.all_gather(&mine, sizeof mine, all, "in-process: every rank has flushed");

  for (int src = 0; src < kRanks; ++src) {
    std::size_t wrong = 0;
    for (std::size_t b = 0; b < kRegion; ++b) wrong += window->local()[src * kRegion + b] != pattern(src, me, b);
    EXPECT_EQ(wrong, 0u) << "rank " << me << ": the region rank " << src << " put differs";
  }
}

void connect_exchange_and_put() {
  test::run_ranks(kRanks, [](Bootstrap& bootstrap) {
    CommConfig config;
    config.backend = comm::Backend::ucx;
    config.timeout_ms = 10000;
    std::unique_ptr<Transport> t = create_transport(config, bootstrap);
    ASSERT_STREQ(t->name(), "ucx");
    ASSERT_EQ(t->rank(), bootstrap.rank());
    exchange_exact_bytes(*t);
    put_into_every_window(*t);
  });
}

TEST(UcxInOneProcess, ConnectsExchangesAndPutsOverTheDefaultTransports) { connect_exchange_and_put(); }

TEST(UcxInOneProcess, ConnectsExchangesAndPutsOverTcpAlone) {
  // tcp on loopback only: other interfaces may come and go on a shared machine.
  test::UcxEnvironment env({{"UCX_TLS", "tcp,self"}, {"UCX_NET_DEVICES", "lo"}});
  connect_exchange_and_put();
}

// A bootstrap that counts the collectives made over it.
class CountingBootstrap final : public Bootstrap {
 public:
  explicit CountingBootstrap(Bootstrap& inner) : inner_(inner) {}
  int calls() const { return calls_; }
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  std::chrono::milliseconds timeout() const override { return inner_.timeout(); }
  std::vector<std::vector<std::byte>> all_gather(std::span<const std::byte> mine, const std::string& what) override {
    ++calls_;
    return inner_.all_gather(mine, what);
  }
  void all_reduce(std::span<std::int64_t> values, Reduction reduction, const std::string& what) override {
    ++calls_;
    inner_.all_reduce(values, reduction, what);
  }
  void barrier(const std::string& what, const Progress& progress) override {
    ++calls_;
    inner_.barrier(what, progress);
  }

 private:
  Bootstrap& inner_;
  int calls_ = 0;
};

// After start-up, serving and migrating never wait on the bootstrap (MPI in
// a job, which would wait forever on a lost rank): exchanges and a window's
// whole life, its teardown's barrier included, run over the endpoints. The
// transport's own teardown, at the job's end, is the one use left.
TEST(UcxInOneProcess, AfterStartUpOnlyTheTeardownUsesTheBootstrap) {
  test::run_ranks(kRanks, [](Bootstrap& threads) {
    CountingBootstrap bootstrap(threads);
    CommConfig config;
    config.backend = comm::Backend::ucx;
    config.timeout_ms = 10000;
    std::unique_ptr<Transport> t = create_transport(config, bootstrap);
    const int at_start = bootstrap.calls();
    EXPECT_GT(at_start, 0) << "the start-up made no collective over the bootstrap";
    exchange_exact_bytes(*t);
    put_into_every_window(*t);  // creates, fills, flushes and frees a window
    put_into_every_window(*t);  // and a second one, in the memory of the first
    EXPECT_EQ(bootstrap.calls(), at_start) << "rank " << t->rank();
    t.reset();
    EXPECT_GT(bootstrap.calls(), at_start) << "the teardown waited for no rank";
  });
}

// Over threads, "auto" takes UCX; the MPI backend says it needs MPI.
TEST(UcxInOneProcess, AutoPicksUcxAndMpiNeedsAnMpiBootstrap) {
  test::run_ranks(2, [](Bootstrap& bootstrap) {
    CommConfig config;
    config.backend = comm::Backend::automatic;
    config.timeout_ms = 10000;
    EXPECT_STREQ(create_transport(config, bootstrap)->name(), "ucx");
    config.backend = comm::Backend::mpi;
    try {
      create_transport(config, bootstrap);
      ADD_FAILURE() << "the mpi backend started without MPI";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::Usage);
      EXPECT_NE(std::string(e.what()).find("runs only over the job's MPI"), std::string::npos) << e.what();
    }
  });
}

}  // namespace
}  // namespace moed::comm
