// Topology: islands from blocks or an explicit map, link classes, describe().
#include "placement/topology.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/error.h"

namespace moed::placement {
namespace {

TEST(Topology, BlocksOfTwo) {
  Topology t = Topology::blocks(4, 2);
  EXPECT_EQ(t.ranks(), 4);
  EXPECT_EQ(t.islands(), 2);
  EXPECT_EQ(t.ranks_in(0), (std::vector<int>{0, 1}));
  EXPECT_EQ(t.ranks_in(1), (std::vector<int>{2, 3}));
  EXPECT_EQ(t.island_of(3), 1);
  EXPECT_EQ(t.describe(), "2 islands: {0,1} {2,3}");
}

TEST(Topology, LastBlockMayBeShort) {
  Topology t = Topology::blocks(5, 2);
  EXPECT_EQ(t.islands(), 3);
  EXPECT_EQ(t.ranks_in(2), (std::vector<int>{4}));
  EXPECT_EQ(t.describe(), "3 islands: {0,1} {2,3} {4}");
  EXPECT_EQ(Topology::blocks(1, 8).describe(), "1 island: {0}");
  EXPECT_EQ(Topology::blocks(3, 8).describe(), "1 island: {0,1,2}");
}

TEST(Topology, ExplicitIslands) {
  Topology t({1, 0, 1, 0});
  EXPECT_EQ(t.islands(), 2);
  EXPECT_EQ(t.ranks_in(0), (std::vector<int>{1, 3}));
  EXPECT_EQ(t.ranks_in(1), (std::vector<int>{0, 2}));
  EXPECT_EQ(t.describe(), "2 islands: {1,3} {0,2}");
}

struct LinkCase {
  std::vector<int> islands;
  // want[from][to]: 0 same rank, 1 same island, 2 cross island
  std::vector<std::vector<int>> want;
};

void PrintTo(const LinkCase& c, std::ostream* os) {
  *os << "islands";
  for (int i : c.islands) *os << " " << i;
}

class TopologyLinks : public ::testing::TestWithParam<LinkCase> {};

TEST_P(TopologyLinks, ClassifiesEveryPair) {
  const auto& c = GetParam();
  Topology t(c.islands);
  for (int a = 0; a < t.ranks(); ++a)
    for (int b = 0; b < t.ranks(); ++b)
      EXPECT_EQ(int(t.link(a, b)), c.want[a][b]) << a << " -> " << b;
}

INSTANTIATE_TEST_SUITE_P(
    HandWritten, TopologyLinks,
    ::testing::Values(LinkCase{{0, 0, 1, 1},  // blocks(4, 2)
                               {{0, 1, 2, 2}, {1, 0, 2, 2}, {2, 2, 0, 1}, {2, 2, 1, 0}}},
                      LinkCase{{0, 0, 1, 1, 2},  // blocks(5, 2)
                               {{0, 1, 2, 2, 2},
                                {1, 0, 2, 2, 2},
                                {2, 2, 0, 1, 2},
                                {2, 2, 1, 0, 2},
                                {2, 2, 2, 2, 0}}},
                      LinkCase{{1, 0, 1}, {{0, 2, 1}, {2, 0, 2}, {1, 2, 0}}},
                      LinkCase{{0}, {{0}}}));

TEST(Topology, BlocksMatchesTheExplicitMap) {
  Topology a = Topology::blocks(5, 2), b({0, 0, 1, 1, 2});
  for (int x = 0; x < 5; ++x) {
    EXPECT_EQ(a.island_of(x), b.island_of(x));
    for (int y = 0; y < 5; ++y) EXPECT_EQ(a.link(x, y), b.link(x, y));
  }
}

TEST(Topology, LinkClassNames) {
  EXPECT_STREQ(to_string(LinkClass::SameRank), "same_rank");
  EXPECT_STREQ(to_string(LinkClass::SameIsland), "same_island");
  EXPECT_STREQ(to_string(LinkClass::CrossIsland), "cross_island");
}

std::string map_name(const ::testing::TestParamInfo<std::vector<int>>& info) {
  std::string name = "map";
  for (int i : info.param) name += i < 0 ? "_m" + std::to_string(-i) : "_" + std::to_string(i);
  return info.param.empty() ? "empty" : name;
}

class TopologyRefuses : public ::testing::TestWithParam<std::vector<int>> {};

TEST_P(TopologyRefuses, WithAnInternalError) {
  try {
    Topology t(GetParam());
    ADD_FAILURE() << "no error thrown: " << t.describe();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Internal) << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(Maps, TopologyRefuses,
                         ::testing::Values(std::vector<int>{0, 2, 2},  // island 1 missing
                                           std::vector<int>{1, 1},     // island 0 missing
                                           std::vector<int>{0, -1},    // negative
                                           std::vector<int>{}),        // no ranks
                         map_name);

TEST(Topology, NonDenseMessageSaysSo) {
  try {
    Topology t({0, 2});
    ADD_FAILURE() << "no error thrown";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("densely"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace moed::placement
