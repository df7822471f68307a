// The assignment problem: given a square matrix of gains, the one-to-one
// matching of rows to columns with the largest total gain (Hungarian method,
// O(n^3)). Placement uses it to relabel a new placement's islands and ranks
// against the current one, so that as few expert weights as possible move.
#pragma once

#include <vector>

namespace moed::placement {

// gain[i][j]: the value of matching row i to column j (n x n, any sign).
// Returns column_of_row (a permutation of 0..n-1) maximising the sum of
// gain[i][column_of_row[i]]. Ties are broken towards the identity, so equal
// gains leave labels where they are.
std::vector<int> max_gain_assignment(const std::vector<std::vector<double>>& gain);

}  // namespace moed::placement
