// Single-token traces through the real step loop: every rank of a job as a
// thread over the in-memory fabric (fake_fabric.h), every token wanted. The
// records the ranks send to rank 0 must describe what the run did: each
// chosen expert computed exactly once, on a rank that holds it; each home's
// row reaching the ranks (or gateways) that compute its experts; every layer
// of the step; times in order; phases summing to the home's total. Tracing
// must not change a bit of the outputs.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <set>
#include <thread>
#include <tuple>
#include <vector>

#include "common/rng.h"
#include "placement/placement.h"
#include "placement/topology.h"
#include "runtime/config/config.h"
#include "runtime/engine/census.h"
#include "runtime/engine/engine.h"
#include "runtime/trace/trace_assembly.h"
#include "runtime/weights/expert_store.h"
#include "runtime/workload/token_order.h"
#include "runtime/workload/workload.h"
#include "tests/unit/runtime/fake_fabric.h"

namespace moed::runtime {
namespace {

constexpr int kLayers = 3, kExperts = 6, kHidden = 8, kRanks = 4;
constexpr std::size_t kTokens = 29;
constexpr std::uint64_t kStep = 5;

class NoiseTokens final : public Workload {
 public:
  void tokens(std::uint64_t first, std::size_t count, float* hidden) const override {
    const CounterRng rng(77);
    for (std::size_t i = 0; i < count * kHidden; ++i) hidden[i] = 2 * rng.normalish(first * kHidden + i);
  }
  std::string describe() const override { return "noise"; }
};

// (hierarchical, micro-batches, shuffled order)
using Param = std::tuple<bool, int, bool>;

struct RankResult {
  std::vector<float> hidden;
  trace::TraceFragments trace;
  std::size_t count = 0;
};

class EngineTrace : public ::testing::TestWithParam<Param> {
 protected:
  Config config() const {
    Config c = default_config();
    c.model.layers = kLayers;
    c.model.experts = kExperts;
    c.model.top_k = 2;
    c.model.hidden = kHidden;
    c.model.ffn = 16;
    c.experts.chunk_rows = 3;
    c.workload.tokens_per_step = std::int64_t(kTokens);
    c.workload.order = std::get<2>(GetParam()) ? WorkloadOrder::shuffled : WorkloadOrder::sequential;
    c.comm.hierarchical = std::get<0>(GetParam());
    c.engine.microbatches = std::get<1>(GetParam());
    c.engine.split_rows = 2;
    validate_config(c);
    return c;
  }

  std::vector<RankResult> run(const trace::TraceSelector* selector) {
    const Config c = config();
    fake::Fabric fabric(31);
    std::vector<RankResult> out(kRanks);
    std::vector<std::exception_ptr> errors(kRanks);
    std::vector<std::thread> threads;
    for (int r = 0; r < kRanks; ++r)
      threads.emplace_back([&, r] {
        try {
          const std::unique_ptr<comm::Transport> transport = fabric.transport(r, kRanks);
          ExpertStore store = ExpertStore::load(c, placement_, r);
          Engine engine(c, *transport, topology_, placement_, store, &workload_);
          engine.trace_with(selector);
          StepRecord rec = engine.run_step(kStep, out[r].hidden);
          out[r].trace = std::move(rec.trace);
          out[r].count = engine.local_tokens();
        } catch (...) {
          errors[r] = std::current_exception();
        }
      });
    for (std::thread& t : threads) t.join();
    for (int r = 0; r < kRanks; ++r)
      if (errors[r]) {
        try {
          std::rethrow_exception(errors[r]);
        } catch (const std::exception& e) {
          ADD_FAILURE() << "rank " << r << ": " << e.what();
        }
      }
    return out;
  }

  const placement::Placement placement_ =
      placement::add_random_replicas(placement::shuffled(kRanks, kLayers, kExperts, 3), 3, 5);
  const placement::Topology topology_{std::vector<int>{0, 0, 1, 1}};
  const NoiseTokens workload_;
};

TEST_P(EngineTrace, OffRecordsNothingAndTracingChangesNoBit) {
  const std::vector<RankResult> plain = run(nullptr);
  const trace::TraceSelector off(0.0, 4);
  for (const RankResult& r : run(&off)) EXPECT_TRUE(r.trace.empty());
  const trace::TraceSelector all(1.0, 4);
  const std::vector<RankResult> traced = run(&all);
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_EQ(plain[r].hidden.size(), traced[r].hidden.size());
    for (std::size_t i = 0; i < plain[r].hidden.size(); ++i)
      ASSERT_EQ(std::bit_cast<std::uint32_t>(plain[r].hidden[i]), std::bit_cast<std::uint32_t>(traced[r].hidden[i]))
          << "rank " << r << " element " << i;
  }
}

TEST_P(EngineTrace, RecordsDescribeWhatTheRunDid) {
  const Config c = config();
  const trace::TraceSelector all(1.0, 4);
  const std::vector<RankResult> ranks = run(&all);
  trace::TraceFragments joined;  // what rank 0 gets
  for (const RankResult& r : ranks) joined.append(r.trace);
  const std::vector<trace::LayerTrace> layers = trace::assemble(joined);

  // Each rank announces at most kTraceSlots tokens per pass, every layer.
  const std::size_t M = std::size_t(c.engine.microbatches);
  std::size_t expected = 0;
  for (const RankResult& r : ranks)
    for (std::size_t m = 0; m < M; ++m)
      expected += std::min(kTraceSlots, r.count * (m + 1) / M - r.count * m / M);
  ASSERT_EQ(layers.size(), expected * kLayers);

  std::vector<std::uint64_t> ids;
  TokenOrder(kTokens, c.workload.order == WorkloadOrder::shuffled, std::uint64_t(c.workload.seed)).ids(kStep, 0, kTokens, ids);
  std::map<std::uint64_t, std::set<int>> layers_of;  // request -> layers traced
  for (const trace::LayerTrace& t : layers) {
    const trace::HomeRecord& h = t.home;
    SCOPED_TRACE("request " + std::to_string(h.request_id) + " layer " + std::to_string(h.at.layer));
    // Identity: the workload token at that position of the step, served on its home.
    const std::uint64_t position = h.at.key - kStep * kTokens;
    ASSERT_LT(position, kTokens);
    EXPECT_EQ(h.request_id, ids[position]);
    EXPECT_EQ(h.step, kStep);
    EXPECT_EQ(h.epoch, placement_.epoch());
    EXPECT_EQ(h.island, topology_.island_of(h.at.home));
    EXPECT_GE(position, kTokens * std::size_t(h.at.home) / kRanks);
    EXPECT_LT(position, kTokens * std::size_t(h.at.home + 1) / kRanks);
    layers_of[h.request_id].insert(h.at.layer);

    // The router's choice, each expert computed exactly once where a replica is.
    ASSERT_EQ(t.choices.size(), 2u);
    EXPECT_NEAR(t.choices[0].weight + t.choices[1].weight, 1.0f, 1e-5);
    std::multiset<std::uint32_t> chosen, computed;
    for (const auto& ch : t.choices) chosen.insert(ch.expert);
    for (const trace::VisitRecord& v : t.visits) {
      computed.insert(v.expert);
      const auto& replicas = placement_.replicas(h.at.layer, int(v.expert));
      EXPECT_NE(std::find(replicas.begin(), replicas.end(), v.rank), replicas.end())
          << "expert " << v.expert << " ran on rank " << v.rank << ", which holds no replica";
      EXPECT_EQ(v.island, topology_.island_of(v.rank));
      EXPECT_GE(v.call_rows, 1u);
      EXPECT_LE(v.arrived_us, v.start_us);
      EXPECT_LE(v.start_us, v.end_us);
      EXPECT_LE(v.end_us, v.answered_us);
    }
    EXPECT_EQ(chosen, computed);

    // The home's rows: every pair leaves in one leg, to the rank that computes
    // it or to the gateway of its island; every answer came back.
    std::uint32_t pairs = 0;
    for (const trace::LegRecord& l : t.legs) {
      pairs += l.pairs;
      EXPECT_GE(l.back_us, h.sent_us) << "rank " << l.rank;
      EXPECT_EQ(l.row_bytes == 0, l.rank == h.at.home);
      EXPECT_EQ(l.via_gateway != 0, std::get<0>(GetParam()) && l.island != h.island);
    }
    // Every rank that computed reached directly has its leg; through a
    // gateway, its island has one.
    for (const trace::VisitRecord& v : t.visits)
      EXPECT_TRUE(std::any_of(t.legs.begin(), t.legs.end(), [&](const trace::LegRecord& l) {
        return l.via_gateway ? l.island == v.island : l.rank == v.rank;
      })) << "no leg toward rank " << v.rank;
    EXPECT_EQ(pairs, 2u);

    // Times: the home's steps in order, and its phases sum to its total.
    EXPECT_GE(h.route_us, 0);
    EXPECT_GE(h.gather_us, 0);
    EXPECT_LE(h.planned_us, h.sent_us);
    EXPECT_LE(h.sent_us, h.combined_us);
    const nlohmann::json p = trace::token_trace_json({h.request_id, h.position, {t}}, kLayers)["layers"][0]["phases_us"];
    double sum = 0;
    for (const char* phase : {"route", "plan", "dispatch", "wait", "combine"}) {
      EXPECT_GE(p[phase].get<double>(), 0) << phase;
      sum += p[phase].get<double>();
    }
    EXPECT_NEAR(sum, p["total"].get<double>(), 1e-2 * (1 + sum));
  }
  // A workload token is traced through every layer of its step.
  for (const auto& [id, seen] : layers_of) EXPECT_EQ(seen.size(), std::size_t(kLayers)) << "request " << id;
}

std::string name(const ::testing::TestParamInfo<Param>& info) {
  const auto [hierarchical, microbatches, shuffled] = info.param;
  return std::string(hierarchical ? "Hierarchical" : "Flat") + "M" + std::to_string(microbatches) +
         (shuffled ? "Shuffled" : "InOrder");
}

INSTANTIATE_TEST_SUITE_P(Jobs, EngineTrace,
                         ::testing::Values(Param{false, 1, false}, Param{true, 1, true}, Param{false, 2, true},
                                           Param{true, 2, false}),
                         name);

}  // namespace
}  // namespace moed::runtime
