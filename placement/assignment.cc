// The Hungarian method (Kuhn-Munkres) with row and column potentials.
//
// We minimise cost = -gain. Rows are added one at a time; for each new row a
// shortest augmenting path over reduced costs (cost - row potential - column
// potential, never negative) is grown like Dijkstra's algorithm, the
// potentials are shifted so that every edge of the growing tree stays tight,
// and the matching is flipped along the path once it reaches a free column.
// n rows, each O(n) tree steps of O(n): O(n^3).
//
// Ties: the cost of an entry is a pair compared lexicographically, (-gain,
// -1 on the diagonal else 0). The method only adds, subtracts and compares
// costs, so it is exact over such pairs: among the assignments with the
// largest total gain it returns one with the most rows on their own column.
// This needs no guess at the gains' resolution. It is exact whenever sums of
// gains are exact in a double (integer gains below 2^53, as placement's slot
// counts are); for other gains, totals equal up to rounding may tie either way.
#include "placement/assignment.h"

#include <cmath>
#include <limits>

#include "common/error.h"

namespace moed::placement {
namespace {

struct Cost {
  double major = 0;  // -gain: what is minimised
  int minor = 0;     // -(entries on the diagonal): decides between equal totals

  Cost operator+(Cost o) const { return {major + o.major, minor + o.minor}; }
  Cost operator-(Cost o) const { return {major - o.major, minor - o.minor}; }
  Cost& operator+=(Cost o) { return *this = *this + o; }
  Cost& operator-=(Cost o) { return *this = *this - o; }
  bool operator<(Cost o) const { return major != o.major ? major < o.major : minor < o.minor; }
};

// Larger than every reduced cost; stays infinite when a finite cost is subtracted.
constexpr Cost kUnreached{std::numeric_limits<double>::infinity(), 0};

void check_square_and_finite(const std::vector<std::vector<double>>& gain) {
  const std::size_t n = gain.size();
  for (std::size_t i = 0; i < n; ++i) {
    MOED_CHECK(gain[i].size() == n,
               "assignment matrix must be square: row {} has {} columns, expected {}", i,
               gain[i].size(), n);
    for (std::size_t j = 0; j < n; ++j)
      MOED_CHECK(std::isfinite(gain[i][j]), "assignment gain [{}][{}] is {}", i, j, gain[i][j]);
  }
}

}  // namespace

std::vector<int> max_gain_assignment(const std::vector<std::vector<double>>& gain) {
  check_square_and_finite(gain);
  const int n = int(gain.size());

  // Rows and columns are numbered from 1 below; column 0 is a virtual column
  // that holds the row being inserted, the root of its search tree.
  auto cost = [&](int row, int col) {
    return Cost{-gain[row - 1][col - 1], row == col ? -1 : 0};
  };
  std::vector<Cost> row_potential(n + 1), col_potential(n + 1);
  std::vector<int> row_of_col(n + 1, 0);  // 0: column free
  std::vector<int> previous_col(n + 1, 0);  // the path back to column 0

  for (int row = 1; row <= n; ++row) {
    row_of_col[0] = row;
    std::vector<Cost> slack(n + 1, kUnreached);  // least reduced cost into each column
    std::vector<char> in_tree(n + 1, 0);
    int col = 0;
    do {
      in_tree[col] = 1;
      const int i = row_of_col[col];
      Cost delta = kUnreached;
      int nearest = 0;
      for (int j = 1; j <= n; ++j) {
        if (in_tree[j]) continue;
        const Cost reduced = cost(i, j) - row_potential[i] - col_potential[j];
        if (reduced < slack[j]) {
          slack[j] = reduced;
          previous_col[j] = col;
        }
        if (slack[j] < delta) {
          delta = slack[j];
          nearest = j;
        }
      }
      // Shift potentials by delta: edges inside the tree stay tight, every
      // slack shrinks by delta, and the edge into `nearest` becomes tight.
      for (int j = 0; j <= n; ++j) {
        if (in_tree[j]) {
          row_potential[row_of_col[j]] += delta;
          col_potential[j] -= delta;
        } else {
          slack[j] -= delta;
        }
      }
      col = nearest;
    } while (row_of_col[col] != 0);
    // Augment: every column on the path takes the row of the column before it.
    while (col != 0) {
      const int before = previous_col[col];
      row_of_col[col] = row_of_col[before];
      col = before;
    }
  }

  std::vector<int> column_of_row(n);
  for (int j = 1; j <= n; ++j) column_of_row[row_of_col[j] - 1] = j - 1;
  return column_of_row;
}

}  // namespace moed::placement
