// LayerPass (runtime/layer_pass.h), every rank of a job in one thread: each
// rank's passes talk through an in-memory fabric that delivers the messages
// in a random order, with random delays, while the ranks advance in a random
// order. Whatever the order, the placement, the route (flat or through
// gateways), overlap on or off, and the micro-batches, every token's output
// must have the bits of a plain per-token reference: its experts run on it
// alone, their gate-weighted outputs summed in fixed point, plus the residual.
#include <gtest/gtest.h>

#include <bit>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "common/error.h"
#include "common/rng.h"
#include "kernels/cpu/expert_ffn.h"
#include "kernels/cpu/fixed_combine.h"
#include "placement/placement.h"
#include "placement/topology.h"
#include "runtime/config.h"
#include "runtime/layer_pass.h"
#include "runtime/router.h"
#include "runtime/weights/expert_store.h"

namespace moed::runtime {
namespace {

// Messages in flight between the ranks: (exchange sequence, source, destination) -> bytes.
struct Fabric {
  explicit Fabric(std::uint64_t seed) : rng(seed) {}
  std::map<std::tuple<std::uint64_t, int, int>, std::vector<std::byte>> in_flight;
  CounterRng rng;
  std::uint64_t draws = 0, delivered = 0;
  std::uint64_t draw() { return rng.bits(draws++); }
};

class FakeExchange final : public comm::Exchange {
 public:
  FakeExchange(Fabric& fabric, int rank, int ranks, std::uint64_t sequence, std::byte* recv,
               std::vector<std::size_t> capacity, std::vector<std::size_t> offsets, comm::ReceiveSizes sizes)
      : fabric_(fabric),
        rank_(rank),
        sequence_(sequence),
        recv_(recv),
        capacity_(std::move(capacity)),
        offsets_(std::move(offsets)),
        exact_(sizes == comm::ReceiveSizes::exact),
        landed_(std::size_t(ranks), 0),
        bytes_(std::size_t(ranks), 0) {
    for (int s = 0; s < ranks; ++s)
      if (capacity_[s] == 0) land(s, 0);
  }
  void send(int dest, const std::byte* data, std::size_t bytes) override {
    if (bytes == 0) return;
    EXPECT_NE(dest, rank_) << "a block to self went through the transport";
    fabric_.in_flight[{sequence_, rank_, dest}] = std::vector<std::byte>(data, data + bytes);
  }
  int next_arrival(bool block) override {
    EXPECT_FALSE(block) << "LayerPass only polls";
    if (reported_ == int(landed_.size())) return kAllArrived;
    // Deliver one pending message for this rank, sometimes: arrivals come late and out of order.
    if (fabric_.draw() % 3 == 0) {
      std::vector<int> pending;
      for (const auto& [key, bytes] : fabric_.in_flight)
        if (std::get<0>(key) == sequence_ && std::get<2>(key) == rank_) pending.push_back(std::get<1>(key));
      if (!pending.empty()) {
        const int s = pending[fabric_.draw() % pending.size()];
        auto node = fabric_.in_flight.extract({sequence_, s, rank_});
        const std::vector<std::byte>& bytes = node.mapped();
        EXPECT_LE(bytes.size(), capacity_[s]) << "block from rank " << s;
        if (exact_) {
          EXPECT_EQ(bytes.size(), capacity_[s]) << "block from rank " << s;
        }
        std::memcpy(recv_ + offsets_[s], bytes.data(), std::min(bytes.size(), capacity_[s]));
        land(s, bytes.size());
        ++fabric_.delivered;
      }
    }
    if (arrivals_.empty()) return kNoneYet;
    const int s = arrivals_.front();
    arrivals_.pop_front();
    ++reported_;
    return s;
  }
  void finish() override {
    EXPECT_EQ(reported_, int(landed_.size())) << "finish before every block was reported";
  }
  std::size_t received_bytes(int source) const override { return bytes_[source]; }

 private:
  void land(int s, std::size_t bytes) {
    EXPECT_FALSE(landed_[s]) << "rank " << s << " twice";
    landed_[s] = 1;
    bytes_[s] = bytes;
    arrivals_.push_back(s);
  }
  Fabric& fabric_;
  int rank_;
  std::uint64_t sequence_;
  std::byte* recv_;
  std::vector<std::size_t> capacity_, offsets_;
  bool exact_;
  std::vector<char> landed_;
  std::vector<std::size_t> bytes_;
  std::deque<int> arrivals_;
  int reported_ = 0;
};

class FakeTransport final : public comm::Transport {
 public:
  FakeTransport(Fabric& fabric, int rank, int ranks) : fabric_(fabric), rank_(rank), ranks_(ranks) {}
  const char* name() const override { return "fake"; }
  int rank() const override { return rank_; }
  int size() const override { return ranks_; }
  std::unique_ptr<comm::Exchange> open_exchange(std::byte* recv, const std::vector<std::size_t>& bytes,
                                                const std::vector<std::size_t>& offsets, const std::string&,
                                                comm::ReceiveSizes sizes) override {
    return std::make_unique<FakeExchange>(fabric_, rank_, ranks_, sequence_++, recv, bytes, offsets, sizes);
  }
  std::unique_ptr<comm::RmaWindow> create_window(std::size_t, const std::string&) override {
    throw std::logic_error("no windows here");
  }

 private:
  Fabric& fabric_;
  int rank_, ranks_;
  std::uint64_t sequence_ = 0;
};

constexpr int kLayers = 2, kLayer = 1, kExperts = 6, kTopK = 3, kHidden = 8, kFfn = 16;
constexpr std::size_t kTokens = 41;
constexpr std::uint64_t kStep = 3, kFirstKey = kStep * kTokens;

Config small_config() {
  Config c = default_config();
  c.model.layers = kLayers;
  c.model.experts = kExperts;
  c.model.top_k = kTopK;
  c.model.hidden = kHidden;
  c.model.ffn = kFfn;
  c.experts.chunk_rows = 3;
  return c;
}

// The layer's normalised rows and routing, for all tokens.
struct Tokens {
  std::vector<float> xn;
  Routing routing;
};
Tokens make_tokens() {
  Tokens t;
  CounterRng rng(11);
  t.xn.resize(kTokens * kHidden);
  for (std::size_t i = 0; i < t.xn.size(); ++i) t.xn[i] = rng.normalish(i);
  std::vector<float> logits(kTokens * kExperts);
  CounterRng lrng(12);
  for (std::size_t i = 0; i < logits.size(); ++i) logits[i] = 2 * lrng.normalish(i);
  RouterParams p;  // top-p: tokens with 1, 2 or 3 experts, rows of one pair and of several
  p.top_p_mode = true;
  p.top_p = 0.6f;
  p.min_k = 1;
  p.max_k = kTopK;
  route(logits.data(), kTokens, kExperts, p, t.routing);
  return t;
}

// The fixed-point sums of every token, each expert run on the token alone.
std::vector<std::int64_t> reference(const Config& c, const Tokens& t) {
  const placement::Placement one = placement::contiguous(1, kLayers, kExperts);
  const ExpertStore store = ExpertStore::load(c, one, 0);
  std::vector<std::int64_t> acc(kTokens * kHidden, 0);
  std::vector<float> y(kHidden), scratch(kernels::expert_ffn_scratch(store.expert(kLayer, 0), 1));
  for (std::size_t i = 0; i < kTokens; ++i)
    for (std::size_t k = 0; k < t.routing.experts_of(i).size(); ++k) {
      kernels::expert_ffn(store.expert(kLayer, int(t.routing.experts_of(i)[k])), t.xn.data() + i * kHidden, 1,
                          y.data(), scratch.data());
      kernels::add_weighted_fixed(acc.data() + i * kHidden, y.data(), t.routing.weights_of(i)[k], kHidden);
    }
  return acc;
}

struct Case {
  const char* name;
  std::function<placement::Placement()> make;
  std::vector<int> island_of_rank;
};

const std::vector<Case>& cases() {
  using placement::add_random_replicas, placement::contiguous, placement::shuffled;
  static const std::vector<Case> all = {
      {"OneRank", [] { return contiguous(1, kLayers, kExperts); }, {0}},
      {"ThreeRanks", [] { return shuffled(3, kLayers, kExperts, 5); }, {0, 0, 0}},
      {"FourRanksTwoIslandsReplicas",
       [] { return add_random_replicas(shuffled(4, kLayers, kExperts, 7), 4, 3); },
       {0, 0, 1, 1}},
      {"FiveRanksUnevenIslands", [] { return contiguous(5, kLayers, kExperts); }, {0, 0, 0, 1, 1}},
      {"SixRanksThreeIslandsReplicas",
       [] { return add_random_replicas(shuffled(6, kLayers, kExperts, 9), 5, 4); },
       {0, 0, 1, 1, 2, 2}},
  };
  return all;
}

// (case, hierarchical, overlap, micro-batches, seed of the delivery order)
using Param = std::tuple<std::size_t, bool, bool, int, int>;

class LayerPassJob : public ::testing::TestWithParam<Param> {};

TEST_P(LayerPassJob, EveryOrderGivesTheReferenceBits) {
  const auto [which, hierarchical, overlap, microbatches, seed] = GetParam();
  const Case& k = cases()[which];
  const Config c = small_config();
  const Tokens tokens = make_tokens();
  const placement::Placement placement = k.make();
  const placement::Topology topology(k.island_of_rank);
  const int R = placement.ranks(), M = microbatches;

  // Each rank's tokens, and each pass's part of them, as the engine splits them.
  const auto rank_rows = [&](int r) {
    return std::pair{kTokens * r / R, kTokens * (r + 1) / R - kTokens * r / R};
  };
  const auto pass_rows = [&](std::size_t n, int m) {
    return std::pair{n * m / M, n * (m + 1) / M - n * m / M};
  };
  std::vector<Routing> routing(static_cast<std::size_t>(R));
  for (int r = 0; r < R; ++r) {
    const auto [first, n] = rank_rows(r);
    for (std::size_t i = first; i < first + n; ++i) {
      for (std::size_t j = 0; j < tokens.routing.experts_of(i).size(); ++j)
        routing[r].add(tokens.routing.experts_of(i)[j], tokens.routing.weights_of(i)[j]);
      routing[r].end_token();
    }
  }
  // The all-gather: counts and homes per pass.
  std::vector<ExpertCounts> counts(static_cast<std::size_t>(M), ExpertCounts(R, kExperts));
  std::vector<LayerPass::Homes> homes(static_cast<std::size_t>(M));
  for (int m = 0; m < M; ++m) {
    homes[m].first_key.resize(static_cast<std::size_t>(R));
    homes[m].tokens.resize(static_cast<std::size_t>(R));
    for (int r = 0; r < R; ++r) {
      const auto [first, n] = rank_rows(r);
      const auto [pf, pn] = pass_rows(n, m);
      const std::vector<std::uint32_t> mine = ExpertCounts::local(routing[r], kExperts, pf, pn);
      std::copy(mine.begin(), mine.end(), counts[m].data() + std::size_t(r) * kExperts);
      homes[m].first_key[r] = kFirstKey + first + pf;
      homes[m].tokens[r] = pn;
    }
  }

  Fabric fabric(std::uint64_t(seed) * 7919 + which);
  std::vector<std::unique_ptr<FakeTransport>> transports;
  std::vector<ExpertStore> stores;
  // Calls cut into blocks of 4 rows, every pass of the rank polled between them.
  std::vector<ExpertExecutor> executors(static_cast<std::size_t>(R), ExpertExecutor(4));
  std::vector<std::vector<std::int64_t>> acc(static_cast<std::size_t>(R));
  std::vector<std::vector<LayerPass>> passes(static_cast<std::size_t>(R));
  for (int r = 0; r < R; ++r) {
    transports.push_back(std::make_unique<FakeTransport>(fabric, r, R));
    stores.push_back(ExpertStore::load(c, placement, r));
  }
  // Twice with the same passes and transports: a pass is reused layer after layer.
  for (int layer_run = 0; layer_run < 2; ++layer_run) {
    SCOPED_TRACE("run " + std::to_string(layer_run));
    for (int r = 0; r < R; ++r) {
      const auto [first, n] = rank_rows(r);
      acc[r].assign(n * kHidden, 0);
      passes[r].resize(static_cast<std::size_t>(M));
      LayerPass::Setup setup{transports[r].get(),
                             &topology,
                             &stores[r],
                             &executors[r],
                             hierarchical && topology.islands() > 1,
                             overlap,
                             true,
                             // Seed 1: an expert's arrived rows run at once; seed 2: only all together.
                             seed == 1 ? std::size_t{1} : std::size_t{1000},
                             [&passes, r] {
                               for (LayerPass& pass : passes[r]) pass.poll();
                             }};
      for (int m = 0; m < M; ++m) {
        const auto [pf, pn] = pass_rows(n, m);
        PlanInput in{&routing[r],
                     &placement,
                     kLayer,
                     &counts[m],
                     r,
                     std::uint64_t(c.experts.chunk_rows),
                     kStep,
                     &topology,
                     setup.hierarchical,
                     kFirstKey + first,
                     pf,
                     pn};
        passes[r][m].plan(setup, in, homes[m], tokens.xn.data() + first * kHidden, acc[r].data(),
                          "test layer");
      }
    }
    for (int r = 0; r < R; ++r)
      for (int m = 0; m < M; ++m) passes[r][m].start();

    // Ranks advance in a random order until all are done; a long run of polls
    // in which nothing moves and nothing is in flight is a deadlock.
    int still = 0;
    for (std::uint64_t round = 0;; ++round) {
      bool all_done = true;
      for (int r = 0; r < R; ++r)
        for (int m = 0; m < M; ++m) all_done = all_done && passes[r][m].done();
      if (all_done) break;
      const int r = int(fabric.draw() % std::uint64_t(R)), m = int(fabric.draw() % std::uint64_t(M));
      if (passes[r][m].done() || !passes[r][m].advance())
        ++still;
      else
        still = 0;
      ASSERT_LT(still, 10000) << "no progress: a deadlock (in flight: " << fabric.in_flight.size() << ")";
    }
    EXPECT_TRUE(fabric.in_flight.empty());
    if (R > 1) {
      EXPECT_GT(fabric.delivered, std::uint64_t(R));
    }
    for (int r = 0; r < R; ++r)
      for (int m = 0; m < M; ++m) passes[r][m].finish();

    const std::vector<std::int64_t> want = reference(c, tokens);
    ASSERT_NE(std::count(want.begin(), want.end(), 0), std::ptrdiff_t(want.size()));
    for (int r = 0; r < R; ++r) {
      const auto [first, n] = rank_rows(r);
      for (std::size_t i = 0; i < n * kHidden; ++i)
        ASSERT_EQ(acc[r][i], want[first * kHidden + i])
            << "rank " << r << " token " << first + i / kHidden << " element " << i % kHidden;
    }
  }
}

std::string name(const ::testing::TestParamInfo<Param>& info) {
  const auto [which, hierarchical, overlap, microbatches, seed] = info.param;
  return std::string(cases()[which].name) + (hierarchical ? "Hierarchical" : "Flat") +
         (overlap ? "Overlap" : "Serial") + "M" + std::to_string(microbatches) + "Seed" +
         std::to_string(seed);
}

INSTANTIATE_TEST_SUITE_P(Orders, LayerPassJob,
                         ::testing::Combine(::testing::Range<std::size_t>(0, cases().size()),
                                            ::testing::Bool(), ::testing::Bool(), ::testing::Values(1, 2),
                                            ::testing::Values(1, 2)),
                         name);

}  // namespace
}  // namespace moed::runtime
