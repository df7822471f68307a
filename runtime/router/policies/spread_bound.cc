#include "runtime/router/policies/spread_bound.h"

#include <algorithm>
#include <cmath>
#include <functional>

#include "common/error.h"

namespace moed::runtime {

namespace {

constexpr int kBisections = 80;

// One cell's deviations from its mean, sorted both ways.
struct Cell {
  double mean = 0, excess = 0;  // excess: sum of the positive deviations (moves that flatten it)
  std::vector<double> down;     // deviations, highest first
  std::vector<double> up;       // minus the deviations, highest first

  explicit Cell(std::span<const double> load) {
    double sum = 0;
    for (double v : load) {
      MOED_CHECK(std::isfinite(v) && v >= 0, "spread bound: load {} is not a finite count", v);
      sum += v;
    }
    mean = load.empty() ? 0.0 : sum / double(load.size());
    for (double v : load) down.push_back(v - mean), excess += std::max(0.0, v - mean);
    std::sort(down.begin(), down.end(), std::greater<>());
    for (auto it = down.rbegin(); it != down.rend(); ++it) up.push_back(-*it);
  }

  // The level c with sum (v_i - c)+ = x over v (highest first), 0 <= x <= excess.
  static double level(const std::vector<double>& v, double x) {
    double top = 0;
    for (std::size_t k = 1; k <= v.size(); ++k) {
      top += v[k - 1];
      const double c = (top - x) / double(k);
      if (k == v.size() || c >= v[k]) return c;
    }
    return 0;
  }

  struct Point {
    double spread, slope;  // g(x) and -g'(x)
  };
  Point at(double x) const {
    if (mean <= 0) return {0, 0};
    x = std::clamp(x, 0.0, excess);
    const double c2 = level(down, x), c1 = level(up, x);
    double h = 0;
    for (double d : down) h += std::pow(std::clamp(d, -c1, c2), 2);
    const double E = double(down.size()), spread = std::sqrt(h / E) / mean;
    // d/dx h = -2 (c1 + c2): one unit off the top at c2 onto the bottom at -c1.
    return {spread, spread > 0 ? (c1 + c2) / (E * mean * mean * spread) : 0.0};
  }

  // The fewest moves whose marginal gain -g'(x) is down to `slope`.
  double moves_at_slope(double slope) const {
    if (at(0).slope <= slope) return 0;
    double lo = 0, hi = excess;
    for (int i = 0; i < kBisections; ++i) {
      const double mid = (lo + hi) / 2;
      (at(mid).slope > slope ? lo : hi) = mid;
    }
    return hi;
  }
};

}  // namespace

std::vector<double> flattest_loads(std::span<const double> load, double moves) {
  const Cell cell(load);
  const double x = std::clamp(moves, 0.0, cell.excess);
  const double c2 = Cell::level(cell.down, x), c1 = Cell::level(cell.up, x);
  std::vector<double> out;
  for (double v : load) out.push_back(cell.mean + std::clamp(v - cell.mean, -c1, c2));
  return out;
}

SpreadLevels levels_for_spread(std::span<const double> load, double target) {
  MOED_CHECK(std::isfinite(target) && target >= 0, "spread levels: target {} is not a spread", target);
  const Cell cell(load);
  if (load.empty()) return {};
  double lo = 0, hi = cell.excess;
  if (cell.at(0).spread > target)
    for (int i = 0; i < kBisections; ++i) {
      const double mid = (lo + hi) / 2;
      (cell.at(mid).spread > target ? lo : hi) = mid;
    }
  else
    hi = 0;
  return {cell.mean - Cell::level(cell.up, hi), cell.mean + Cell::level(cell.down, hi)};
}

SpreadBound min_moves_for_spread(std::span<const std::vector<double>> loads, double target) {
  MOED_CHECK(std::isfinite(target) && target >= 0, "spread bound: target {} is not a spread", target);
  std::vector<Cell> cells;
  SpreadBound bound;
  double spread = 0, steepest = 0;
  for (const auto& load : loads) {
    cells.emplace_back(load);
    for (double v : load) bound.pairs += v;
    const Cell::Point p = cells.back().at(0);
    spread += p.spread, steepest = std::max(steepest, p.slope);
  }
  const double C = double(cells.size()), budget = C * target;
  if (cells.empty() || spread <= budget) return bound;
  // Lagrangian duality: for any slope s, sum_c (x_c + g_c(x_c) / s) - budget / s
  // at each cell's best x_c(s) is a lower bound on the moves; its maximum over
  // s is the optimum (the problem is convex). Bisect s on the mean spread.
  double lo = 0, hi = steepest, best = 0;
  for (int i = 0; i < kBisections; ++i) {
    const double s = (lo + hi) / 2;
    if (s <= 0) break;
    double moves = 0, total = 0;
    for (const Cell& c : cells) {
      const double x = c.moves_at_slope(s);
      moves += x, total += c.at(x).spread;
    }
    best = std::max(best, moves + (total - budget) / s);
    (total > budget ? hi : lo) = s;
  }
  bound.moves = best;
  return bound;
}

}  // namespace moed::runtime
