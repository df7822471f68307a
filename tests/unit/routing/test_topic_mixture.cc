// The topic mixture behind synthetic routing: sample() is draw_topic() then
// sample_from() on one stream, and sample_from() keeps to its topic except
// for cross-topic picks.
#include "routing/topic_mixture.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <tuple>
#include <vector>

#include "common/rng.h"

namespace moed::routing {
namespace {

struct MixtureCase {
  int experts, top_k;
  double cross_topic, hot_ratio;
};
class TopicMixtureTest : public testing::TestWithParam<MixtureCase> {
 protected:
  // Calibrated once per case (calibration draws 41 x 20000 tokens).
  const TopicMixture& make() const {
    static std::map<std::tuple<int, int, double, double>, TopicMixture> cache;
    const MixtureCase c = GetParam();
    const auto key = std::tuple{c.experts, c.top_k, c.cross_topic, c.hot_ratio};
    auto it = cache.find(key);
    if (it == cache.end())
      it = cache.emplace(key, TopicMixture::calibrate(c.experts, c.top_k, 0, c.cross_topic, c.hot_ratio, 11)).first;
    return it->second;
  }
};

TEST_P(TopicMixtureTest, TopicsPartitionTheExperts) {
  const TopicMixture& m = make();
  std::vector<int> seen;
  for (const auto& topic : m.topics()) {
    EXPECT_GE(int(topic.size()), GetParam().top_k);
    seen.insert(seen.end(), topic.begin(), topic.end());
  }
  std::sort(seen.begin(), seen.end());
  std::vector<int> all(GetParam().experts);
  for (int e = 0; e < GetParam().experts; ++e) all[e] = e;
  EXPECT_EQ(seen, all);
}

TEST_P(TopicMixtureTest, SampleIsDrawTopicThenSampleFromOnOneStream) {
  const TopicMixture& m = make();
  Rng a(99), b(99);
  std::vector<int> x, y;
  for (int i = 0; i < 2000; ++i) {
    m.sample(a, x);
    m.sample_from(m.draw_topic(b), b, y);
    ASSERT_EQ(x, y) << "draw " << i;
  }
  EXPECT_EQ(a.next(), b.next()) << "the two ways consumed different amounts of the stream";
}

TEST_P(TopicMixtureTest, SampleFromGivesTopKDistinctExpertsFromTheTopic) {
  const MixtureCase c = GetParam();
  const TopicMixture& m = make();
  Rng rng(5);
  std::vector<int> chosen;
  long outside = 0, picks = 0;
  for (int i = 0; i < 4000; ++i) {
    const int topic = m.draw_topic(rng);
    ASSERT_GE(topic, 0);
    ASSERT_LT(topic, int(m.topics().size()));
    m.sample_from(topic, rng, chosen);
    ASSERT_EQ(int(chosen.size()), c.top_k);
    EXPECT_EQ(int(std::set<int>(chosen.begin(), chosen.end()).size()), c.top_k) << "draw " << i;
    const auto& group = m.topics()[topic];
    for (int e : chosen) {
      EXPECT_TRUE(e >= 0 && e < c.experts);
      outside += std::find(group.begin(), group.end(), e) == group.end();
      ++picks;
    }
  }
  // A cross-topic pick is any expert not chosen yet, so it lands outside the
  // topic with probability about (E - topic size) / E.
  const double topic_size = double(c.experts) / double(m.topics().size());
  const double expected = c.cross_topic * (c.experts - topic_size) / c.experts;
  if (c.cross_topic == 0)
    EXPECT_EQ(outside, 0);
  else
    EXPECT_NEAR(double(outside) / double(picks), expected, 0.3 * expected + 0.005);
}

TEST_P(TopicMixtureTest, CalibratedToTheHotRatio) {
  const TopicMixture& m = make();
  EXPECT_NEAR(m.measured_hot_ratio(20000, 3), GetParam().hot_ratio, 0.15);
}

INSTANTIATE_TEST_SUITE_P(Mixtures, TopicMixtureTest,
                         testing::Values(MixtureCase{32, 4, 0.1, 2.75}, MixtureCase{32, 4, 0.0, 2.75},
                                         MixtureCase{16, 2, 0.3, 2.0}, MixtureCase{8, 2, 0.1, 1.5}));

}  // namespace
}  // namespace moed::routing
