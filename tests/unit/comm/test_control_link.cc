// The control channel over the data transport (comm/transport_control_link.h):
// three ranks as threads over UCX, and over the NCCL transport on lanes in
// memory with NCCL's rules (which launch an exchange only once every rank
// has had its send), run every collective of the channel, with
// blocks of 0 bytes, a few and past the rendezvous size, and varying sizes;
// each gives what its MPI twin does (on rank 0 for the rooted ones), with
// sums folded in rank order; the data exchanges and the collectives
// interleave, as the step loop makes them; a channel moves onto a link of
// its own ranks only.
#include "comm/transport_control_link.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "comm/control_channel.h"
#include "comm/transport.h"
#include "common/error.h"
#include "comm/nccl/nccl_transport.h"
#include "tests/unit/comm/fake_nccl_groups.h"
#include "tests/unit/comm/run_ranks.h"

namespace moed::comm {
namespace {

constexpr int kRanks = 3;

std::unique_ptr<Transport> ucx_over(Bootstrap& bootstrap) {
  CommConfig config;
  config.backend = Backend::ucx;
  config.timeout_ms = 10000;
  return create_transport(config, bootstrap);
}

// The transports the channel runs over, by the test's parameter.
class TransportControlLinkOver : public ::testing::TestWithParam<std::string> {
 protected:
  std::unique_ptr<Transport> transport(Bootstrap& bootstrap) {
    if (GetParam() == "Ucx") return ucx_over(bootstrap);
    return create_nccl_transport_over(bootstrap.rank(), bootstrap.size(), std::chrono::seconds(10),
                                      lanes_.groups(bootstrap.rank()), nullptr);
  }

 private:
  test::FakeNcclFabric lanes_{kRanks, 2};
};

// Rank r's string: r * 50000 characters (0 for rank 0), its own pattern.
std::string text_of(int r) {
  std::string s(std::size_t(r) * 50000, ' ');
  for (std::size_t i = 0; i < s.size(); ++i) s[i] = char('a' + (i * 7 + std::size_t(r)) % 26);
  return s;
}

TEST_P(TransportControlLinkOver, EveryCollectiveGivesWhatMpisWould) {
  test::run_ranks(kRanks, [this](Bootstrap& bootstrap) {
    const std::unique_ptr<Transport> t = transport(bootstrap);
    ControlChannel control(transport_control_link(*t));
    const int me = control.rank();
    ASSERT_EQ(control.size(), kRanks);
    EXPECT_STREQ(control.medium(), "transport");

    // broadcast: a few bytes, then past the rendezvous size, then none.
    for (std::size_t bytes : {std::size_t(12), std::size_t(300000), std::size_t(0)}) {
      std::vector<std::uint8_t> block(bytes, std::uint8_t(me == 0 ? 0 : 0xEE));
      if (me == 0)
        for (std::size_t i = 0; i < bytes; ++i) block[i] = std::uint8_t(i * 13);
      control.broadcast(block.data(), bytes, "broadcast");
      std::size_t wrong = 0;
      for (std::size_t i = 0; i < bytes; ++i) wrong += block[i] != std::uint8_t(i * 13);
      EXPECT_EQ(wrong, 0u) << "rank " << me << ", " << bytes << " bytes";
    }
    // broadcast_text: inline and past its small block.
    for (const std::string& want : {std::string("stop"), text_of(2)}) {
      std::string text = me == 0 ? want : "stale";
      control.broadcast_text(text, "broadcast_text");
      EXPECT_EQ(text, want) << "rank " << me;
    }

    // Reductions on rank 0: sums in rank order, maxima.
    double sums[2] = {0.1 * (me + 1), 1e16 * (me == 1 ? 1 : 0) + 1.0};
    control.reduce_sum(sums, 2, "reduce_sum doubles");
    if (me == 0) {
      EXPECT_EQ(sums[0], (0.1 + 0.2) + 0.30000000000000004) << "rank order";
      EXPECT_EQ(sums[1], (1.0 + (1e16 + 1.0)) + 1.0);
    }
    std::uint64_t counts[3] = {std::uint64_t(me), 1, std::uint64_t(1) << 40};
    control.reduce_sum(counts, 3, "reduce_sum counts");
    if (me == 0) {
      EXPECT_EQ(counts[0], 3u);
      EXPECT_EQ(counts[1], 3u);
      EXPECT_EQ(counts[2], std::uint64_t(3) << 40);
    }
    double maxima[2] = {double(me), -double(me)};
    control.reduce_max(maxima, 2, "reduce_max");
    if (me == 0) {
      EXPECT_EQ(maxima[0], 2.0);
      EXPECT_EQ(maxima[1], 0.0);
    }
    EXPECT_EQ(control.all_max(me == 1 ? 7 : me, "all_max"), 7) << "rank " << me;

    // Gathers on rank 0: equal blocks, and blocks of every size (rank 0's empty).
    const std::uint32_t mine[2] = {std::uint32_t(me), std::uint32_t(100 + me)};
    const std::vector<std::byte> equal = control.gather_equal(mine, sizeof mine, "gather_equal");
    const std::string text = text_of(me);
    const std::vector<std::byte> varying = control.gather(text.data(), text.size(), "gather");
    if (me == 0) {
      ASSERT_EQ(equal.size(), kRanks * sizeof mine);
      for (int r = 0; r < kRanks; ++r) {
        std::uint32_t got[2];
        std::memcpy(got, equal.data() + std::size_t(r) * sizeof got, sizeof got);
        EXPECT_EQ(got[0], std::uint32_t(r));
        EXPECT_EQ(got[1], std::uint32_t(100 + r));
      }
      std::string joined;
      for (int r = 0; r < kRanks; ++r) joined += text_of(r);
      EXPECT_EQ(std::string(reinterpret_cast<const char*>(varying.data()), varying.size()), joined);
    } else {
      EXPECT_TRUE(equal.empty());
      EXPECT_TRUE(varying.empty());
    }

    // all_gather_strings: every rank's, everywhere.
    const std::vector<std::string> all = control.all_gather_strings(text, "all_gather_strings");
    ASSERT_EQ(all.size(), std::size_t(kRanks));
    for (int r = 0; r < kRanks; ++r) EXPECT_EQ(all[std::size_t(r)], text_of(r)) << "rank " << me << " from " << r;
  });
}

// The step loop interleaves data exchanges and control collectives on one
// transport: every rank opens them in the same order, and each lands where
// it belongs.
TEST_P(TransportControlLinkOver, InterleavesWithTheDataPathsExchanges) {
  test::run_ranks(kRanks, [this](Bootstrap& bootstrap) {
    const std::unique_ptr<Transport> t = transport(bootstrap);
    ControlChannel control(transport_control_link(*t));
    const int me = control.rank();
    for (std::uint64_t step = 0; step < 20; ++step) {
      std::string command = me == 0 ? "step " + std::to_string(step) : "";
      control.broadcast_text(command, "command");
      EXPECT_EQ(command, "step " + std::to_string(step));
      std::uint64_t mine = step * 10 + std::uint64_t(me), all[kRanks] = {};
      t->all_gather(&mine, sizeof mine, all, "data");
      for (int r = 0; r < kRanks; ++r) EXPECT_EQ(all[r], step * 10 + std::uint64_t(r));
      std::uint64_t served = 1;
      control.reduce_sum(&served, 1, "figures");
      if (me == 0) {
        EXPECT_EQ(served, std::uint64_t(kRanks));
      }
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Transports, TransportControlLinkOver, ::testing::Values("Ucx", "Nccl"),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

// A link that is rank 0 of 5 and runs nothing: a channel of other ranks refuses it.
class OtherRanks final : public ControlLink {
 public:
  const char* name() const override { return "other"; }
  int rank() const override { return 0; }
  int size() const override { return 5; }
  void set_progress(std::function<void()>) override {}
  void broadcast(void*, std::size_t, const std::string&) override {}
  void reduce(std::span<double>, Op, const std::string&) override {}
  void reduce(std::span<std::uint64_t>, Op, const std::string&) override {}
  int all_max(int value, const std::string&) override { return value; }
  std::vector<std::byte> gather(const void*, std::size_t, bool, const std::string&) override { return {}; }
  std::vector<std::string> all_gather_strings(const std::string&, const std::string&) override { return {}; }
};

// The channel moves from one link to another at the same point on every
// rank, and refuses a link for other ranks.
TEST(TransportControlLink, AChannelMovesOntoIt) {
  test::run_ranks(2, [](Bootstrap& bootstrap) {
    const std::unique_ptr<Transport> t = ucx_over(bootstrap);
    const std::unique_ptr<Transport> other = ucx_over(bootstrap);
    ControlChannel control(transport_control_link(*t));
    control.use(transport_control_link(*other));
    EXPECT_EQ(control.all_max(control.rank() + 3, "after the move"), 4);
    try {
      control.use(std::make_unique<OtherRanks>());
      ADD_FAILURE() << "a link of 5 ranks replaced one of 2";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("control link other for rank 0 of 5"), std::string::npos) << e.what();
    }
    EXPECT_STREQ(control.medium(), "transport") << "the refused link is not taken";
    // A joiner's channel starts without a link and takes its first one.
    ControlChannel later(nullptr);
    later.set_progress([] {});
    EXPECT_THROW(later.use(nullptr), Error);
    later.use(transport_control_link(*t));
    EXPECT_EQ(later.all_max(later.rank() + 5, "over its first link"), 6);
  });
}

}  // namespace
}  // namespace moed::comm
