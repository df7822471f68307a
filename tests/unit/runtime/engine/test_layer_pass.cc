// LayerPass (runtime/engine/layer_pass.h), every rank of a job in one thread: each
// rank's passes talk through an in-memory fabric that delivers the messages
// in a random order, with random delays, while the ranks advance in a random
// order. Whatever the order, the placement, the route (flat or through
// gateways), overlap on or off, and the micro-batches, every token's output
// must have the bits of a plain per-token reference: its experts run on it
// alone, their gate-weighted outputs summed in fixed point, plus the residual.
// The same passes run over the NCCL transport too, its lanes in memory with
// NCCL's matching rules (tests/unit/comm/fake_nccl_groups.h): fewer lanes
// than the exchanges open at once, so that later exchanges wait for earlier
// ones to launch, and each launches only once every rank has had its send.
#include <gtest/gtest.h>

#include <bit>
#include <cstring>
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
#include "runtime/config/config.h"
#include "runtime/engine/expert_executor.h"
#include "runtime/engine/layer_pass.h"
#include "runtime/router/router.h"
#include "runtime/weights/expert_store.h"
#include "comm/nccl/nccl_transport.h"
#include "tests/unit/comm/fake_nccl_groups.h"
#include "tests/unit/runtime/fake_fabric.h"

namespace moed::runtime {
namespace {

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

// (case, hierarchical, overlap, micro-batches, seed of the delivery order and
// of whether answers narrow, over the NCCL transport)
using Param = std::tuple<std::size_t, bool, bool, int, int, bool>;

class LayerPassJob : public ::testing::TestWithParam<Param> {};

TEST_P(LayerPassJob, EveryOrderGivesTheReferenceBits) {
  const auto [which, hierarchical, overlap, microbatches, seed, nccl] = GetParam();
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

  fake::Fabric fabric(std::uint64_t(seed) * 7919 + which, {.layer_pass_only = true});
  test::FakeNcclFabric lanes(R, 4);
  std::vector<std::unique_ptr<comm::Transport>> transports;
  std::vector<ExpertStore> stores;
  // Calls cut into blocks of 4 rows, every pass of the rank polled between
  // them; made as the engine makes them, and used through the seam alone.
  std::vector<std::unique_ptr<ExpertExecutor>> executors;
  for (int r = 0; r < R; ++r) executors.push_back(make_expert_executor(ExpertDevice::cpu, 4));
  std::vector<std::vector<std::int64_t>> acc(static_cast<std::size_t>(R));
  std::vector<std::vector<LayerPass>> passes(static_cast<std::size_t>(R));
  for (int r = 0; r < R; ++r) {
    transports.push_back(nccl ? comm::create_nccl_transport_over(r, R, std::chrono::seconds(60), lanes.groups(r),
                                                                 nullptr)
                              : fabric.transport(r, R));
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
                             executors[r].get(),
                             hierarchical && topology.islands() > 1,
                             overlap,
                             // Seed 1 narrows the fixed-point answers; seed 2 sends them at full width.
                             seed == 1,
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
      if (passes[r][m].done()) {
        transports[r]->progress();  // as its finish() would: its exchanges move until complete
        ++still;
      } else if (!passes[r][m].advance()) {
        ++still;
      } else {
        still = 0;
      }
      ASSERT_LT(still, 10000) << "no progress: a deadlock (in flight: " << fabric.in_flight() << " messages, "
                              << lanes.groups_in_flight() << " NCCL groups)";
    }
    for (int r = 0; r < R; ++r)
      for (int m = 0; m < M; ++m) passes[r][m].finish();
    EXPECT_EQ(fabric.in_flight(), 0u);
    EXPECT_EQ(lanes.groups_in_flight(), 0u);
    if (R > 1) {
      EXPECT_GT(nccl ? lanes.groups_completed() : fabric.delivered(), std::uint64_t(R));
    }

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
  const auto [which, hierarchical, overlap, microbatches, seed, nccl] = info.param;
  return std::string(cases()[which].name) + (hierarchical ? "Hierarchical" : "Flat") +
         (overlap ? "Overlap" : "Serial") + "M" + std::to_string(microbatches) + "Seed" +
         std::to_string(seed) + (seed == 1 ? "Narrow" : "FullWidth") + (nccl ? "Nccl" : "");
}

INSTANTIATE_TEST_SUITE_P(Orders, LayerPassJob,
                         ::testing::Combine(::testing::Range<std::size_t>(0, cases().size()),
                                            ::testing::Bool(), ::testing::Bool(), ::testing::Values(1, 2),
                                            ::testing::Values(1, 2), ::testing::Bool()),
                         name);

}  // namespace
}  // namespace moed::runtime
