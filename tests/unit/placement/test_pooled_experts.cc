// Which replicated experts metis pools (lets their replicas share an island):
// the hottest share of those with more than one replica, by summed slot load,
// rounded up, ties to the lower expert; unreplicated experts never.
#include "placement/metis_partition.h"

#include <gtest/gtest.h>

#include <vector>

namespace moed::placement {
namespace {

struct PooledCase {
  std::vector<double> loads;
  std::vector<int> replicas;
  double share;
  std::vector<char> expected;
};
class PooledExperts : public testing::TestWithParam<PooledCase> {};

TEST_P(PooledExperts, TheHottestShareOfTheReplicated) {
  const PooledCase& c = GetParam();
  EXPECT_EQ(pooled_experts(make_slots(c.loads, c.replicas), c.replicas, c.share), c.expected);
}
INSTANTIATE_TEST_SUITE_P(
    Cases, PooledExperts,
    testing::Values(
        // Four replicated experts, half pooled: the two hottest (e0 = 8, e3 = 6).
        PooledCase{{8, 3, 1, 6, 5}, {2, 2, 1, 2, 2}, 0.5, {1, 0, 0, 1, 0}},
        // Three replicated, half rounds up to two.
        PooledCase{{8, 3, 1, 6}, {2, 2, 1, 2}, 0.5, {1, 0, 0, 1}},
        // Share 0: none; share 1: every replicated one, never the unreplicated e2.
        PooledCase{{8, 3, 1, 6}, {2, 2, 1, 2}, 0.0, {0, 0, 0, 0}},
        PooledCase{{8, 3, 1, 6}, {2, 2, 1, 2}, 1.0, {1, 1, 0, 1}},
        // Summed load decides, not the load per slot: e1 (2 x 4) before e0 (3 x 2.5).
        PooledCase{{7.5, 8, 1}, {3, 2, 1}, 0.5, {0, 1, 0}},
        // Ties go to the lower expert.
        PooledCase{{4, 4, 4}, {2, 2, 2}, 0.3, {1, 0, 0}},
        // Nothing replicated: nothing pooled.
        PooledCase{{5, 1}, {1, 1}, 0.5, {0, 0}}));

struct ConcentrationCase {
  std::vector<double> row;
  int islands;
  double expected;
};
class CoactivationConcentration : public testing::TestWithParam<ConcentrationCase> {};

TEST_P(CoactivationConcentration, TheShareOnAsManyPartnersAsOneIslandHoldsBesideIt) {
  const ConcentrationCase& c = GetParam();
  EXPECT_DOUBLE_EQ(coactivation_concentration(c.row, c.islands), c.expected);
}
INSTANTIATE_TEST_SUITE_P(
    Cases, CoactivationConcentration,
    testing::Values(
        // 8 experts, 2 islands: 3 partners fit beside expert 0 (diagonal 0).
        // Uniform: 3 of 7 equal shares.
        ConcentrationCase{{0, 1, 1, 1, 1, 1, 1, 1}, 2, 3.0 / 7.0},
        // A group of four: all of it on the 3 strongest, wherever they sit.
        ConcentrationCase{{0, 0, 5, 0, 9, 0, 2, 0}, 2, 1.0},
        // Mostly the group, a little outside: 18 of 20.
        ConcentrationCase{{0, 6, 6, 6, 1, 1, 0, 0}, 2, 18.0 / 20.0},
        // 4 islands of 2: one partner fits.
        ConcentrationCase{{0, 4, 3, 3, 0, 0, 0, 0}, 4, 0.4},
        // One island: everything fits.
        ConcentrationCase{{0, 4, 3, 3}, 1, 1.0},
        // An island per expert: no partner fits; an empty row: nothing to share.
        ConcentrationCase{{0, 4, 3, 3}, 4, 0.0}, ConcentrationCase{{0, 0, 0, 0}, 2, 0.0}));

}  // namespace
}  // namespace moed::placement
