#include "routing/token_paths.h"

#include <algorithm>

#include "common/error.h"
#include "common/rng.h"

namespace moed::routing {

std::size_t TokenPaths::KeyHash::operator()(const Key& k) const {
  return std::size_t(hash_combine(k.request, k.position));
}

TokenPaths::TokenPaths(int layers, int max_k, std::size_t capacity)
    : layers_(layers),
      max_k_(max_k),
      capacity_(std::max<std::size_t>(capacity, 1)),
      entries_(capacity_),
      cells_(capacity_ * std::size_t(layers) * std::size_t(max_k + 1), 0) {
  index_.reserve(capacity_);
}

std::span<std::uint32_t> TokenPaths::cell(std::size_t entry, int layer) {
  const std::size_t width = std::size_t(max_k_ + 1);
  return {cells_.data() + (entry * std::size_t(layers_) + std::size_t(layer)) * width, width};
}

std::size_t TokenPaths::take_entry(const Key& key) {
  const std::size_t e = next_;
  next_ = (next_ + 1) % capacity_;
  if (entries_[e].used) index_.erase(entries_[e].key);
  entries_[e] = {key, -1, false, true};
  index_[key] = e;
  return e;
}

void TokenPaths::observe(std::uint64_t request, std::uint32_t position, int layer,
                         std::span<const std::uint32_t> experts, RoutingStats& stats) {
  MOED_CHECK(layer >= 0 && layer < layers_ && experts.size() <= std::size_t(max_k_),
             "token path: layer {} with {} experts (layers {}, max_k {})", layer, experts.size(), layers_, max_k_);
  stats.add_choice(layer, experts);
  const Key key{request, position};
  auto it = index_.find(key);
  const std::size_t e = it == index_.end() ? take_entry(key) : it->second;
  Entry& entry = entries_[e];
  const bool follows = layer > 0 && entry.last_layer == layer - 1;
  if (follows) {
    std::span<std::uint32_t> prev = cell(e, layer - 1);
    stats.add_transition(layer - 1, prev.subspan(1, prev[0]), experts);
  }
  entry.whole = layer == 0 || (entry.whole && follows);
  entry.last_layer = layer;
  std::span<std::uint32_t> c = cell(e, layer);
  c[0] = std::uint32_t(experts.size());
  std::copy(experts.begin(), experts.end(), c.begin() + 1);
  if (layer == layers_ - 1 && entry.whole) {
    std::vector<std::span<const std::uint32_t>> path(static_cast<std::size_t>(layers_));
    for (int l = 0; l < layers_; ++l) {
      std::span<std::uint32_t> p = cell(e, l);
      path[std::size_t(l)] = p.subspan(1, p[0]);
    }
    stats.add_sample(path);
    entry.whole = false;
  }
}

}  // namespace moed::routing
