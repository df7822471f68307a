// Engine (runtime/engine/engine.h): the step loop of every rank of a job, each rank a
// thread over an in-memory fabric (fake_fabric.h) that delivers late and out
// of order. Whatever the rank count, the placement (replicas, shuffled), the
// route (flat or through gateways), the token order, overlap on or off and
// the micro-batches, every token's output must have the bits of a plain
// single-rank computation: each token alone through every layer (norm,
// router, its experts, fixed-point sum, residual). The per-step records must
// add up: phases, loads and pairs of the whole job, rows served, bytes.
#include "runtime/engine/engine.h"

#include <gtest/gtest.h>

#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <exception>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "common/rng.h"
#include "kernels/cpu/expert_ffn.h"
#include "kernels/cpu/finite_scan.h"
#include "kernels/cpu/fixed_combine.h"
#include "kernels/cpu/fixed_order_gemm.h"
#include "kernels/cpu/rms_norm.h"
#include "placement/placement.h"
#include "placement/topology.h"
#include "runtime/config/config.h"
#include "runtime/router/router.h"
#include "runtime/weights/expert_store.h"
#include "runtime/workload/token_order.h"
#include "runtime/workload/workload.h"
#include "tests/unit/runtime/fake_fabric.h"

namespace moed::runtime {
namespace {

constexpr int kLayers = 3, kExperts = 6, kHidden = 8, kFfn = 16;
constexpr std::size_t kTokens = 37;
constexpr std::uint64_t kSteps[] = {2, 3};  // two steps: replicas take other chunks in each

struct Case {
  const char* name;
  std::function<placement::Placement()> make;
  std::vector<int> island_of_rank;
  bool hierarchical = false;
  bool shuffled_order = false;
  bool top_p = false;  // tokens with 1 to 3 experts: rows of one pair and of several
};

const std::vector<Case>& cases() {
  using placement::add_random_replicas, placement::contiguous, placement::shuffled;
  static const std::vector<Case> all = {
      {"OneRank", [] { return contiguous(1, kLayers, kExperts); }, {0}},
      {"OneRankTopP", [] { return contiguous(1, kLayers, kExperts); }, {0}, false, true, true},
      {"TwoRanksShuffledOrder", [] { return contiguous(2, kLayers, kExperts); }, {0, 0}, false, true},
      {"ThreeRanksShuffledTopP", [] { return shuffled(3, kLayers, kExperts, 5); }, {0, 0, 0}, false, false, true},
      {"FourRanksTwoIslandsFlatReplicas",
       [] { return add_random_replicas(shuffled(4, kLayers, kExperts, 7), 4, 3); }, {0, 0, 1, 1}},
      {"FourRanksTwoIslandsHierarchicalReplicas",
       [] { return add_random_replicas(shuffled(4, kLayers, kExperts, 7), 4, 3); }, {0, 0, 1, 1}, true, true},
      {"FiveRanksUnevenIslandsHierarchicalReplicasTopP",
       [] { return add_random_replicas(shuffled(5, kLayers, kExperts, 9), 5, 4); }, {0, 0, 0, 1, 1}, true, true,
       true},
  };
  return all;
}

Config engine_config(const Case& k, bool overlap, int microbatches) {
  Config c = default_config();
  c.model.layers = kLayers;
  c.model.experts = kExperts;
  c.model.top_k = 2;
  c.model.hidden = kHidden;
  c.model.ffn = kFfn;
  c.experts.chunk_rows = 3;
  c.workload.tokens_per_step = std::int64_t(kTokens);
  c.workload.order = k.shuffled_order ? WorkloadOrder::shuffled : WorkloadOrder::sequential;
  if (k.top_p) {
    c.router.mode = RouterMode::topp;
    c.router.top_p = 0.6;
    c.router.min_k = 1;
    c.router.max_k = 3;
  }
  c.comm.hierarchical = k.hierarchical;
  c.engine.overlap = overlap;
  c.engine.microbatches = microbatches;
  c.engine.split_rows = 2;  // tasks start on few rows: more interleavings
  validate_config(c);
  return c;
}

// A workload whose tokens are noise, a pure function of their id (the
// synthetic workload would do too, but calibrating its topics takes a while).
class NoiseTokens final : public Workload {
 public:
  void tokens(std::uint64_t first, std::size_t count, float* hidden) const override {
    const CounterRng rng(4242);
    for (std::size_t i = 0; i < count * kHidden; ++i) hidden[i] = 2 * rng.normalish(first * kHidden + i);
  }
  std::string describe() const override { return "noise"; }
};

const Workload& shared_workload() {
  static const NoiseTokens workload;
  return workload;
}

// ---- the plain computation ----------------------------------------------------------------

// One rank's whole model, and the figures of the job the records must show.
struct Plain {
  explicit Plain(const Config& config, const std::function<void(ExpertStore&)>& spoil = {})
      : c(config),
        store(ExpertStore::load(c, placement::contiguous(1, kLayers, kExperts), 0)),
        router(RouterParams::from(c)),
        load(std::size_t(kLayers) * kExperts, 0) {
    if (spoil) spoil(store);
    for (int l = 0; l < kLayers; ++l) gates.emplace_back(store.layer(l).gate.data(), kExperts, kHidden);
  }

  // h + MoE(RMSNorm(h)) of layer l for one token, in place; counts its pairs.
  void layer(int l, float* x) {
    std::vector<float> xn(kHidden), logits(kExperts), y(kHidden);
    std::vector<float> scratch(kernels::expert_ffn_scratch(store.expert(l, 0), 1));
    kernels::rms_norm(x, store.layer(l).norm.data(), 1, kHidden, float(c.model.norm_eps), xn.data());
    kernels::gemm_fixed_order(xn.data(), 1, gates[l], logits.data());
    Routing routing;
    route(logits.data(), 1, kExperts, router, routing);
    std::vector<std::int64_t> acc(kHidden, 0);
    const auto experts = routing.experts_of(0);
    for (std::size_t k = 0; k < experts.size(); ++k) {
      // The expert's output chunk by chunk ([experts].ffn_chunks; one chunk: the whole down-projection).
      const kernels::ExpertView expert = store.expert(l, int(experts[k]));
      kernels::expert_ffn_up(expert, xn.data(), 1, scratch.data());
      const std::size_t key = std::size_t(l) * kExperts + experts[k];
      for (std::size_t chunk = 0; chunk < expert.chunks; ++chunk) {
        kernels::expert_ffn_down_chunk(expert, scratch.data(), 1, chunk, y.data());
        kernels::add_weighted_fixed(acc.data(), y.data(), routing.weights_of(0)[k], kHidden);
        if (const std::size_t bad = kernels::count_nonfinite(y.data(), kHidden)) nonfinite[std::uint32_t(key)] += bad;
      }
      ++load[key];
    }
    pairs += experts.size();
    singles += experts.size() == 1;
    kernels::residual_from_fixed(x, acc.data(), kHidden, x);
  }

  // The outputs of a workload step, by position, and its figures.
  std::vector<float> step(std::uint64_t s) {
    load.assign(std::size_t(kLayers) * kExperts, 0);
    pairs = singles = 0;
    nonfinite.clear();
    std::vector<std::uint64_t> ids;
    TokenOrder(kTokens, c.workload.order == WorkloadOrder::shuffled, std::uint64_t(c.workload.seed)).ids(s, 0, kTokens, ids);
    std::vector<float> x(kTokens * kHidden);
    for (std::size_t t = 0; t < kTokens; ++t) {
      shared_workload().tokens(ids[t], 1, x.data() + t * kHidden);
      for (int l = 0; l < kLayers; ++l) layer(l, x.data() + t * kHidden);
    }
    return x;
  }

  const Config& c;
  ExpertStore store;
  RouterParams router;
  std::vector<kernels::PackedWeights> gates;
  std::vector<std::uint64_t> load;
  std::uint64_t pairs = 0, singles = 0;
  std::map<std::uint32_t, std::uint64_t> nonfinite;  // NaN/inf output terms per layer * experts + e
};

// ---- the job ------------------------------------------------------------------------------

// What one rank gave back from one step.
struct RankStep {
  std::vector<float> hidden;
  StepRecord rec;
  std::uint32_t rows_in_calls = 0;  // calls_of_last_step, summed
};
struct RankRun {
  int rank = 0;
  std::uint64_t first = 0;
  std::size_t count = 0;
  std::vector<RankStep> steps;
};

// Every rank of the job as a thread: its own transport, store and engine
// (fed by `workload`, or by the test with none). `body` runs on each rank's
// engine; a rank that throws fails the test.
std::vector<RankRun> run_job(const Config& c, const placement::Placement& placement,
                             const placement::Topology& topology, const Workload* workload, std::uint64_t seed,
                             const std::function<void(Engine&, RankRun&)>& body,
                             const std::function<void(ExpertStore&)>& spoil = {}) {
  const int R = placement.ranks();
  fake::Fabric fabric(seed);
  std::vector<RankRun> runs(static_cast<std::size_t>(R));
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(R));
  std::vector<std::thread> threads;
  for (int r = 0; r < R; ++r)
    threads.emplace_back([&, r] {
      try {
        const std::unique_ptr<comm::Transport> transport = fabric.transport(r, R);
        ExpertStore store = ExpertStore::load(c, placement, r);
        if (spoil) spoil(store);
        Engine engine(c, *transport, topology, placement, store, workload);
        runs[r].rank = r;
        runs[r].first = engine.first_token();
        runs[r].count = engine.local_tokens();
        body(engine, runs[r]);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < R; ++r)
    if (errors[r]) {
      try {
        std::rethrow_exception(errors[r]);
      } catch (const std::exception& e) {
        ADD_FAILURE() << "rank " << r << ": " << e.what();
      }
    }
  EXPECT_EQ(fabric.in_flight(), 0u);
  return runs;
}

// The workload's steps on every rank.
std::vector<RankRun> run_steps(const Config& c, const placement::Placement& placement,
                               const placement::Topology& topology, std::uint64_t seed,
                               const std::function<void(ExpertStore&)>& spoil = {}) {
  return run_job(
      c, placement, topology, &shared_workload(), seed,
      [](Engine& engine, RankRun& run) {
        for (std::uint64_t s : kSteps) {
          RankStep step;
          step.rec = engine.run_step(s, step.hidden);
          const auto& calls = engine.calls_of_last_step();
          step.rows_in_calls = std::accumulate(calls.begin(), calls.end(), std::uint32_t{0});
          run.steps.push_back(std::move(step));
        }
      },
      spoil);
}

// The ranks' outputs of step i, by position.
std::vector<float> gather(const std::vector<RankRun>& runs, std::size_t i) {
  std::vector<float> out(kTokens * kHidden);
  for (const RankRun& run : runs) {
    EXPECT_EQ(run.steps[i].hidden.size(), run.count * kHidden);
    std::copy(run.steps[i].hidden.begin(), run.steps[i].hidden.end(), out.begin() + std::ptrdiff_t(run.first * kHidden));
  }
  return out;
}

void expect_same_bits(const std::vector<float>& want, const std::vector<float>& got, const std::string& what) {
  ASSERT_EQ(want.size(), got.size()) << what;
  for (std::size_t i = 0; i < want.size(); ++i)
    ASSERT_EQ(std::bit_cast<std::uint32_t>(want[i]), std::bit_cast<std::uint32_t>(got[i]))
        << what << ": position " << i / kHidden << " element " << i % kHidden << ": " << want[i] << " vs " << got[i];
}

// ---- workload steps -----------------------------------------------------------------------

// (case, overlap, micro-batches)
using Param = std::tuple<std::size_t, bool, int>;

class EngineJob : public ::testing::TestWithParam<Param> {
 protected:
  const Case& which() const { return cases()[std::get<0>(GetParam())]; }
  const Config c = engine_config(which(), std::get<1>(GetParam()), std::get<2>(GetParam()));
  const placement::Placement placement = which().make();
  const placement::Topology topology{which().island_of_rank};
};

TEST_P(EngineJob, OutputsHaveThePlainComputationsBits) {
  Plain plain(c);
  const std::vector<RankRun> runs = run_steps(c, placement, topology, std::get<0>(GetParam()) * 31 + 1);
  for (std::size_t i = 0; i < std::size(kSteps); ++i) {
    const std::vector<float> want = plain.step(kSteps[i]);
    expect_same_bits(want, gather(runs, i), "step " + std::to_string(kSteps[i]));
  }
}

TEST_P(EngineJob, RecordsAddUp) {
  Plain plain(c);
  const std::vector<RankRun> runs = run_steps(c, placement, topology, std::get<0>(GetParam()) * 31 + 2);
  const int R = placement.ranks();
  const bool cross_islands = topology.islands() > 1;
  if (which().top_p) {
    plain.step(kSteps[0]);
    ASSERT_GT(plain.singles, 0u) << "no token with a single expert: the fp32 answers go untested";
  }
  for (std::size_t i = 0; i < std::size(kSteps); ++i) {
    SCOPED_TRACE("step " + std::to_string(kSteps[i]));
    plain.step(kSteps[i]);
    std::uint64_t bytes_copied = 0, rows_in_calls = 0, token_layers = 0;
    std::array<std::uint64_t, placement::kLinkClasses> sent{};
    for (int r = 0; r < R; ++r) {
      SCOPED_TRACE("rank " + std::to_string(r));
      const StepRecord& rec = runs[r].steps[i].rec;
      for (double phase : {rec.route, rec.plan, rec.rows_wait, rec.experts, rec.answers_wait})
        EXPECT_GE(phase, 0.0);
      EXPECT_GE(rec.other, -1e-7);
      EXPECT_GT(rec.total, 0.0);
      EXPECT_LE(rec.route + rec.plan + rec.rows_wait + rec.experts + rec.answers_wait + rec.other, rec.total + 1e-7);
      EXPECT_EQ(rec.rows_wait_per_layer.size(), std::size_t(kLayers));
      EXPECT_EQ(rec.answers_wait_per_layer.size(), std::size_t(kLayers));
      EXPECT_NEAR(std::accumulate(rec.rows_wait_per_layer.begin(), rec.rows_wait_per_layer.end(), 0.0), rec.rows_wait,
                  1e-9);
      // Loads and pairs are the whole job's, on every rank.
      EXPECT_EQ(rec.expert_load, plain.load);
      EXPECT_EQ(rec.pairs, plain.pairs);
      EXPECT_EQ(rec.token_layers, runs[r].count * kLayers);
      EXPECT_EQ(rec.saturated, 0u);
      EXPECT_EQ(rec.bytes_sent[int(placement::LinkClass::SameRank)], 0u) << "a block to self travelled";
      bytes_copied += rec.bytes_copied;
      rows_in_calls += runs[r].steps[i].rows_in_calls;
      token_layers += rec.token_layers;
      for (int k = 0; k < placement::kLinkClasses; ++k) sent[k] += rec.bytes_sent[k];
    }
    EXPECT_EQ(token_layers, kTokens * kLayers);
    // Each pair is one row of one expert call somewhere, gathered into the call's input;
    // a row of a single pair also has its fp32 answer copied out.
    EXPECT_EQ(rows_in_calls, plain.pairs);
    const std::uint64_t row_bytes = kHidden * sizeof(float);
    if (R == 1) {
      EXPECT_EQ(bytes_copied, (plain.pairs + plain.singles) * row_bytes) << "one rank: nothing packed";
      EXPECT_EQ(sent, (std::array<std::uint64_t, placement::kLinkClasses>{}));
    } else {
      EXPECT_GT(bytes_copied, plain.pairs * row_bytes) << "rows packed into messages";
      EXPECT_GT(sent[int(placement::LinkClass::SameIsland)], 0u);
      EXPECT_EQ(sent[int(placement::LinkClass::CrossIsland)] > 0, cross_islands);
    }
  }
}

std::string name(const ::testing::TestParamInfo<Param>& info) {
  const auto [which, overlap, microbatches] = info.param;
  return std::string(cases()[which].name) + (overlap ? "Overlap" : "Serial") + "M" + std::to_string(microbatches);
}

INSTANTIATE_TEST_SUITE_P(Jobs, EngineJob,
                         ::testing::Combine(::testing::Range<std::size_t>(0, cases().size()), ::testing::Bool(),
                                            ::testing::Values(1, 2)),
                         name);

// ---- split experts ------------------------------------------------------------------------

// Experts split into shards over the ranks of one island (placement.h), with
// canonical F-chunks: outputs have the bits of the plain computation with the
// same chunks, and so of the same job without the split; each shard computes
// every row of its expert, so the calls hold S rows per pair of a split one.
struct ShardCase {
  const char* name;
  std::function<placement::Placement()> make;
  std::vector<int> island_of_rank;
  bool hierarchical = false;
  int ffn_chunks = 4;
};

// Each listed expert split into `shards` shards (0: one copy on all its
// ranks), held ranks.size() / shards times.
placement::Placement split(placement::Placement p, const std::vector<std::pair<int, std::vector<int>>>& experts,
                           int shards = 0) {
  for (int l = 0; l < p.layers(); ++l)
    for (const auto& [e, ranks] : experts) p.set_shards(l, e, ranks, shards);
  return p;
}

const std::vector<ShardCase>& shard_cases() {
  using placement::add_random_replicas, placement::contiguous, placement::shuffled;
  static const std::vector<ShardCase> all = {
      {"TwoRanks", [] { return split(contiguous(2, kLayers, kExperts), {{0, {0, 1}}, {4, {1, 0}}}); }, {0, 0}},
      {"TwoRanksEightChunks", [] { return split(contiguous(2, kLayers, kExperts), {{2, {1, 0}}}); }, {0, 0}, false, 8},
      {"FourRanksFourShards", [] { return split(shuffled(4, kLayers, kExperts, 3), {{5, {3, 1, 0, 2}}}); },
       {0, 0, 0, 0}},
      {"FourRanksTwoIslandsFlatReplicas",
       [] {
         return split(add_random_replicas(shuffled(4, kLayers, kExperts, 7), 4, 3), {{1, {0, 1}}, {4, {3, 2}}});
       },
       {0, 0, 1, 1}},
      {"FourRanksTwoIslandsHierarchicalReplicas",
       [] {
         return split(add_random_replicas(shuffled(4, kLayers, kExperts, 7), 4, 3), {{1, {0, 1}}, {4, {3, 2}}});
       },
       {0, 0, 1, 1}, true},
      {"FiveRanksUnevenIslandsHierarchical",
       [] { return split(shuffled(5, kLayers, kExperts, 9), {{0, {2, 0}}, {3, {4, 3}}}); }, {0, 0, 0, 1, 1},
       true},
      // Split and replicated: a copy of 2 shards on each island; each chunk to one copy.
      {"FourRanksTwoIslandsTwoCopiesFlat",
       [] { return split(shuffled(4, kLayers, kExperts, 7), {{1, {0, 1, 3, 2}}, {4, {2, 3, 1, 0}}}, 2); },
       {0, 0, 1, 1}},
      {"FourRanksTwoIslandsTwoCopiesHierarchical",
       [] { return split(shuffled(4, kLayers, kExperts, 7), {{1, {0, 1, 3, 2}}, {4, {2, 3, 1, 0}}}, 2); },
       {0, 0, 1, 1}, true},
      {"FourRanksOneIslandTwoCopies", [] { return split(contiguous(4, kLayers, kExperts), {{2, {0, 1, 2, 3}}}, 2); },
       {0, 0, 0, 0}},
      {"SixRanksThreeIslandsThreeCopiesHierarchical",
       [] { return split(shuffled(6, kLayers, kExperts, 11), {{3, {1, 0, 2, 3, 5, 4}}}, 2); }, {0, 0, 1, 1, 2, 2},
       true},
  };
  return all;
}

class EngineShards : public ::testing::TestWithParam<std::tuple<std::size_t, bool>> {
 protected:
  const ShardCase& which() const { return shard_cases()[std::get<0>(GetParam())]; }
  Config config() const {
    Case k{which().name, which().make, which().island_of_rank, which().hierarchical, true, true};
    Config c = engine_config(k, std::get<1>(GetParam()), 2);
    c.experts.ffn_chunks = which().ffn_chunks;
    validate_config(c);
    return c;
  }
};

TEST_P(EngineShards, OutputsHaveTheBitsOfTheUnsplitJob) {
  const Config c = config();
  const placement::Placement sharded = which().make();
  const placement::Topology topology(which().island_of_rank);
  ASSERT_TRUE(sharded.any_sharded());
  Plain plain(c);
  const std::vector<RankRun> runs = run_steps(c, sharded, topology, std::get<0>(GetParam()) * 7 + 1);
  // The same job with every split expert whole on its shard 0's rank.
  placement::Placement whole = sharded;
  for (int l = 0; l < kLayers; ++l)
    for (int e = 0; e < kExperts; ++e)
      if (whole.sharded(l, e)) whole.set_replicas(l, e, {whole.replicas(l, e)[0]});
  const std::vector<RankRun> unsplit = run_steps(c, whole, topology, 5);
  for (std::size_t i = 0; i < std::size(kSteps); ++i) {
    SCOPED_TRACE("step " + std::to_string(kSteps[i]));
    const std::vector<float> want = plain.step(kSteps[i]);
    expect_same_bits(want, gather(runs, i), "sharded");
    expect_same_bits(want, gather(unsplit, i), "unsplit");
    std::uint64_t extra_rows = 0;  // every shard computes its expert's rows
    for (int l = 0; l < kLayers; ++l)
      for (int e = 0; e < kExperts; ++e)
        extra_rows += std::uint64_t(sharded.shards(l, e) - 1) * plain.load[std::size_t(l) * kExperts + e];
    ASSERT_GT(extra_rows, 0u) << "no token met a split expert";
    std::uint64_t rows_in_calls = 0;
    for (const RankRun& run : runs) {
      rows_in_calls += run.steps[i].rows_in_calls;
      EXPECT_EQ(run.steps[i].rec.saturated, 0u);
      EXPECT_EQ(run.steps[i].rec.pairs, plain.pairs) << "a split expert's pair is one pair";
    }
    EXPECT_EQ(rows_in_calls, plain.pairs + extra_rows);
  }
}

INSTANTIATE_TEST_SUITE_P(Jobs, EngineShards,
                         ::testing::Combine(::testing::Range<std::size_t>(0, shard_cases().size()), ::testing::Bool()),
                         [](const ::testing::TestParamInfo<std::tuple<std::size_t, bool>>& info) {
                           return std::string(shard_cases()[std::get<0>(info.param)].name) +
                                  (std::get<1>(info.param) ? "Overlap" : "Serial");
                         });

// An expert whose weights hold a NaN or an inf (loaded with
// [model].check_finite off): every token it serves gets NaN outputs, as in
// the plain computation, the others keep their bits; the rank computing it
// counts the bad terms per (layer, expert), and over the ranks they add up
// to the plain count (the NaN tokens then poison the experts of layer 2 too).
class EngineNonFinite : public ::testing::TestWithParam<std::tuple<std::size_t, float>> {};

TEST_P(EngineNonFinite, BadExpertGivesNanOutputsAndCounts) {
  const auto [which, bad_value] = GetParam();
  const Case& k = cases()[which];
  const Config c = engine_config(k, true, 2);
  constexpr int kBadLayer = 1, kBadExpert = 2;
  const auto spoil = [bad = bad_value](ExpertStore& store) {
    if (!store.holds(kBadLayer, kBadExpert)) return;
    std::vector<float> w(store.slot_bytes() / sizeof(float));  // fp32 experts: the bytes are floats
    store.copy_slot(kBadLayer, kBadExpert, reinterpret_cast<std::uint8_t*>(w.data()));
    w[3] = bad;  // w1 row 0: the hidden unit 0 of every row, then every output through w2
    store.drop_slot(kBadLayer, kBadExpert);
    store.add_slot(kBadLayer, kBadExpert, reinterpret_cast<const std::uint8_t*>(w.data()));
  };
  Plain plain(c, spoil);
  const std::vector<RankRun> runs = run_steps(c, k.make(), placement::Topology(k.island_of_rank), 17, spoil);
  const std::uint32_t bad_key = kBadLayer * kExperts + kBadExpert;
  for (std::size_t i = 0; i < std::size(kSteps); ++i) {
    SCOPED_TRACE("step " + std::to_string(kSteps[i]));
    const std::vector<float> want = plain.step(kSteps[i]);
    const std::vector<float> got = gather(runs, i);
    expect_same_bits(want, got, "outputs");
    std::size_t nan_tokens = 0;
    for (std::size_t t = 0; t < kTokens; ++t) nan_tokens += std::isnan(got[t * kHidden]);
    ASSERT_GT(plain.load[bad_key], 0u) << "no token routed to the bad expert";
    EXPECT_EQ(nan_tokens, plain.load[bad_key]) << "a token of the bad expert came out finite, or another did not";
    EXPECT_EQ(plain.nonfinite[bad_key], plain.load[bad_key] * kHidden);
    std::map<std::uint32_t, std::uint64_t> counted;
    for (const RankRun& run : runs)
      for (const auto& [key, terms] : run.steps[i].rec.nonfinite) {
        EXPECT_GT(terms, 0u);
        counted[key] += terms;
      }
    EXPECT_EQ(counted, plain.nonfinite);
    for (const RankRun& run : runs) EXPECT_EQ(run.steps[i].rec.saturated, 0u) << "NaN is no saturation";
  }
}

INSTANTIATE_TEST_SUITE_P(Jobs, EngineNonFinite,
                         ::testing::Combine(::testing::Values(0, 1, 3, 5, 6),
                                            ::testing::Values(std::numeric_limits<float>::quiet_NaN(),
                                                              std::numeric_limits<float>::infinity())),
                         [](const ::testing::TestParamInfo<std::tuple<std::size_t, float>>& info) {
                           return std::string(cases()[std::get<0>(info.param)].name) +
                                  (std::isnan(std::get<1>(info.param)) ? "Nan" : "Inf");
                         });

// OpenBLAS: a row's bits depend on the rows of its call, but the calls are
// whole canonical chunks, so every job gives the bits of the one-rank run.
class EngineOpenBlas : public ::testing::TestWithParam<std::size_t> {};

TEST_P(EngineOpenBlas, BitsEqualTheOneRankRun) {
  const Case& k = cases()[GetParam()];
  Config c = engine_config(k, true, 2);
  c.experts.gemm = Gemm::openblas;
  const std::vector<RankRun> one =
      run_steps(c, placement::contiguous(1, kLayers, kExperts), placement::Topology({0}), 1);
  const std::vector<RankRun> here = run_steps(c, k.make(), placement::Topology(k.island_of_rank), 2);
  for (std::size_t i = 0; i < std::size(kSteps); ++i)
    expect_same_bits(gather(one, i), gather(here, i), "step " + std::to_string(kSteps[i]));
}

std::string case_name(const ::testing::TestParamInfo<std::size_t>& info) { return cases()[info.param].name; }

INSTANTIATE_TEST_SUITE_P(Jobs, EngineOpenBlas, ::testing::Values(3, 6), case_name);

// ---- the front door's layers --------------------------------------------------------------

// Rows of rank r for layer l: a different count per rank and layer, none at
// all for layer 1 on any rank; each row is a distinct token.
std::size_t rows_of(int r, int l) { return l == 1 ? 0 : std::size_t(r * 3 + l * 5 + 1) % 7; }
float row_value(int r, int l, std::size_t row, int i) {
  return CounterRng(std::uint64_t(r) * 1000 + std::uint64_t(l)).normalish(row * kHidden + std::size_t(i));
}

class EngineLayers : public ::testing::TestWithParam<std::size_t> {};

TEST_P(EngineLayers, EachLayersRowsGetThatLayerAlone) {
  const Case& k = cases()[GetParam()];
  Config c = engine_config(k, true, 2);
  const placement::Placement placement = k.make();
  const int R = placement.ranks();
  constexpr std::uint64_t kStep = 9;
  std::vector<std::vector<std::vector<float>>> out(static_cast<std::size_t>(R));  // [rank][layer] rows
  std::vector<std::vector<std::uint32_t>> agreed(static_cast<std::size_t>(R));
  std::vector<StepRecord> recs(static_cast<std::size_t>(R));
  // No workload: the rows come with their layer.
  run_job(c, placement, placement::Topology(k.island_of_rank), nullptr, GetParam() + 100, [&](Engine& engine, RankRun& run) {
    const int r = run.rank;
    std::vector<std::vector<float>>& x = out[r];
    std::vector<Engine::LayerRows> layers(kLayers);
    x.resize(kLayers);
    for (int l = 0; l < kLayers; ++l) {
      x[l].resize(rows_of(r, l) * kHidden);
      for (std::size_t t = 0; t < rows_of(r, l); ++t)
        for (int i = 0; i < kHidden; ++i) x[l][t * kHidden + i] = row_value(r, l, t, i);
      layers[l].x = x[l].data();
      layers[l].rows = rows_of(r, l);
    }
    agreed[r] = engine.agree_layer_counts(layers, kStep);
    recs[r] = engine.run_layers(kStep, layers, agreed[r]);
  });

  Plain plain(c);
  std::vector<std::uint32_t> want_counts;
  for (int r = 0; r < R; ++r)
    for (int l = 0; l < kLayers; ++l) want_counts.push_back(std::uint32_t(rows_of(r, l)));
  for (int r = 0; r < R; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    EXPECT_EQ(agreed[r], want_counts);
    std::uint64_t rows = 0;
    for (int l = 0; l < kLayers; ++l) {
      std::vector<float> want(rows_of(r, l) * kHidden);
      for (std::size_t t = 0; t < rows_of(r, l); ++t) {
        for (int i = 0; i < kHidden; ++i) want[t * kHidden + i] = row_value(r, l, t, i);
        plain.layer(l, want.data() + t * kHidden);
      }
      expect_same_bits(want, out[r][l], "layer " + std::to_string(l));
      rows += rows_of(r, l);
    }
    EXPECT_EQ(recs[r].token_layers, rows);
    // Layer 1 has rows nowhere: no collective, no record.
    EXPECT_EQ(recs[r].rows_wait_per_layer.size(), std::size_t(kLayers - 1));
  }
}

INSTANTIATE_TEST_SUITE_P(Jobs, EngineLayers, ::testing::Values(0, 3, 5), case_name);

// ---- router policies ----------------------------------------------------------------------

// With a router policy on (runtime/router/policies/), a token's routing
// depends on the step's other tokens, so the reference is the one-rank job
// of the same config: every rank count, placement (without replicas: they
// add capacity), order and route must give its bits, and the policies' counts
// summed over ranks must be its counts. Two requests' positions per token
// slot: step 2 serves position 0, step 3 position 1 (smoothing's turn).
struct PolicyCase {
  const char* name;
  std::function<void(Config&)> set;
};

const std::vector<PolicyCase>& policy_cases() {
  static const std::vector<PolicyCase> all = {
      {"Smoothing", [](Config& c) { c.router.smoothing_beta = 2.0; }},
      {"Drop", [](Config& c) { c.router.load_policy = LoadPolicy::drop, c.router.capacity_factor = 0.8; }},
      {"Demote", [](Config& c) { c.router.load_policy = LoadPolicy::demote, c.router.capacity_factor = 1.0; }},
      {"DemoteToTarget", [](Config& c) {
         c.router.load_policy = LoadPolicy::demote, c.router.demotion_target = 0.1, c.router.demotion_candidates = 4;
       }},
      {"Bias", [](Config& c) { c.router.bias_gamma = 0.5; }},
      {"AllWithJitter", [](Config& c) {
         c.router.smoothing_beta = 0.5, c.router.load_policy = LoadPolicy::demote, c.router.bias_gamma = 0.1;
         c.router.measure_jitter = true;
       }},
  };
  return all;
}

// (policy, case): cases without replicas.
class EnginePolicies : public ::testing::TestWithParam<std::tuple<std::size_t, std::size_t>> {};

TEST_P(EnginePolicies, EveryJobHasTheOneRankJobsBitsAndCounts) {
  const PolicyCase& p = policy_cases()[std::get<0>(GetParam())];
  const Case& k = cases()[std::get<1>(GetParam())];
  Config c = engine_config(k, true, 2);
  c.workload.positions_per_request = 2;
  Config off = c;
  p.set(c);
  validate_config(c);
  const auto one_rank = [](const Config& config, std::uint64_t seed) {
    return run_steps(config, placement::contiguous(1, kLayers, kExperts), placement::Topology({0}), seed);
  };
  const std::vector<RankRun> one = one_rank(c, 1), plain = one_rank(off, 2);
  const std::vector<RankRun> here = run_steps(c, k.make(), placement::Topology(k.island_of_rank), 3);
  bool changed = false, pairs_changed = false;
  for (std::size_t i = 0; i < std::size(kSteps); ++i) {
    expect_same_bits(gather(one, i), gather(here, i), "step " + std::to_string(kSteps[i]));
    changed = changed || gather(one, i) != gather(plain, i);
    RouterCounters sum;
    for (const RankRun& run : here) sum.add(run.steps[i].rec.router);
    EXPECT_EQ(sum.words(), one[0].steps[i].rec.router.words()) << "step " << kSteps[i];
    if (c.router.load_policy != LoadPolicy::none) {
      EXPECT_EQ(sum.tokens, kTokens * kLayers);
    }
    if (c.router.measure_jitter) {
      EXPECT_EQ(sum.jitter_tested, kTokens * kLayers);
    }
    // The router's own pairs the balancing policies changed: a drop loses
    // exactly the pairs it drops; a demotion at most the pairs it moves.
    const bool rebalances = c.router.load_policy != LoadPolicy::none || c.router.bias_gamma > 0;
    EXPECT_EQ(sum.selected > 0, rebalances);
    EXPECT_LE(sum.changed, sum.selected);
    if (c.router.load_policy == LoadPolicy::drop) {
      EXPECT_EQ(sum.changed, sum.dropped);
    }
    if (c.router.load_policy == LoadPolicy::demote && c.router.bias_gamma == 0) {
      EXPECT_LE(sum.changed, sum.moved);
    }
    pairs_changed = pairs_changed || sum.changed > 0;
  }
  EXPECT_TRUE(changed) << "the policy changed no output: the test would prove nothing";
  if (c.router.load_policy != LoadPolicy::none || c.router.bias_gamma > 0) {
    EXPECT_TRUE(pairs_changed) << "outputs changed but no pair was counted as changed";
  }
}

INSTANTIATE_TEST_SUITE_P(Jobs, EnginePolicies,
                         ::testing::Combine(::testing::Range<std::size_t>(0, 6), ::testing::Values(1, 2, 3)),
                         [](const ::testing::TestParamInfo<std::tuple<std::size_t, std::size_t>>& info) {
                           return std::string(policy_cases()[std::get<0>(info.param)].name) +
                                  cases()[std::get<1>(info.param)].name;
                         });

}  // namespace
}  // namespace moed::runtime
