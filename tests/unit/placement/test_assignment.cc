// The assignment problem (Hungarian method): hand cases, ties towards the
// identity, bad input, and a property test against brute force.
#include "placement/assignment.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "common/error.h"
#include "common/rng.h"
#include "tests/unit/test_support.h"

namespace moed::placement {
namespace {

using Matrix = std::vector<std::vector<double>>;

double total(const Matrix& gain, const std::vector<int>& column_of_row) {
  double sum = 0;
  for (std::size_t i = 0; i < gain.size(); ++i) sum += gain[i][column_of_row[i]];
  return sum;
}

int fixed_points(const std::vector<int>& column_of_row) {
  int n = 0;
  for (std::size_t i = 0; i < column_of_row.size(); ++i) n += column_of_row[i] == int(i);
  return n;
}

bool is_permutation(std::vector<int> v) {
  std::sort(v.begin(), v.end());
  for (std::size_t i = 0; i < v.size(); ++i)
    if (v[i] != int(i)) return false;
  return true;
}

std::vector<int> identity(int n) {
  std::vector<int> v(n);
  std::iota(v.begin(), v.end(), 0);
  return v;
}

TEST(Assignment, EmptyMatrixGivesEmptyAssignment) {
  EXPECT_TRUE(max_gain_assignment({}).empty());
}

TEST(Assignment, OneByOne) {
  EXPECT_EQ(max_gain_assignment({{5}}), std::vector<int>{0});
  EXPECT_EQ(max_gain_assignment({{-7.5}}), std::vector<int>{0});
}

TEST(Assignment, TwoByTwo) {
  EXPECT_EQ(max_gain_assignment({{1, 2}, {3, 1}}), (std::vector<int>{1, 0}));  // 5 over 2
  EXPECT_EQ(max_gain_assignment({{4, 2}, {3, 1}}), (std::vector<int>{0, 1}));  // 5 over 5: identity
  EXPECT_EQ(max_gain_assignment({{4, 2}, {3, 2}}), (std::vector<int>{0, 1}));  // 6 over 5
}

TEST(Assignment, ThreeByThreeKnownOptimum) {
  // Totals of the six permutations: 0, 5, 9, 8, 8, 2; the best is {1, 0, 2}.
  const Matrix gain{{0, 5, 1}, {4, 0, 2}, {1, 3, 0}};
  const auto got = max_gain_assignment(gain);
  EXPECT_EQ(got, (std::vector<int>{1, 0, 2}));
  EXPECT_EQ(total(gain, got), 9);
}

TEST(Assignment, NegativeGains) {
  EXPECT_EQ(max_gain_assignment({{-1, -5}, {-3, -2}}), (std::vector<int>{0, 1}));  // -3 over -8
  EXPECT_EQ(max_gain_assignment({{-5, -1}, {-2, -6}}), (std::vector<int>{1, 0}));  // -3 over -11
  // Mixed signs: the only way to avoid -100 is the cycle 0->1->2->0.
  const Matrix gain{{-100, 1, -100}, {-100, -100, 1}, {1, -100, -100}};
  EXPECT_EQ(max_gain_assignment(gain), (std::vector<int>{1, 2, 0}));
}

TEST(Assignment, FractionalGains) {
  const Matrix gain{{0.25, 0.5}, {0.75, 0.125}};  // 1.25 over 0.375
  EXPECT_EQ(max_gain_assignment(gain), (std::vector<int>{1, 0}));
}

TEST(Assignment, TiesKeepTheIdentity) {
  for (int n : {1, 2, 3, 5, 8, 17}) {
    EXPECT_EQ(max_gain_assignment(Matrix(n, std::vector<double>(n, 0.0))), identity(n)) << n;
    EXPECT_EQ(max_gain_assignment(Matrix(n, std::vector<double>(n, -3.0))), identity(n)) << n;
  }
  // Rows 0 and 1 must swap; row 2 is indifferent and stays.
  EXPECT_EQ(max_gain_assignment({{0, 5, 0}, {5, 0, 0}, {0, 0, 0}}), (std::vector<int>{1, 0, 2}));
  // Every permutation of a matrix whose rows are constant totals the same.
  EXPECT_EQ(max_gain_assignment({{1, 1, 1}, {7, 7, 7}, {-2, -2, -2}}), identity(3));
  // Ties with a huge gain elsewhere: the identity bonus must not be lost in rounding.
  EXPECT_EQ(max_gain_assignment({{1e12, 1e12, 0}, {1e12, 1e12, 0}, {0, 0, 0}}), identity(3));
}

TEST(Assignment, NonSquareIsAnInternalError) {
  test::expect_error([] { max_gain_assignment({{1, 2}, {3}}); }, ErrorKind::Internal,
                     {"square", "row 1"});
  test::expect_error([] { max_gain_assignment({{1, 2, 3}, {4, 5, 6}}); }, ErrorKind::Internal,
                     {"square"});
}

TEST(Assignment, NonFiniteGainIsAnInternalError) {
  test::expect_error(
      [] { max_gain_assignment({{1, std::numeric_limits<double>::quiet_NaN()}, {0, 0}}); },
      ErrorKind::Internal, {"[0][1]"});
  test::expect_error(
      [] { max_gain_assignment({{1, 0}, {0, std::numeric_limits<double>::infinity()}}); },
      ErrorKind::Internal, {"[1][1]"});
}

// Brute force over all permutations: the best total and, among the
// permutations reaching it, the most rows left on their own column.
struct Best {
  double total = -std::numeric_limits<double>::infinity();
  int fixed = -1;
};

Best brute_force(const Matrix& gain) {
  Best best;
  std::vector<int> perm = identity(int(gain.size()));
  do {
    const double t = total(gain, perm);
    const int f = fixed_points(perm);
    if (t > best.total || (t == best.total && f > best.fixed)) best = {t, f};
  } while (std::next_permutation(perm.begin(), perm.end()));
  return best;
}

TEST(Assignment, MatchesBruteForceOnRandomMatrices) {
  for (std::uint64_t seed = 0; seed < 200; ++seed) {
    Rng rng(hash_combine(hash_name("assignment-property"), seed));
    const int n = 1 + int(rng.below(7));
    // A small range makes ties common, so the tie rule is exercised too.
    const int range = seed % 2 ? 5 : 41;
    Matrix gain(n, std::vector<double>(n));
    for (auto& row : gain)
      for (double& g : row) g = double(int(rng.below(range)) - range / 2);
    const auto got = max_gain_assignment(gain);
    ASSERT_EQ(int(got.size()), n) << "seed " << seed;
    ASSERT_TRUE(is_permutation(got)) << "seed " << seed;
    const Best best = brute_force(gain);
    EXPECT_EQ(total(gain, got), best.total) << "seed " << seed << " n " << n;
    EXPECT_EQ(fixed_points(got), best.fixed) << "seed " << seed << " n " << n;
  }
}

TEST(Assignment, LargeMatrixIsAPermutationAtLeastAsGoodAsTheIdentity) {
  Rng rng(hash_name("assignment-large"));
  const int n = 128;
  Matrix gain(n, std::vector<double>(n));
  for (auto& row : gain)
    for (double& g : row) g = double(rng.below(1000));
  const auto got = max_gain_assignment(gain);
  ASSERT_TRUE(is_permutation(got));
  EXPECT_GE(total(gain, got), total(gain, identity(n)));
  // A permutation matrix of large gains on top is found exactly.
  std::vector<int> hidden = identity(n);
  for (int i = n - 1; i > 0; --i) std::swap(hidden[i], hidden[rng.below(i + 1)]);
  for (int i = 0; i < n; ++i) gain[i][hidden[i]] += 1e6;
  EXPECT_EQ(max_gain_assignment(gain), hidden);
}

}  // namespace
}  // namespace moed::placement
