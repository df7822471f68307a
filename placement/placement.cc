#include "placement/placement.h"

#include <algorithm>
#include <numeric>

#include "common/error.h"
#include "common/rng.h"

namespace moed::placement {

Placement::Placement(int ranks, int layers, int experts)
    : ranks_(ranks), layers_(layers), experts_(experts) {
  MOED_CHECK(ranks > 0 && layers > 0 && experts > 0, "placement shape {}x{}x{}", ranks, layers,
             experts);
  slots_.resize(std::size_t(layers) * std::size_t(experts));
  shards_.assign(slots_.size(), 1);
}

const std::vector<int>& Placement::replicas(int layer, int expert) const {
  MOED_CHECK(layer >= 0 && layer < layers_ && expert >= 0 && expert < experts_,
             "(layer {}, expert {}) outside {}x{}", layer, expert, layers_, experts_);
  return slots_[size_t(layer) * experts_ + expert];
}

void Placement::set_replicas(int layer, int expert, std::vector<int> ranks) {
  MOED_CHECK(layer >= 0 && layer < layers_ && expert >= 0 && expert < experts_,
             "(layer {}, expert {}) outside {}x{}", layer, expert, layers_, experts_);
  slots_[size_t(layer) * experts_ + expert] = std::move(ranks);
  shards_[size_t(layer) * experts_ + expert] = 1;
}

void Placement::set_shards(int layer, int expert, std::vector<int> ranks, int shards) {
  const int S = shards ? shards : int(ranks.size());
  MOED_CHECK(S >= 2 && !ranks.empty() && ranks.size() % std::size_t(S) == 0,
             "layer {} expert {}: {} ranks for copies of {} shards (at least 2 are a split)", layer, expert,
             ranks.size(), S);
  set_replicas(layer, expert, std::move(ranks));
  shards_[size_t(layer) * experts_ + expert] = S;
}

int Placement::copies(int layer, int expert) const {
  return int(replicas(layer, expert).size()) / shards(layer, expert);
}

std::span<const int> Placement::copy(int layer, int expert, int c) const {
  const auto& ranks = replicas(layer, expert);
  const int S = shards(layer, expert);
  MOED_CHECK(c >= 0 && std::size_t(c + 1) * std::size_t(S) <= ranks.size(),
             "layer {} expert {}: copy {} of {}", layer, expert, c, copies(layer, expert));
  return std::span<const int>(ranks).subspan(std::size_t(c) * std::size_t(S), std::size_t(S));
}

int Placement::shards(int layer, int expert) const {
  replicas(layer, expert);  // checks the range
  return shards_[size_t(layer) * experts_ + expert];
}

int Placement::shard_on(int layer, int expert, int rank) const {
  const auto& ranks = replicas(layer, expert);
  const auto it = std::find(ranks.begin(), ranks.end(), rank);
  if (it == ranks.end()) return -1;
  return int(it - ranks.begin()) % shards(layer, expert);
}

int Placement::copy_on(int layer, int expert, int rank) const {
  const auto& ranks = replicas(layer, expert);
  const auto it = std::find(ranks.begin(), ranks.end(), rank);
  if (it == ranks.end()) return -1;
  return int(it - ranks.begin()) / shards(layer, expert);
}

bool Placement::any_sharded() const {
  return std::any_of(shards_.begin(), shards_.end(), [](int s) { return s > 1; });
}

std::vector<int> Placement::experts_on(int layer, int rank) const {
  std::vector<int> out;
  for (int e = 0; e < experts_; ++e) {
    const auto& r = replicas(layer, e);
    if (std::find(r.begin(), r.end(), rank) != r.end()) out.push_back(e);
  }
  return out;
}

int Placement::slots_on(int rank) const {
  int n = 0;
  for (const auto& ranks : slots_) n += int(std::count(ranks.begin(), ranks.end(), rank));
  return n;
}

int Placement::max_slots_per_rank() const {
  int best = 0;
  for (int r = 0; r < ranks_; ++r) best = std::max(best, slots_on(r));
  return best;
}

void Placement::validate(const std::string& origin, int max_slots) const {
  for (int l = 0; l < layers_; ++l) {
    for (int e = 0; e < experts_; ++e) {
      const auto& ranks = replicas(l, e);
      if (ranks.empty()) MOED_THROW(Input, "{}: layer {} expert {} has no slot", origin, l, e);
      for (size_t i = 0; i < ranks.size(); ++i) {
        if (ranks[i] < 0 || ranks[i] >= ranks_)
          MOED_THROW(Input, "{}: layer {} expert {} is placed on rank {}, but ranks are 0..{}",
                     origin, l, e, ranks[i], ranks_ - 1);
        if (std::find(ranks.begin(), ranks.begin() + i, ranks[i]) != ranks.begin() + i)
          MOED_THROW(Input, "{}: layer {} expert {} lists rank {} twice{}", origin, l, e, ranks[i],
                     sharded(l, e) ? " (a rank holds at most one shard of an expert)" : "");
      }
      if (ranks.size() % std::size_t(shards(l, e)) != 0)
        MOED_THROW(Input, "{}: layer {} expert {} is split into {} shards but {} ranks hold them (whole copies of "
                   "{} shards each)", origin, l, e, shards(l, e), ranks.size(), shards(l, e));
    }
  }
  if (max_slots > 0) {
    for (int r = 0; r < ranks_; ++r)
      if (int n = slots_on(r); n > max_slots)
        MOED_THROW(Input, "{}: rank {} holds {} slots, more than the capacity of {} per rank", origin,
                   r, n, max_slots);
  }
}

namespace {

// Expert at position i of `order` goes to rank i / ceil(E / R).
Placement blocks_of(int ranks, int layers, int experts,
                    const std::vector<std::vector<int>>& order_per_layer) {
  Placement p(ranks, layers, experts);
  int per_rank = (experts + ranks - 1) / ranks;
  for (int l = 0; l < layers; ++l)
    for (int i = 0; i < experts; ++i) p.set_replicas(l, order_per_layer[l][i], {i / per_rank});
  return p;
}

std::vector<int> identity(int n) {
  std::vector<int> v(n);
  std::iota(v.begin(), v.end(), 0);
  return v;
}

}  // namespace

Placement contiguous(int ranks, int layers, int experts) {
  return blocks_of(ranks, layers, experts, std::vector(layers, identity(experts)));
}

Placement round_robin(int ranks, int layers, int experts) {
  Placement p(ranks, layers, experts);
  for (int l = 0; l < layers; ++l)
    for (int e = 0; e < experts; ++e) p.set_replicas(l, e, {e % ranks});
  return p;
}

Placement shuffled(int ranks, int layers, int experts, std::uint64_t seed) {
  std::vector<std::vector<int>> orders;
  for (int l = 0; l < layers; ++l) {
    Rng rng(hash_combine(seed, hash_combine(hash_name("shuffled-placement"), l)));
    std::vector<int> order = identity(experts);
    for (int i = experts - 1; i > 0; --i) std::swap(order[i], order[rng.below(i + 1)]);
    orders.push_back(std::move(order));
  }
  return blocks_of(ranks, layers, experts, orders);
}

Placement add_random_replicas(Placement p, int extra, std::uint64_t seed) {
  if (p.ranks() < 2) return p;
  for (int l = 0; l < p.layers(); ++l) {
    Rng rng(hash_combine(seed, hash_combine(hash_name("random-replicas"), l)));
    for (int n = 0; n < extra; ++n) {
      int e = int(rng.below(p.experts()));
      std::vector<int> ranks = p.replicas(l, e);
      if (int(ranks.size()) >= p.ranks()) continue;  // already everywhere
      int r;
      do r = int(rng.below(p.ranks()));
      while (std::find(ranks.begin(), ranks.end(), r) != ranks.end());
      ranks.push_back(r);
      p.set_replicas(l, e, std::move(ranks));
    }
  }
  return p;
}

Placement make_placement(PlacementPolicy policy, int ranks, int layers, int experts,
                         std::uint64_t seed) {
  if (policy == PlacementPolicy::contiguous) return contiguous(ranks, layers, experts);
  if (policy == PlacementPolicy::round_robin) return round_robin(ranks, layers, experts);
  if (policy == PlacementPolicy::shuffled) return shuffled(ranks, layers, experts, seed);
  MOED_THROW(Internal, "unknown placement policy {}", int(policy));
}

}  // namespace moed::placement
