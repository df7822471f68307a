// Workloads: the topic mixture's calibration (also through the real router on a
// synthetic model), tokens as a pure function of their global id, and trace
// replay checked against an independent reading of the committed trace file.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cctype>
#include <cstring>
#include <memory>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/rng.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/rms_norm.h"
#include "runtime/config/config.h"
#include "runtime/weights/model.h"
#include "runtime/router/router.h"
#include "runtime/weights/synthetic_model.h"
#include "runtime/workload/synthetic_workload.h"
#include "runtime/workload/trace_workload.h"
#include "tests/unit/test_support.h"

namespace moed::runtime {
namespace {

const std::string kTrace = std::string(MOED_TEST_DATA_DIR) + "/mixtral-humaneval.trace";

using test::expect_error;
using routing::TopicMixture;

// ---------------------------------------------------------------- TopicMixture

struct CalibrationCase {
  int experts, top_k;
  double target;
};

class MixtureCalibration : public ::testing::TestWithParam<CalibrationCase> {};

TEST_P(MixtureCalibration, ReachesTheHotRatioOnFreshSamples) {
  const auto& c = GetParam();
  const TopicMixture m = TopicMixture::calibrate(c.experts, c.top_k, 0, 0.1, c.target, 7);
  // Measured with a seed the calibration did not use.
  EXPECT_NEAR(m.measured_hot_ratio(20000, 123456789), c.target, 0.1);
  EXPECT_GT(m.skew(), 0.0);
}

INSTANTIATE_TEST_SUITE_P(Shapes, MixtureCalibration,
                         ::testing::Values(CalibrationCase{8, 2, 2.75}, CalibrationCase{64, 8, 2.75},
                                           CalibrationCase{16, 2, 2.5}),
                         [](const auto& info) {
                           return "E" + std::to_string(info.param.experts) + "K" +
                                  std::to_string(info.param.top_k);
                         });

TEST(MixtureCalibration, UnreachableTargetIsAUsageError) {
  // With every choice leaving the topic, choices are uniform: no skew makes one expert hot.
  expect_error([] { TopicMixture::calibrate(8, 2, 0, 1.0, 2.0, 7); }, ErrorKind::Usage,
               {"[workload].hot_ratio"});
}

TEST(MixtureSample, TopKDistinctExpertsInRange) {
  for (auto [E, K] : {std::pair{8, 2}, std::pair{32, 4}, std::pair{5, 5}}) {
    const TopicMixture m = TopicMixture::calibrate(E, K, 0, 0.3, 1.0, 3);
    Rng rng(42);
    std::vector<int> chosen;
    for (int i = 0; i < 2000; ++i) {
      m.sample(rng, chosen);
      ASSERT_EQ(int(chosen.size()), K) << "E " << E << " draw " << i;
      std::set<int> distinct(chosen.begin(), chosen.end());
      EXPECT_EQ(int(distinct.size()), K) << "E " << E << " draw " << i;
      EXPECT_GE(*distinct.begin(), 0);
      EXPECT_LT(*distinct.rbegin(), E);
    }
  }
}

TEST(MixtureSample, SameRngSameDraws) {
  const TopicMixture m = TopicMixture::calibrate(16, 2, 0, 0.1, 2.5, 1);
  Rng a(9), b(9);
  std::vector<int> x, y;
  for (int i = 0; i < 100; ++i) {
    m.sample(a, x);
    m.sample(b, y);
    ASSERT_EQ(x, y);
  }
}

struct TopicCase {
  int experts, top_k, topic_size;
  std::size_t topics;  // max(1, experts / size), size = topic_size or 2 x top_k
};

class MixtureTopics : public ::testing::TestWithParam<TopicCase> {};

TEST_P(MixtureTopics, PartitionTheExperts) {
  const auto& c = GetParam();
  const TopicMixture m = TopicMixture::calibrate(c.experts, c.top_k, c.topic_size, 0.1, 1.0, 5);
  ASSERT_EQ(m.topics().size(), c.topics);
  std::vector<int> seen(c.experts, 0);
  for (const auto& t : m.topics()) {
    EXPECT_GE(int(t.size()), c.top_k);
    for (int e : t) {
      ASSERT_GE(e, 0);
      ASSERT_LT(e, c.experts);
      ++seen[e];
    }
  }
  for (int e = 0; e < c.experts; ++e) EXPECT_EQ(seen[e], 1) << "expert " << e;
}

INSTANTIATE_TEST_SUITE_P(Shapes, MixtureTopics,
                         ::testing::Values(TopicCase{8, 2, 0, 2}, TopicCase{32, 4, 0, 4},
                                           TopicCase{10, 2, 4, 2}, TopicCase{16, 2, 3, 5},
                                           TopicCase{6, 2, 6, 1}));

// ---------------------------------------------------------------- SyntheticWorkload

Config synthetic_config(int experts, int top_k, int hidden) {
  Config c = default_config();
  c.model.experts = experts;
  c.model.top_k = top_k;
  c.model.hidden = hidden;
  c.model.ffn = 16;
  c.model.layers = 1;
  validate_config(c);
  return c;
}

std::vector<float> gate0(const Config& c) {
  const SyntheticModel model{ModelShape::from(c.model), std::uint64_t(c.model.seed), weights::DType::F32};
  std::vector<float> g(std::size_t(c.model.experts) * c.model.hidden);
  model.gate(0, g.data());
  return g;
}

TEST(SyntheticWorkload, TokensArePureFunctionsOfTheGlobalId) {
  const Config c = synthetic_config(8, 2, 16);
  const std::vector<float> gate = gate0(c);
  const SyntheticWorkload a(c, gate.data()), b(c, gate.data());
  const int H = 16;
  std::vector<float> all(20 * H), part(5 * H), other(20 * H);
  a.tokens(0, 20, all.data());
  b.tokens(10, 5, part.data());
  for (int i = 0; i < 5 * H; ++i)
    ASSERT_EQ(std::bit_cast<std::uint32_t>(part[i]), std::bit_cast<std::uint32_t>(all[10 * H + i])) << i;
  b.tokens(0, 20, other.data());
  EXPECT_EQ(std::memcmp(all.data(), other.data(), all.size() * sizeof(float)), 0);
  // Different ids, different tokens.
  EXPECT_NE(std::memcmp(all.data(), all.data() + H, H * sizeof(float)), 0);
}

TEST(SyntheticWorkload, TheSeedChangesTheTokens) {
  Config c = synthetic_config(8, 2, 16);
  const std::vector<float> gate = gate0(c);
  std::vector<float> x(16), y(16);
  SyntheticWorkload(c, gate.data()).tokens(3, 1, x.data());
  c.workload.seed += 1;
  SyntheticWorkload(c, gate.data()).tokens(3, 1, y.data());
  EXPECT_NE(std::memcmp(x.data(), y.data(), x.size() * sizeof(float)), 0);
}

struct RouterCase {
  int experts, top_k, hidden;
};

class SyntheticThroughRouter : public ::testing::TestWithParam<RouterCase> {};

TEST_P(SyntheticThroughRouter, HotRatioAndDrawnExpertsHold) {
  const auto& rc = GetParam();
  const Config c = synthetic_config(rc.experts, rc.top_k, rc.hidden);
  const int E = rc.experts, H = rc.hidden, K = rc.top_k;
  const std::size_t T = 4000;
  const SyntheticModel model{ModelShape::from(c.model), std::uint64_t(c.model.seed), weights::DType::F32};
  std::vector<float> gate(std::size_t(E) * H), norm(H);
  model.gate(0, gate.data());
  model.norm(0, norm.data());
  const SyntheticWorkload workload(c, gate.data());

  std::vector<float> x(T * H), xn(T * H), logits(T * E);
  workload.tokens(0, T, x.data());
  kernels::rms_norm(x.data(), norm.data(), T, H, float(c.model.norm_eps), xn.data());
  kernels::gemm_xwt(xn.data(), T, H, gate.data(), E, logits.data());
  Routing routing;
  route(logits.data(), T, E, RouterParams::from(c), routing);
  ASSERT_EQ(routing.tokens(), T);

  std::vector<double> load(E, 0.0);
  for (std::uint32_t e : routing.experts) load[e] += 1;
  const double mean = double(T) * K / E;
  const double hot = *std::max_element(load.begin(), load.end()) / mean;
  EXPECT_GE(hot, 2.5);
  EXPECT_LE(hot, 3.0);

  // The mixture's draw for each token, re-sampled as SyntheticWorkload::tokens does.
  std::size_t agree = 0, overlap = 0, first = 0;
  std::vector<int> drawn;
  for (std::size_t t = 0; t < T; ++t) {
    Rng rng(hash_combine(std::uint64_t(c.workload.seed), t));
    workload.mixture().sample(rng, drawn);
    std::set<int> want(drawn.begin(), drawn.end());
    auto got_span = routing.experts_of(t);
    std::set<int> got(got_span.begin(), got_span.end());
    agree += want == got;
    for (int e : got) overlap += want.count(e);
    first += routing.experts_of(t)[0] == std::uint32_t(drawn[0]);
  }
  EXPECT_GE(double(agree) / T, 0.9) << agree << " of " << T
                                    << " tokens routed to exactly the experts drawn; mean overlap "
                                    << double(overlap) / T << " of " << K
                                    << "; router's first = first drawn for " << first;
}

INSTANTIATE_TEST_SUITE_P(Shapes, SyntheticThroughRouter,
                         ::testing::Values(RouterCase{8, 2, 64}, RouterCase{64, 8, 128}),
                         [](const auto& info) {
                           return "E" + std::to_string(info.param.experts) + "K" +
                                  std::to_string(info.param.top_k) + "H" +
                                  std::to_string(info.param.hidden);
                         });

// ---------------------------------------------------------------- TraceWorkload

// The committed trace read by a plain loop: [token][layer] -> (expert, weight) pairs.
using Cell = std::vector<std::pair<std::uint32_t, float>>;
std::vector<std::vector<Cell>> read_trace_plainly(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::vector<std::vector<Cell>> tokens;
  while (std::getline(in, line)) {
    if (line.empty() || !(std::isdigit(static_cast<unsigned char>(line[0])) || line[0] == '-')) continue;
    std::vector<Cell> layers;
    std::stringstream groups(line);
    std::string group;
    while (std::getline(groups, group, '|')) {
      Cell cell;
      std::stringstream pairs(group);
      std::string pair;
      while (pairs >> pair) {
        if (pair == "-") continue;
        const auto colon = pair.find(':');
        cell.emplace_back(std::uint32_t(std::stoul(pair.substr(0, colon))),
                          std::strtof(pair.c_str() + colon + 1, nullptr));
      }
      layers.push_back(cell);
    }
    tokens.push_back(layers);
  }
  return tokens;
}

Config trace_config(const std::string& path, int layers = 4, int experts = 8) {
  Config c = default_config();
  c.workload.kind = WorkloadKind::trace;
  c.workload.trace = path;
  c.model.layers = layers;
  c.model.experts = experts;
  c.model.hidden = 16;
  validate_config(c);
  return c;
}

TEST(TraceWorkload, ReplaysTheTraceModuloItsTokens) {
  const auto plain = read_trace_plainly(kTrace);
  ASSERT_EQ(plain.size(), 338u);
  ASSERT_EQ(plain[0].size(), 32u);
  const TraceWorkload w(trace_config(kTrace));
  EXPECT_TRUE(w.replays_routing());
  for (int layer = 0; layer < 4; ++layer) {
    Routing r;
    w.routing(320, 40, layer, r);  // ids 320..359: wraps after 337
    ASSERT_EQ(r.tokens(), 40u);
    for (std::size_t t = 0; t < 40; ++t) {
      const Cell& want = plain[(320 + t) % 338][layer];
      auto e = r.experts_of(t);
      auto wt = r.weights_of(t);
      ASSERT_EQ(e.size(), want.size()) << "token " << 320 + t << " layer " << layer;
      for (std::size_t i = 0; i < e.size(); ++i) {
        EXPECT_EQ(e[i], want[i].first) << "token " << 320 + t << " layer " << layer;
        EXPECT_EQ(std::bit_cast<std::uint32_t>(wt[i]), std::bit_cast<std::uint32_t>(want[i].second));
      }
    }
  }
}

TEST(TraceWorkload, FirstTokensAndAppending) {
  const auto plain = read_trace_plainly(kTrace);
  const TraceWorkload w(trace_config(kTrace));
  Routing r;
  w.routing(0, 2, 0, r);
  w.routing(338 * 3 + 1, 1, 0, r);  // id 1015 is token 1 again
  ASSERT_EQ(r.tokens(), 3u);
  for (std::size_t t : {0u, 1u}) {
    auto e = r.experts_of(t);
    ASSERT_EQ(e.size(), plain[t][0].size());
    for (std::size_t i = 0; i < e.size(); ++i) EXPECT_EQ(e[i], plain[t][0][i].first);
  }
  EXPECT_EQ(std::vector<std::uint32_t>(r.experts_of(2).begin(), r.experts_of(2).end()),
            std::vector<std::uint32_t>(r.experts_of(1).begin(), r.experts_of(1).end()));
}

TEST(TraceWorkload, HiddenStatesArePureFunctionsOfTheId) {
  const TraceWorkload w(trace_config(kTrace));
  std::vector<float> all(10 * 16), part(3 * 16);
  w.tokens(100, 10, all.data());
  w.tokens(105, 3, part.data());
  EXPECT_EQ(std::memcmp(part.data(), all.data() + 5 * 16, part.size() * sizeof(float)), 0);
}

class TraceFiles : public ::testing::Test {
 protected:
  test::TempDir tmp_{"moed_wl"};
};

TEST_F(TraceFiles, FewerLayersThanTheModelIsAnInputError) {
  const std::string path = tmp_.write("two-layers.trace",
                                      "moed-trace v1\nlayers 2\nexperts 8\ntop_k 2\ntokens 2\n"
                                      "0:0.5 1:0.5 | 2:1\n"
                                      "3:0.75 4:0.25 | -\n");
  expect_error([&] { TraceWorkload w(trace_config(path, 4, 8)); }, ErrorKind::Input,
               {path, "[model].layers"});
  // Enough layers for a model of two: accepted.
  EXPECT_NO_THROW(TraceWorkload w(trace_config(path, 2, 8)));
}

TEST_F(TraceFiles, AnExpertBeyondTheModelIsAnInputError) {
  const std::string path = tmp_.write("sixteen-experts.trace",
                                      "moed-trace v1\nlayers 1\nexperts 16\ntop_k 2\ntokens 2\n"
                                      "0:0.5 1:0.5\n"
                                      "12:0.75 4:0.25\n");
  expect_error([&] { TraceWorkload w(trace_config(path, 1, 8)); }, ErrorKind::Input,
               {path, "expert 12", "[model].experts"});
  EXPECT_NO_THROW(TraceWorkload w(trace_config(path, 1, 16)));
}

TEST_F(TraceFiles, AMissingFileIsAnInputError) {
  const std::string path = tmp_.file("absent.trace");
  expect_error([&] { TraceWorkload w(trace_config(path)); }, ErrorKind::Input, {path});
}

TEST_F(TraceFiles, MakeWorkloadFollowsTheKind) {
  const std::unique_ptr<Workload> w = make_workload(trace_config(kTrace), nullptr);
  EXPECT_TRUE(w->replays_routing());
  const Config c = synthetic_config(8, 2, 16);
  const std::vector<float> gate = gate0(c);
  EXPECT_FALSE(make_workload(c, gate.data())->replays_routing());
}

}  // namespace
}  // namespace moed::runtime
