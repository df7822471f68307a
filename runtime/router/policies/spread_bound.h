// The fewest (token, expert) pairs that ANY re-routing must move to bring the
// expert loads' spread (std/mean, the population std as in
// common/summary_stats.h) down to a target: the honest yardstick for a load
// policy's pairs moved (docs/router-policies.md, "The lower bound").
//
// Moving one pair moves one unit of load from one expert to another, so from
// loads l (mean m) to loads t with the same sum it takes at least
// ||l - t||_1 / 2 moves. For a given number of moves x the flattest loads
// clip the deviations d = l - m to [-c1(x), c2(x)]: x taken off the top
// (sum (d_i - c2)+ = x) and x given to the bottom (sum (-c1 - d_i)+ = x). The
// spread g(x) they reach is convex and falling in x, so over several cells
// (layers, or steps and layers) whose MEAN spread must reach the target, the
// cheapest split gives every cell the same marginal g'(x): a bisection on
// that slope, each cell's x by bisection too. A relaxation (loads need not be
// whole, a token may take an expert twice), so a true lower bound. Pure.
#pragma once

#include <span>
#include <vector>

namespace moed::runtime {

// The flattest loads `moves` pair moves can make of `load`.
std::vector<double> flattest_loads(std::span<const double> load, double moves);

// The window [floor, top] that the flattest loads of the fewest moves
// reaching `target` std/mean clip `load` to: the loads above `top` give their
// excess, those under `floor` take it. Already within the target (or no
// load): the loads' own minimum and maximum.
struct SpreadLevels {
  double floor = 0, top = 0;
};
SpreadLevels levels_for_spread(std::span<const double> load, double target);

struct SpreadBound {
  double moves = 0;  // pairs that must move, at least
  double pairs = 0;  // pairs in all the cells
  double share() const { return pairs > 0 ? moves / pairs : 0.0; }
};

// The fewest moves that bring the mean over `cells` of each cell's std/mean
// to at most `target` (0 when it already is). A cell with no load counts 0.
SpreadBound min_moves_for_spread(std::span<const std::vector<double>> cells, double target);

}  // namespace moed::runtime
