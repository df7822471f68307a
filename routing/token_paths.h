// Routing statistics from tokens that arrive one layer at a time. Through
// the front door, a token's layers come in separate steps (its attention
// runs in between), so the transitions between layers and the whole paths
// that placement needs cannot be read off one step. TokenPaths follows
// tokens by (request id, position) and feeds RoutingStats as their layers
// arrive: every layer's choice at once, a transition when the token's
// previous layer was seen, and the path into the sample once a token has
// been seen at every layer in order.
//
// Bounded: at most `capacity` tokens are followed; a new one evicts the one
// followed longest. Pure: no threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "routing/routing_stats.h"

namespace moed::routing {

class TokenPaths {
 public:
  TokenPaths(int layers, int max_k, std::size_t capacity);

  void observe(std::uint64_t request, std::uint32_t position, int layer, std::span<const std::uint32_t> experts,
               RoutingStats& stats);
  std::size_t followed() const { return index_.size(); }

 private:
  struct Key {
    std::uint64_t request;
    std::uint32_t position;
    bool operator==(const Key&) const = default;
  };
  struct KeyHash {
    std::size_t operator()(const Key& k) const;
  };
  struct Entry {
    Key key{};
    int last_layer = -1;  // the layer seen last
    bool whole = false;   // seen at every layer from 0 to last_layer, in order
    bool used = false;
  };
  std::span<std::uint32_t> cell(std::size_t entry, int layer);  // count, then experts
  std::size_t take_entry(const Key& key);                       // a fresh entry (evicting the oldest)

  int layers_, max_k_;
  std::size_t capacity_;
  std::vector<Entry> entries_;
  std::vector<std::uint32_t> cells_;  // capacity x layers x (max_k + 1)
  std::size_t next_ = 0;              // the entry to reuse next (FIFO)
  std::unordered_map<Key, std::size_t, KeyHash> index_;
};

}  // namespace moed::routing
