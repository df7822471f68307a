// The NCCL transport's exchanges (comm/nccl/nccl_transport.h) over lanes
// that follow NCCL's rules in memory (fake_nccl_groups.h), the ranks as
// threads: every layout lands, exactly or within a capacity (whose sizes
// travel first); exchanges opened together launch in the order they were
// opened, whatever order their sends come in; a deadline names the state of
// every lane; an exchange left unfinished stops the transport, and nothing
// lands in its memory afterwards. The CUDA side (nccl_cuda_groups.cc) has
// not run: this host has no GPU.
#include "comm/nccl/nccl_transport.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "common/error.h"
#include "common/rng.h"
#include "tests/unit/comm/fake_nccl_groups.h"
#include "tests/unit/comm/run_ranks.h"

namespace moed::comm {
namespace {

constexpr std::chrono::milliseconds kTimeout{20000};

std::unique_ptr<Transport> nccl_over(test::FakeNcclFabric& fabric, Bootstrap& bootstrap,
                                     std::chrono::milliseconds timeout = kTimeout) {
  return create_nccl_transport_over(bootstrap.rank(), bootstrap.size(), timeout, fabric.groups(bootstrap.rank()),
                                    nullptr);
}

// The byte at `i` of the block from `src` to `dst` in exchange `x`.
std::byte pattern(int x, int src, int dst, std::size_t i) {
  return std::byte((std::size_t(x * 131 + src * 31 + dst * 7) + i) & 255);
}

// Block sizes by (exchange, source, destination): some empty, some large.
std::size_t block_bytes(int x, int src, int dst) {
  const CounterRng rng(std::uint64_t(x) * 977 + 5);
  const std::uint64_t r = rng.bits(std::uint64_t(src) * 64 + std::uint64_t(dst));
  return r % 4 == 0 ? 0 : r % 5000;
}

// Exchange x of a rank: its send buffer (by destination) and what it expects.
struct Blocks {
  std::vector<std::vector<std::byte>> out;  // by destination
  std::vector<std::size_t> capacity, offsets;
  std::vector<std::byte> in;
};
Blocks blocks_of(int x, int rank, int ranks, bool at_most) {
  Blocks b;
  for (int d = 0; d < ranks; ++d) {
    std::vector<std::byte> block(block_bytes(x, rank, d));
    for (std::size_t i = 0; i < block.size(); ++i) block[i] = pattern(x, rank, d, i);
    b.out.push_back(std::move(block));
    const std::size_t from = block_bytes(x, d, rank);
    b.capacity.push_back(at_most && from ? from + 1 + std::size_t(x + d) % 300 : from);  // room to spare
  }
  b.offsets = ExchangeLayout::prefix_offsets(b.capacity);
  b.in.assign(b.offsets.back() + b.capacity.back(), std::byte{0xEE});
  return b;
}
void expect_landed(const Blocks& b, const Exchange& x, int ex, int rank, int ranks) {
  for (int s = 0; s < ranks; ++s) {
    const std::size_t n = block_bytes(ex, s, rank);
    ASSERT_EQ(x.received_bytes(s), n) << "exchange " << ex << " from rank " << s;
    for (std::size_t i = 0; i < n; ++i)
      ASSERT_EQ(b.in[b.offsets[s] + i], pattern(ex, s, rank, i)) << "exchange " << ex << " from " << s << " byte " << i;
  }
}

class NcclTransportJob : public ::testing::TestWithParam<std::tuple<int, int, bool>> {};

// Exchanges one after the other, each sent to every rank (self included)
// and waited for with next_arrival, exactly and within capacities.
TEST_P(NcclTransportJob, EveryLayoutLands) {
  const int ranks = std::get<0>(GetParam()), lanes = std::get<1>(GetParam());
  const bool at_most = std::get<2>(GetParam());
  test::FakeNcclFabric fabric(ranks, lanes);
  test::run_ranks(ranks, [&](Bootstrap& bootstrap) {
    auto t = nccl_over(fabric, bootstrap);
    const int me = t->rank();
    for (int ex = 0; ex < 7; ++ex) {
      Blocks b = blocks_of(ex, me, ranks, at_most);
      auto x = t->open_exchange(b.in.data(), b.capacity, b.offsets, "exchange " + std::to_string(ex),
                                at_most ? ReceiveSizes::at_most : ReceiveSizes::exact);
      for (int i = 1; i <= ranks; ++i) {
        const int d = (me + i) % ranks;
        x->send(d, b.out[d].data(), b.out[d].size());
      }
      std::vector<int> reported;
      for (int s; (s = x->next_arrival(true)) != Exchange::kAllArrived;) reported.push_back(s);
      std::sort(reported.begin(), reported.end());
      ASSERT_EQ(int(reported.size()), ranks);
      for (int s = 0; s < ranks; ++s) ASSERT_EQ(reported[s], s);
      x->finish();
      expect_landed(b, *x, ex, me, ranks);
    }
    // The blocking helpers go through the same exchanges.
    std::vector<std::uint64_t> sizes(ranks), got(ranks);
    for (int r = 0; r < ranks; ++r) sizes[r] = std::uint64_t(me * 1000 + r);
    t->exchange_sizes(sizes.data(), got.data(), "sizes");
    for (int r = 0; r < ranks; ++r) EXPECT_EQ(got[r], std::uint64_t(r * 1000 + me));
    const std::int64_t mine = 7 * me + 1;
    std::vector<std::int64_t> all(ranks);
    t->all_gather(&mine, sizeof mine, all.data(), "gather");
    for (int r = 0; r < ranks; ++r) EXPECT_EQ(all[r], 7 * r + 1);
  });
  EXPECT_EQ(fabric.groups_in_flight(), 0u);
  if (ranks > 1) {
    EXPECT_GT(fabric.groups_completed(), 0u);
  }
}

std::string shape_name(const ::testing::TestParamInfo<std::tuple<int, int, bool>>& info) {
  const auto [ranks, lanes, at_most] = info.param;
  return std::to_string(ranks) + "Ranks" + std::to_string(lanes) + "Lanes" + (at_most ? "AtMost" : "Exact");
}

INSTANTIATE_TEST_SUITE_P(Shapes, NcclTransportJob,
                         ::testing::Combine(::testing::Values(1, 2, 4), ::testing::Values(1, 3), ::testing::Bool()),
                         shape_name);

// Three exchanges open at once over fewer lanes than exchanges, their sends
// made in an order of each rank's own: each launches in the order opened
// (a later one waits for its lane), so that the n-th meets the n-th of
// every rank, and each lands whole. Sent in the order each rank chose
// instead, ranks 0 and 1 would launch their groups on lane 0 in opposite
// orders, and the blocks of one exchange would land in the other's.
TEST(NcclTransport, ExchangesOpenTogetherLaunchInTheOrderOpened) {
  constexpr int kRanks = 3, kOpen = 3;
  for (const int lanes : {1, 2}) {
    SCOPED_TRACE(std::to_string(lanes) + " lanes");
    test::FakeNcclFabric fabric(kRanks, lanes);
    test::run_ranks(kRanks, [&](Bootstrap& bootstrap) {
      auto t = nccl_over(fabric, bootstrap);
      const int me = t->rank();
      std::vector<Blocks> b;
      std::vector<std::unique_ptr<Exchange>> x;
      for (int ex = 0; ex < kOpen; ++ex) {
        b.push_back(blocks_of(ex, me, kRanks, ex % 2 == 1));
        x.push_back(t->open_exchange(b[ex].in.data(), b[ex].capacity, b[ex].offsets, "open " + std::to_string(ex),
                                     ex % 2 == 1 ? ReceiveSizes::at_most : ReceiveSizes::exact));
      }
      // Rank 0 sends the last-opened first, rank 1 the first-opened first.
      for (int k = 0; k < kOpen; ++k) {
        const int ex = me == 0 ? kOpen - 1 - k : (me + k) % kOpen;
        for (int d = 0; d < kRanks; ++d) x[ex]->send(d, b[ex].out[d].data(), b[ex].out[d].size());
      }
      for (int ex = kOpen - 1; ex >= 0; --ex) {
        x[ex]->finish();
        expect_landed(b[ex], *x[ex], ex, me, kRanks);
      }
    });
    EXPECT_EQ(fabric.groups_in_flight(), 0u);
  }
}

// A rank polls its exchange while another has not sent yet: nothing is
// reported but the empty blocks, until the last send comes.
TEST(NcclTransport, NothingLandsBeforeTheGroupCompletes) {
  test::FakeNcclFabric fabric(2, 1);
  std::atomic<int> stage{0};
  test::run_ranks(2, [&](Bootstrap& bootstrap) {
    auto t = nccl_over(fabric, bootstrap);
    const int me = t->rank();
    std::vector<std::size_t> capacity = {8, 8}, offsets = {0, 8};
    std::vector<std::byte> in(16), out(8, std::byte(me + 1));
    auto x = t->open_exchange(in.data(), capacity, offsets, "late", ReceiveSizes::exact);
    x->send(me, out.data(), 8);
    if (me == 1) {
      EXPECT_EQ(x->next_arrival(false), 1);  // its own block
      EXPECT_EQ(x->next_arrival(false), Exchange::kNoneYet);
      stage = 1;
      while (stage.load() != 2) std::this_thread::yield();
      x->send(0, out.data(), 8);
    } else {
      x->send(1, out.data(), 8);
      while (stage.load() != 1) std::this_thread::yield();
      EXPECT_EQ(x->next_arrival(false), 0);
      EXPECT_EQ(x->next_arrival(false), Exchange::kNoneYet);  // rank 1 has not launched
      stage = 2;
    }
    x->finish();
    EXPECT_EQ(in[std::size_t(8 * (1 - me))], std::byte(2 - me));
  });
}

// Rank 1 opens the exchange and never sends: rank 0's wait ends at the
// deadline, naming the ranks it waits for and every lane's state; rank 1's
// finish is a bug of its caller, named as such.
TEST(NcclTransport, ADeadlineNamesEveryLane) {
  test::FakeNcclFabric fabric(2, 2);
  std::string rank0;
  std::string rank1;
  test::run_ranks(2, [&](Bootstrap& bootstrap) {
    auto t = nccl_over(fabric, bootstrap, std::chrono::milliseconds(300));
    const int me = t->rank();
    std::vector<std::size_t> capacity = {4, 4}, offsets = {0, 4};
    std::vector<std::byte> in(8), out(4);
    auto first = t->open_exchange(in.data(), capacity, offsets, "dispatch step 9", ReceiveSizes::exact);
    try {
      if (me == 0) {
        first->send(0, out.data(), 4);
        first->send(1, out.data(), 4);
      }
      first->finish();
    } catch (const Error& e) {
      (me == 0 ? rank0 : rank1) = e.what();
      EXPECT_EQ(e.kind(), me == 0 ? ErrorKind::Runtime : ErrorKind::Internal);
    }
  });
  EXPECT_NE(rank0.find("rank 0: dispatch step 9: deadline of 300 ms expired on NCCL lane 0 (data group 1 "
                       "launched, not complete); still waiting for data from ranks [1]"),
            std::string::npos) << rank0;
  EXPECT_NE(rank0.find("lane 0: launched 1, completed 0"), std::string::npos) << rank0;
  EXPECT_NE(rank0.find("lane 1: launched 0, completed 0"), std::string::npos) << rank0;
  EXPECT_NE(rank1.find("dispatch step 9: finish() with no send() to ranks [0]"), std::string::npos) << rank1;
}

// An exchange destroyed before it completed (an error unwinding) stops every
// lane: later exchanges are refused, naming it, and a block that its peer
// sends afterwards never lands in the memory the caller has let go.
TEST(NcclTransport, AnExchangeLeftUnfinishedStopsEveryLane) {
  test::FakeNcclFabric fabric(2, 1);
  std::atomic<int> stage{0};
  test::run_ranks(2, [&](Bootstrap& bootstrap) {
    auto t = nccl_over(fabric, bootstrap);
    const int me = t->rank();
    std::vector<std::size_t> capacity = {4, 4}, offsets = {0, 4};
    std::vector<std::byte> in(8, std::byte{0x55}), out(4, std::byte{0x11});
    if (me == 0) {
      {
        auto x = t->open_exchange(in.data(), capacity, offsets, "answers step 4", ReceiveSizes::exact);
        x->send(0, out.data(), 4);
        x->send(1, out.data(), 4);  // launched; rank 1 has not sent
      }
      stage = 1;
      while (stage.load() != 2) std::this_thread::yield();
      // Its own block landed at send(); rank 1's never does.
      EXPECT_EQ(in, std::vector<std::byte>({std::byte{0x11}, std::byte{0x11}, std::byte{0x11}, std::byte{0x11},
                                            std::byte{0x55}, std::byte{0x55}, std::byte{0x55}, std::byte{0x55}}));
      try {
        t->open_exchange(in.data(), capacity, offsets, "dispatch step 5", ReceiveSizes::exact);
        ADD_FAILURE() << "a stopped transport opened an exchange";
      } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::Runtime);
        EXPECT_NE(std::string(e.what()).find("dispatch step 5: the nccl transport stopped every lane after "
                                             "'answers step 4' was left unfinished"),
                  std::string::npos) << e.what();
      }
    } else {
      while (stage.load() != 1) std::this_thread::yield();
      std::vector<std::byte> mine(8);
      auto x = t->open_exchange(mine.data(), capacity, offsets, "answers step 4", ReceiveSizes::exact);
      x->send(1, out.data(), 4);
      x->send(0, out.data(), 4);  // rank 0's group is gone: this one never completes
      EXPECT_EQ(x->next_arrival(false), 1);
      EXPECT_EQ(x->next_arrival(false), Exchange::kNoneYet);
      stage = 2;
    }
  });
}

TEST(NcclTransport, WindowsNeedAHostTransport) {
  test::FakeNcclFabric fabric(1, 1);
  test::run_ranks(1, [&](Bootstrap& bootstrap) {
    auto t = nccl_over(fabric, bootstrap);
    EXPECT_STREQ(t->name(), "nccl");
    try {
      t->create_window(64, "migration window");
      ADD_FAILURE() << "a window without a host transport";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::Usage);
      EXPECT_NE(std::string(e.what()).find("migration window: the nccl transport has no host transport"),
                std::string::npos) << e.what();
    }
    EXPECT_THROW(t->continue_with({0}, 1), Error);  // not elastic
  });
}

}  // namespace
}  // namespace moed::comm
