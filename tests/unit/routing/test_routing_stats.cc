// Routing statistics: hand-computed counts, decay and renormalisation, merging
// ranks, the path sample, statistics of the Mixtral trace, the DeepSeek-V3
// memory figure and the serving path's promise not to allocate. Stats files
// are in test_stats_file.cc.
#include "routing/routing_stats.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <string>
#include <vector>

#include "common/error.h"
#include "tests/unit/routing/stats_checks.h"
#include "tests/unit/test_support.h"

// Counts every allocation of this test binary, so that the serving path's
// promise (add_choice, add_transition, add_sample, end_step allocate nothing)
// can be checked. Plain malloc/free underneath: other tests see no change.
namespace {
std::atomic<std::uint64_t> g_allocations{0};
}  // namespace

// Not inlined: GCC would otherwise see free() on what `new` returned and warn.
[[gnu::noinline]] void* operator new(std::size_t size) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}
[[gnu::noinline]] void operator delete(void* p) noexcept { std::free(p); }
[[gnu::noinline]] void operator delete(void* p, std::size_t) noexcept { std::free(p); }

namespace moed::routing {
namespace {

using checks::expect_close;
using checks::expect_identical;
using checks::feed;
using test::expect_error;
using Experts = std::vector<std::uint32_t>;

const std::string kDataDir = MOED_TEST_DATA_DIR;

// --------------------------------------------------------------- helpers

// A small deterministic generator (the same numbers everywhere).
class Lcg {
 public:
  explicit Lcg(std::uint64_t seed) : state_(seed) {}
  std::uint32_t below(std::uint32_t n) {
    state_ = state_ * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<std::uint32_t>((state_ >> 33) % n);
  }
  // k distinct experts of n.
  Experts choose(std::uint32_t k, std::uint32_t n) {
    Experts out;
    while (out.size() < k) {
      std::uint32_t e = below(n);
      if (std::find(out.begin(), out.end(), e) == out.end()) out.push_back(e);
    }
    return out;
  }

 private:
  std::uint64_t state_;
};

std::vector<Experts> random_path(Lcg& rng, int layers, int experts, int k) {
  std::vector<Experts> path;
  for (int l = 0; l < layers; ++l)
    path.push_back(rng.choose(static_cast<std::uint32_t>(k), static_cast<std::uint32_t>(experts)));
  return path;
}

// ------------------------------------------------------------ counting

// 2 layers x 4 experts, three tokens:
//   t0: layer 0 {0, 1}, layer 1 {2, 3}
//   t1: layer 0 {1, 2}, layer 1 {2}
//   t2: layer 0 {0, 1}, layer 1 {3, 0}
RoutingStats tiny() {
  RoutingStats stats(2, 4, 0.0, 8, 2);
  feed(stats, {{0, 1}, {2, 3}});
  feed(stats, {{1, 2}, {2}});
  feed(stats, {{0, 1}, {3, 0}});
  return stats;
}

TEST(RoutingStats, HandComputedCountsOfATinyCase) {
  RoutingStats stats = tiny();
  EXPECT_EQ(stats.tokens(0), 3.0);
  EXPECT_EQ(stats.tokens(1), 3.0);

  const double load[2][4] = {{2, 3, 1, 0}, {1, 0, 2, 2}};
  for (int l = 0; l < 2; ++l)
    for (int e = 0; e < 4; ++e) EXPECT_EQ(stats.load(l, e), load[l][e]) << l << " " << e;

  // Co-activation, every ordered pair (the matrix is symmetric, 0 on the diagonal).
  const double coact[2][4][4] = {
      {{0, 2, 0, 0}, {2, 0, 1, 0}, {0, 1, 0, 0}, {0, 0, 0, 0}},
      {{0, 0, 0, 1}, {0, 0, 0, 0}, {0, 0, 0, 1}, {1, 0, 1, 0}},
  };
  for (int l = 0; l < 2; ++l)
    for (int a = 0; a < 4; ++a)
      for (int b = 0; b < 4; ++b)
        EXPECT_EQ(stats.coactivation(l, a, b), coact[l][a][b]) << l << " " << a << " " << b;

  // Affinity layer 0 -> 1: t0 adds 0->2 0->3 1->2 1->3, t1 1->2 2->2, t2 0->3 0->0 1->3 1->0.
  const double affinity[4][4] = {{1, 0, 1, 2}, {1, 0, 2, 2}, {0, 0, 1, 0}, {0, 0, 0, 0}};
  for (int a = 0; a < 4; ++a)
    for (int b = 0; b < 4; ++b) EXPECT_EQ(stats.affinity(0, a, b), affinity[a][b]) << a << " " << b;

  // The raw layout: loads, triangles, squares, tokens.
  EXPECT_EQ(stats.raw().size(), 2u * 4 + 2 * 6 + 1 * 16 + 2);
  EXPECT_EQ(stats.raw()[1], 3.0);                     // load (0, 1)
  EXPECT_EQ(stats.raw()[4 + 2], 2.0);                 // load (1, 2)
  EXPECT_EQ(stats.raw()[8 + 0], 2.0);                 // co-activation (0; 0, 1)
  EXPECT_EQ(stats.raw()[8 + 6 + 5], 1.0);             // co-activation (1; 2, 3), the last pair
  EXPECT_EQ(stats.raw()[8 + 12 + 1 * 4 + 2], 2.0);   // affinity (0; 1, 2)
  EXPECT_EQ(stats.raw()[8 + 12 + 16 + 1], 3.0);      // tokens of layer 1
  EXPECT_EQ(stats.steps(), 0u);
}

TEST(RoutingStats, RefusesWhatTheRouterNeverProduces) {
  RoutingStats stats = tiny();
  const Experts out_of_range{0, 4}, twice{1, 1}, fine{0, 1};
  expect_error([&] { stats.add_choice(0, out_of_range); }, ErrorKind::Internal, {"expert 4 of 4"});
  expect_error([&] { stats.add_choice(0, twice); }, ErrorKind::Internal, {"expert 1 twice"});
  expect_error([&] { stats.add_choice(2, fine); }, ErrorKind::Internal, {"layer 2"});
  expect_error([&] { stats.add_choice(-1, fine); }, ErrorKind::Internal, {"layer -1"});
  expect_error([&] { stats.add_transition(1, fine, fine); }, ErrorKind::Internal, {"layer 1"});
  expect_error([&] { stats.add_transition(0, fine, twice); }, ErrorKind::Internal, {"twice"});
  expect_error([&] { stats.affinity(1, 0, 0); }, ErrorKind::Internal, {"last layer"});
  expect_error([&] { stats.load(0, 4); }, ErrorKind::Internal, {});
  expect_error([&] { stats.coactivation(0, 4, 4); }, ErrorKind::Internal, {});
  expect_error([&] { stats.tokens(2); }, ErrorKind::Internal, {});

  const Experts three{0, 1, 2};
  std::vector<std::span<const std::uint32_t>> too_many{three, fine}, short_path{fine};
  expect_error([&] { stats.add_sample(too_many); }, ErrorKind::Internal, {"more than max_k 2"});
  expect_error([&] { stats.add_sample(short_path); }, ErrorKind::Internal, {"1 layers"});
  std::vector<std::uint32_t> bad_cells{3, 0, 1, 0, 0, 0};  // count 3 > max_k 2
  expect_error([&] { stats.append_sample_cells(bad_cells); }, ErrorKind::Internal, {"max_k"});
  std::vector<std::uint32_t> half_path{1, 0, 0};
  expect_error([&] { stats.append_sample_cells(half_path); }, ErrorKind::Internal, {"whole paths"});

  // Refused calls changed nothing.
  expect_identical(stats, tiny());
  EXPECT_EQ(stats.sample_cells(), tiny().sample_cells());
  expect_error([] { RoutingStats(0, 4, 0); }, ErrorKind::Internal, {});
  expect_error([] { RoutingStats(2, 4, -1); }, ErrorKind::Internal, {"half-life"});
  expect_error([] { RoutingStats(2, 4, 0, 0, 0); }, ErrorKind::Internal, {"max_k"});
}

// ------------------------------------------------------------------ decay

// A count added `age` steps ago against one added now.
double ratio_after(double half_life, int age) {
  RoutingStats stats(1, 2, half_life);
  const Experts old{0}, now{1};
  stats.add_choice(0, old);
  for (int s = 0; s < age; ++s) stats.end_step();
  stats.add_choice(0, now);
  EXPECT_EQ(stats.steps(), static_cast<std::uint64_t>(age));
  return stats.load(0, 0) / stats.load(0, 1);
}

TEST(RoutingStats, ACountOneHalfLifeOldWeighsHalf) {
  for (double h : {1.0, 2.0, 3.0, 7.5, 100.0}) {
    EXPECT_NEAR(ratio_after(h, static_cast<int>(std::ceil(h))),
                std::exp2(-std::ceil(h) / h), 1e-12 * std::exp2(-std::ceil(h) / h))
        << "half-life " << h;
  }
  EXPECT_NEAR(ratio_after(1, 1), 0.5, 0.5e-12);
  EXPECT_NEAR(ratio_after(2, 2), 0.5, 0.5e-12);
  EXPECT_NEAR(ratio_after(2, 1), std::sqrt(0.5), 1e-12);
  EXPECT_NEAR(ratio_after(2, 4), 0.25, 0.25e-12);
  EXPECT_NEAR(ratio_after(100, 100), 0.5, 0.5e-12);
  // Half-life 0: plain counts, however many steps pass.
  EXPECT_EQ(ratio_after(0, 1000), 1.0);
  RoutingStats plain(1, 2, 0);
  const Experts e{0, 1};
  for (int s = 0; s < 1000; ++s) {
    plain.add_choice(0, e);
    plain.end_step();
  }
  EXPECT_EQ(plain.load(0, 0), 1000.0);
  EXPECT_EQ(plain.coactivation(0, 1, 0), 1000.0);
  EXPECT_EQ(plain.tokens(0), 1000.0);
}

TEST(RoutingStats, DecayTouchesEveryStatisticAlike) {
  RoutingStats stats(2, 4, 1.0);
  feed(stats, {{0, 1}, {2, 3}});
  stats.end_step();
  feed(stats, {{0, 1}, {2, 3}});
  // 1/2 (the old token) + 1 (the new one).
  EXPECT_NEAR(stats.load(0, 0), 1.5, 1e-15);
  EXPECT_NEAR(stats.coactivation(0, 0, 1), 1.5, 1e-15);
  EXPECT_NEAR(stats.affinity(0, 1, 3), 1.5, 1e-15);
  EXPECT_NEAR(stats.tokens(1), 1.5, 1e-15);
  EXPECT_EQ(stats.load(0, 2), 0.0);
}

// Adds one token per step for `steps` steps; returns the statistics.
RoutingStats steady(double half_life, int steps) {
  RoutingStats stats(2, 3, half_life);
  const Experts a{0, 2}, b{1};
  for (int s = 0; s < steps; ++s) {
    stats.add_choice(0, a);
    stats.add_transition(0, a, b);
    stats.end_step();
  }
  return stats;
}

TEST(RoutingStats, RenormalisesOverLongRunsWithoutLosingAccuracy) {
  for (double h : {1.0, 10.0}) {
    const int n = 10000;
    RoutingStats stats = steady(h, n);
    // The count added s steps before the end weighs g^-s, s = 1..n: a geometric sum.
    const double g = std::exp2(1.0 / h);
    const double expected = (1 - std::pow(g, -n)) / (g - 1);
    SCOPED_TRACE("half-life " + std::to_string(h));
    EXPECT_EQ(stats.steps(), static_cast<std::uint64_t>(n));
    EXPECT_NEAR(stats.load(0, 0), expected, 1e-12 * expected);
    EXPECT_NEAR(stats.coactivation(0, 2, 0), expected, 1e-12 * expected);
    EXPECT_NEAR(stats.affinity(0, 2, 1), expected, 1e-12 * expected);
    EXPECT_NEAR(stats.tokens(0), expected, 1e-12 * expected);
    // The stored values never left a sane range (they are renormalised past 2^64).
    for (double v : stats.raw()) {
      EXPECT_TRUE(std::isfinite(v));
      EXPECT_LE(v, 0x1p64 * 2 * expected);
    }
  }
}

TEST(RoutingStats, NormalizeBringsStoredValuesToWhatTheAccessorsReturn) {
  RoutingStats stats = steady(3.0, 20);
  const double before = stats.load(0, 0);
  EXPECT_NE(stats.raw()[0], before);  // raw values carry the weight of now
  stats.normalize();
  EXPECT_EQ(stats.raw()[0], before);
  EXPECT_EQ(stats.load(0, 0), before);
  // Decay goes on from there.
  stats.end_step();
  stats.end_step();
  stats.end_step();
  EXPECT_NEAR(stats.load(0, 0), before / 2, 1e-15 * before);
}

// ---------------------------------------------------------------- merging

// Two ranks each see their own tokens; one rank sees both streams. After
// normalize(), the ranks' raw arrays add up to the single rank's statistics.
void check_merge(double half_life, bool exact) {
  const int layers = 3, experts = 6, k = 2, steps = 40;
  RoutingStats rank0(layers, experts, half_life, 64, k), rank1(layers, experts, half_life, 64, k),
      single(layers, experts, half_life, 128, k);
  Lcg rng(7);
  for (int s = 0; s < steps; ++s) {
    for (int t = 0; t < 5; ++t) {
      auto path = random_path(rng, layers, experts, k);
      feed(t % 2 ? rank1 : rank0, path);
      feed(single, path);
    }
    rank0.end_step();
    rank1.end_step();
    single.end_step();
  }
  rank0.normalize();
  rank1.normalize();
  ASSERT_EQ(rank0.raw().size(), rank1.raw().size());
  for (std::size_t i = 0; i < rank0.raw().size(); ++i) rank0.raw()[i] += rank1.raw()[i];
  if (exact)
    expect_identical(rank0, single);
  else
    expect_close(rank0, single, 1e-12);

  // The samples gather too: every path of both ranks, none lost.
  RoutingStats gathered(layers, experts, half_life, 128, k);
  gathered.append_sample(rank0);
  gathered.append_sample_cells(rank1.sample_cells());
  EXPECT_EQ(gathered.sample_size(), 128u);
  EXPECT_EQ(gathered.sample_trace().tokens(), 128u);
}

TEST(RoutingStats, MergingRanksEqualsOneRankFedBothStreams) {
  check_merge(0.0, true);
  check_merge(3.0, false);
  check_merge(1.0, false);
}

// ----------------------------------------------------------------- sample

// Path number i: layer 0 {i % 4}, layer 1 {(i + 1) % 4, (i + 2) % 4}.
std::vector<Experts> numbered(std::uint32_t i) { return {{i % 4}, {(i + 1) % 4, (i + 2) % 4}}; }

TEST(RoutingStats, SampleKeepsTheLastPathsOldestFirst) {
  RoutingStats stats(2, 4, 0.0, 3, 2);
  EXPECT_EQ(stats.sample_size(), 0u);
  EXPECT_EQ(stats.sample_trace().tokens(), 0u);
  for (std::uint32_t i = 0; i < 2; ++i) feed(stats, numbered(i));
  EXPECT_EQ(stats.sample_size(), 2u);
  for (std::uint32_t i = 2; i < 8; ++i) feed(stats, numbered(i));
  EXPECT_EQ(stats.sample_size(), 3u);  // capacity

  // Paths 5, 6, 7 as cells of max_k + 1 u32: count, experts, zero padding.
  const std::vector<std::uint32_t> cells{1, 1, 0, 2, 2, 3,   //
                                         1, 2, 0, 2, 3, 0,   //
                                         1, 3, 0, 2, 0, 1};
  EXPECT_EQ(stats.sample_cells(), cells);
  RoutingTrace trace = stats.sample_trace();
  ASSERT_EQ(trace.tokens(), 3u);
  for (std::uint32_t t = 0; t < 3; ++t) {
    auto path = numbered(5 + t);
    for (int l = 0; l < 2; ++l) {
      auto cell = trace.at(t, l);
      ASSERT_EQ(cell.size(), path[l].size());
      for (std::size_t i = 0; i < cell.size(); ++i) EXPECT_EQ(cell[i].expert, path[l][i]);
    }
  }
  // Reading the cells put the ring in order; sampling goes on from there.
  feed(stats, numbered(8));
  EXPECT_EQ(stats.sample_trace().at(0, 0)[0].expert, 6u % 4);
  EXPECT_EQ(stats.sample_trace().at(2, 0)[0].expert, 8u % 4);

  RoutingStats none(2, 4, 0.0, 0, 2);
  feed(none, numbered(1));
  EXPECT_EQ(none.sample_size(), 0u);
  EXPECT_TRUE(none.sample_cells().empty());
}

TEST(RoutingStats, SampleTraceHasTheShapeWeightsAndEmptyCells) {
  RoutingStats stats(3, 5, 0.0, 4, 3);
  const Experts three{4, 0, 2}, one{3}, none{};
  stats.add_sample({three, none, one});
  stats.add_sample({one, three, none});
  RoutingTrace trace = stats.sample_trace();
  EXPECT_EQ(trace.layers(), 3);
  EXPECT_EQ(trace.experts(), 5);
  EXPECT_EQ(trace.tokens(), 2u);
  EXPECT_EQ(trace.top_k(), 3);
  ASSERT_EQ(trace.at(0, 0).size(), 3u);
  EXPECT_EQ(trace.at(0, 0)[0], (RoutingChoice{4, 1.0f / 3}));
  EXPECT_EQ(trace.at(0, 0)[2], (RoutingChoice{2, 1.0f / 3}));
  EXPECT_TRUE(trace.at(0, 1).empty());
  EXPECT_EQ(trace.at(0, 2)[0], (RoutingChoice{3, 1.0f}));
  EXPECT_TRUE(trace.at(1, 2).empty());
  // The sample is not the aggregates: nothing was counted.
  EXPECT_EQ(stats.tokens(0), 0.0);
}

TEST(RoutingStats, AppendedSamplesAreRingLimitedAndMayComeFromAnotherMaxK) {
  RoutingStats wide(2, 4, 0.0, 10, 3), narrow(2, 4, 0.0, 4, 2);
  for (std::uint32_t i = 0; i < 6; ++i) feed(wide, numbered(i));
  narrow.append_sample(wide);  // cells of 4 u32 into cells of 3
  EXPECT_EQ(narrow.sample_size(), 4u);
  RoutingTrace trace = narrow.sample_trace();
  for (std::uint32_t t = 0; t < 4; ++t) {
    EXPECT_EQ(trace.at(t, 0)[0].expert, (t + 2) % 4);
    EXPECT_EQ(trace.at(t, 1)[1].expert, (t + 4) % 4);
  }
  narrow.append_sample(narrow);  // its own paths again: the ring holds the same four
  EXPECT_EQ(narrow.sample_size(), 4u);
  EXPECT_EQ(narrow.sample_trace().at(0, 0)[0].expert, 2u);

  RoutingStats too_narrow(2, 4, 0.0, 4, 1);
  expect_error([&] { too_narrow.append_sample(wide); }, ErrorKind::Internal, {"max_k 1"});
  RoutingStats other_shape(3, 4, 0.0, 4, 2);
  expect_error([&] { other_shape.append_sample(wide); }, ErrorKind::Internal, {});
}

// ------------------------------------------------------ the Mixtral trace

TEST(RoutingStats, FromTraceCountsTheMixtralTraceExactly) {
  const RoutingTrace trace = read_trace(kDataDir + "/mixtral-humaneval.trace");
  ASSERT_EQ(trace.layers(), 32);
  ASSERT_EQ(trace.experts(), 8);
  ASSERT_EQ(trace.tokens(), 338u);
  const RoutingStats stats = RoutingStats::from_trace(trace, 0, trace.tokens());
  EXPECT_EQ(stats.half_life_steps(), 0.0);
  EXPECT_EQ(stats.sample_size(), 338u);

  // Plain counts over the trace, by loops that share nothing with the class.
  std::vector<std::array<std::array<double, 8>, 8>> coact(32), affinity(32);
  std::vector<std::size_t> non_empty(32, 0);
  for (std::size_t t = 0; t < trace.tokens(); ++t)
    for (int l = 0; l < 32; ++l) {
      auto cell = trace.at(t, l);
      non_empty[l] += !cell.empty();
      for (auto& a : cell)
        for (auto& b : cell)
          if (a.expert != b.expert) coact[l][a.expert][b.expert] += 1;
      if (l + 1 < 32)
        for (auto& a : cell)
          for (auto& b : trace.at(t, l + 1)) affinity[l][a.expert][b.expert] += 1;
    }
  std::size_t total_non_empty = 0;
  for (int l = 0; l < 32; ++l) {
    double loads = 0;
    for (int e = 0; e < 8; ++e) loads += stats.load(l, e);
    EXPECT_EQ(loads, 2.0 * non_empty[l]) << "layer " << l;
    EXPECT_EQ(stats.tokens(l), static_cast<double>(non_empty[l])) << "layer " << l;
    total_non_empty += non_empty[l];
    for (int a = 0; a < 8; ++a)
      for (int b = 0; b < 8; ++b) {
        EXPECT_EQ(stats.coactivation(l, a, b), coact[l][a][b]) << l << " " << a << " " << b;
        if (l + 1 < 32) {
          EXPECT_EQ(stats.affinity(l, a, b), affinity[l][a][b]) << l << " " << a << " " << b;
        }
      }
  }
  EXPECT_EQ(total_non_empty, 32u * 338 - 37);  // the README's 37 empty cells

  // The sample is the trace, experts for experts, empty cells included.
  RoutingTrace sample = stats.sample_trace();
  ASSERT_EQ(sample.tokens(), 338u);
  EXPECT_EQ(sample.top_k(), 2);
  for (std::size_t t = 0; t < 338; ++t)
    for (int l = 0; l < 32; ++l) {
      auto x = trace.at(t, l), y = sample.at(t, l);
      ASSERT_EQ(x.size(), y.size()) << t << " " << l;
      for (std::size_t i = 0; i < x.size(); ++i) EXPECT_EQ(x[i].expert, y[i].expert);
    }
}

TEST(RoutingStats, FromTraceOfAWindowCountsOnlyThoseTokens) {
  const RoutingTrace trace = read_trace(kDataDir + "/mixtral-humaneval.trace");
  const RoutingStats head = RoutingStats::from_trace(trace, 0, 83);
  const RoutingStats tail = RoutingStats::from_trace(trace, 83, 255);
  const RoutingStats all = RoutingStats::from_trace(trace, 0, 338);
  EXPECT_EQ(head.sample_size(), 83u);
  ASSERT_FALSE(trace.at(83, 0).empty());
  EXPECT_EQ(tail.sample_trace().at(0, 0)[0].expert, trace.at(83, 0)[0].expert);
  for (std::size_t i = 0; i < all.raw().size(); ++i)
    EXPECT_EQ(head.raw()[i] + tail.raw()[i], all.raw()[i]) << "value " << i;
  EXPECT_EQ(RoutingStats::from_trace(trace, 338, 0).sample_size(), 0u);
  expect_error([&] { RoutingStats::from_trace(trace, 300, 39); }, ErrorKind::Internal, {});
}

// -------------------------------------------------- DeepSeek-V3 at scale

// The memory bound the header states, at DeepSeek-V3's shape (timing is not
// asserted: test machines are shared).
TEST(RoutingStats, DeepSeekShapeMemory) {
  RoutingStats stats(58, 256, 50.0, 4096, 8);
  const std::size_t expected = 58 * 256 + 58 * 256 * 255 / 2 + 57 * 256 * 256 + 58;
  EXPECT_EQ(stats.raw().size(), expected);
  EXPECT_EQ(stats.raw().size(), 5'643'578u);  // x 8 bytes = 45.1 MB, as the header says
}

TEST(RoutingStats, ServingPathDoesNotAllocate) {
  RoutingStats stats(58, 256, 1.0, 16, 8);
  Lcg rng(3);
  std::vector<std::vector<Experts>> paths;
  for (int t = 0; t < 40; ++t) paths.push_back(random_path(rng, 58, 256, 8));
  std::vector<std::vector<std::span<const std::uint32_t>>> spans;
  for (auto& p : paths) spans.emplace_back(p.begin(), p.end());

  const std::uint64_t before = g_allocations.load();
  for (int step = 0; step < 100; ++step) {  // past 2^64: renormalisation included
    for (std::size_t t = 0; t < paths.size(); ++t) {
      for (int l = 0; l < 58; ++l) {
        stats.add_choice(l, paths[t][l]);
        if (l + 1 < 58) stats.add_transition(l, paths[t][l], paths[t][l + 1]);
      }
      stats.add_sample(spans[t]);
    }
    stats.end_step();
  }
  EXPECT_EQ(g_allocations.load(), before) << "allocations on the serving path";
  EXPECT_EQ(stats.sample_size(), 16u);

}

}  // namespace
}  // namespace moed::routing
