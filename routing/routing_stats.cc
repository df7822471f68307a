#include "routing/routing_stats.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "common/error.h"

namespace moed::routing {

namespace {

// Past this weight the stored values are divided back to weight 1. Far below
// the range of double (and of the counts a daemon adds), far above the point
// where renormalising often would cost anything.
constexpr double kMaxWeight = 0x1p64;

std::size_t pairs(std::size_t experts) { return experts * (experts - 1) / 2; }

}  // namespace

// ------------------------------------------------------------------ shape

RoutingStats::RoutingStats(int layers, int experts, double half_life_steps,
                           std::size_t sample_tokens, int max_k)
    : layers_(layers),
      experts_(experts),
      max_k_(max_k),
      half_life_(half_life_steps),
      sample_capacity_(sample_tokens) {
  MOED_CHECK(layers >= 1 && experts >= 1, "stats shape {} layers x {} experts", layers, experts);
  MOED_CHECK(max_k >= 1, "max_k {}", max_k);
  MOED_CHECK(std::isfinite(half_life_steps) && half_life_steps >= 0, "half-life {} steps",
             half_life_steps);
  const auto L = static_cast<std::size_t>(layers), E = static_cast<std::size_t>(experts);
  coact_base_ = L * E;
  affinity_base_ = coact_base_ + L * pairs(E);
  tokens_base_ = affinity_base_ + (L - 1) * E * E;
  values_.assign(value_count(L, E), 0.0);
  path_size_ = L * (static_cast<std::size_t>(max_k) + 1);
  // Reserved once, so that sampling a token never allocates.
  sample_.reserve(sample_capacity_ * path_size_);
}

// values_ of a shape: loads, co-activation triangles, affinity squares, tokens.
std::size_t RoutingStats::value_count(std::size_t layers, std::size_t experts) {
  return layers * experts + layers * pairs(experts) + (layers - 1) * experts * experts + layers;
}

std::string RoutingStats::describe_value(std::size_t i) const {
  const auto layers = static_cast<std::size_t>(layers_), experts = static_cast<std::size_t>(experts_);
  const std::size_t loads = layers * experts, coact = layers * pairs(experts),
                    affinity = (layers - 1) * experts * experts;
  if (i < loads) return fmt::format("load of layer {} expert {}", i / experts, i % experts);
  i -= loads;
  if (i < coact) return fmt::format("co-activation of layer {}", i / pairs(experts));
  i -= coact;
  if (i < affinity)
    return fmt::format("affinity of layer {} (expert {} to {})", i / (experts * experts),
                       i % (experts * experts) / experts, i % experts);
  return fmt::format("tokens of layer {}", i - affinity);
}

std::size_t RoutingStats::load_index(int layer, int e) const {
  MOED_CHECK(layer >= 0 && layer < layers_ && e >= 0 && e < experts_, "load ({}, {}) of {}x{}",
             layer, e, layers_, experts_);
  return static_cast<std::size_t>(layer) * static_cast<std::size_t>(experts_) +
         static_cast<std::size_t>(e);
}

std::size_t RoutingStats::coact_index(int layer, int a, int b) const {
  MOED_CHECK(layer >= 0 && layer < layers_ && a >= 0 && a < experts_ && b >= 0 && b < experts_ &&
                 a != b,
             "co-activation ({}, {}, {}) of {}x{}", layer, a, b, layers_, experts_);
  if (a > b) std::swap(a, b);
  const auto E = static_cast<std::size_t>(experts_), x = static_cast<std::size_t>(a),
             y = static_cast<std::size_t>(b);
  // Row x of the strict upper triangle starts after rows 0..x-1, which hold
  // (E-1) + (E-2) + ... + (E-x) pairs.
  const std::size_t row = x * E - x * (x + 1) / 2;
  return coact_base_ + static_cast<std::size_t>(layer) * pairs(E) + row + (y - x - 1);
}

std::size_t RoutingStats::affinity_index(int layer, int a, int b) const {
  MOED_CHECK(layer >= 0 && layer + 1 < layers_ && a >= 0 && a < experts_ && b >= 0 &&
                 b < experts_,
             "affinity ({}, {}, {}) of {}x{}: the last layer has no next layer", layer, a, b,
             layers_, experts_);
  const auto E = static_cast<std::size_t>(experts_);
  return affinity_base_ + static_cast<std::size_t>(layer) * E * E +
         static_cast<std::size_t>(a) * E + static_cast<std::size_t>(b);
}

std::size_t RoutingStats::tokens_index(int layer) const {
  MOED_CHECK(layer >= 0 && layer < layers_, "layer {} of {}", layer, layers_);
  return tokens_base_ + static_cast<std::size_t>(layer);
}

// ---------------------------------------------------------------- counting

void RoutingStats::check_experts(int layer, std::span<const std::uint32_t> experts) const {
  MOED_CHECK(layer >= 0 && layer < layers_, "layer {} of {}", layer, layers_);
  for (std::size_t i = 0; i < experts.size(); ++i) {
    MOED_CHECK(experts[i] < static_cast<std::uint32_t>(experts_), "layer {}: expert {} of {}",
               layer, experts[i], experts_);
    for (std::size_t j = 0; j < i; ++j)
      MOED_CHECK(experts[j] != experts[i], "layer {}: expert {} twice", layer, experts[i]);
  }
}

// The serving path: once the list is checked, plain pointer arithmetic (no
// per-pair checks), no allocation.
void RoutingStats::add_choice(int layer, std::span<const std::uint32_t> experts) {
  check_experts(layer, experts);
  const double w = weight_;
  const auto E = static_cast<std::size_t>(experts_);
  const auto l = static_cast<std::size_t>(layer);
  double* load = values_.data() + l * E;
  double* triangle = values_.data() + coact_base_ + l * pairs(E);
  for (std::size_t i = 0; i < experts.size(); ++i) {
    load[experts[i]] += w;
    for (std::size_t j = i + 1; j < experts.size(); ++j) {
      const std::size_t a = std::min(experts[i], experts[j]), b = std::max(experts[i], experts[j]);
      // Row a of the strict upper triangle starts after (E-1) + ... + (E-a) pairs.
      triangle[a * E - a * (a + 1) / 2 + (b - a - 1)] += w;
    }
  }
  values_[tokens_base_ + l] += w;
}

void RoutingStats::add_transition(int layer, std::span<const std::uint32_t> from,
                                  std::span<const std::uint32_t> to) {
  MOED_CHECK(layer >= 0 && layer + 1 < layers_, "transition from layer {} of {}", layer, layers_);
  check_experts(layer, from);
  check_experts(layer + 1, to);
  const double w = weight_;
  const auto E = static_cast<std::size_t>(experts_);
  double* square = values_.data() + affinity_base_ + static_cast<std::size_t>(layer) * E * E;
  for (std::uint32_t a : from) {
    double* row = square + a * E;
    for (std::uint32_t b : to) row[b] += w;
  }
}

void RoutingStats::end_step() {
  ++steps_;
  if (half_life_ == 0) return;
  ++decay_steps_;
  // From the step count rather than by multiplying by 2^(1/h) each step: the
  // weight after exactly h steps is exactly 2, and rounding does not pile up.
  weight_ = std::exp2(static_cast<double>(decay_steps_) / half_life_);
  if (weight_ > kMaxWeight) normalize();
}

void RoutingStats::normalize() {
  // A division (not a multiplication by 1 / weight_) gives bit for bit what
  // the accessors returned before.
  if (weight_ != 1.0)
    for (double& v : values_) v /= weight_;
  weight_ = 1.0;
  decay_steps_ = 0;
}

double RoutingStats::load(int layer, int expert) const {
  return values_[load_index(layer, expert)] / weight_;
}

double RoutingStats::coactivation(int layer, int a, int b) const {
  if (a == b) {
    MOED_CHECK(layer >= 0 && layer < layers_ && a >= 0 && a < experts_,
               "co-activation ({}, {}, {}) of {}x{}", layer, a, b, layers_, experts_);
    return 0.0;
  }
  return values_[coact_index(layer, a, b)] / weight_;
}

double RoutingStats::affinity(int layer, int a, int b) const {
  return values_[affinity_index(layer, a, b)] / weight_;
}

double RoutingStats::tokens(int layer) const { return values_[tokens_index(layer)] / weight_; }

// ------------------------------------------------------------------ sample

void RoutingStats::set_router_bias(std::vector<double> bias) {
  MOED_CHECK(bias.empty() || bias.size() == std::size_t(layers_) * std::size_t(experts_),
             "router biases: {} values for {} layers x {} experts", bias.size(), layers_, experts_);
  router_bias_ = std::move(bias);
}

std::size_t RoutingStats::sample_size() const { return sample_count_; }

void RoutingStats::add_sample(const std::vector<std::span<const std::uint32_t>>& path) {
  MOED_CHECK(path.size() == static_cast<std::size_t>(layers_), "path of {} layers, expected {}",
             path.size(), layers_);
  for (int l = 0; l < layers_; ++l) {
    const auto& cell = path[static_cast<std::size_t>(l)];
    MOED_CHECK(cell.size() <= static_cast<std::size_t>(max_k_),
               "layer {}: {} experts, more than max_k {}", l, cell.size(), max_k_);
    check_experts(l, cell);
  }
  if (sample_capacity_ == 0) return;
  std::uint32_t* out = next_sample_slot();
  const std::size_t width = static_cast<std::size_t>(max_k_) + 1;
  for (const auto& cell : path) {
    out[0] = static_cast<std::uint32_t>(cell.size());
    std::copy(cell.begin(), cell.end(), out + 1);
    std::fill(out + 1 + cell.size(), out + width, 0u);
    out += width;
  }
}

std::uint32_t* RoutingStats::next_sample_slot() {
  const std::size_t slot = sample_next_;
  if (sample_count_ < sample_capacity_) {
    sample_.resize(sample_.size() + path_size_);  // within the reserved capacity
    ++sample_count_;
  }
  sample_next_ = (sample_next_ + 1) % sample_capacity_;
  return sample_.data() + slot * path_size_;
}

void RoutingStats::order_sample() const {
  // Only a full ring is out of order (a filling one appends at the end).
  if (sample_next_ == 0 || sample_count_ < sample_capacity_) return;
  const auto first = static_cast<std::ptrdiff_t>(sample_next_ * path_size_);
  std::rotate(sample_.begin(), sample_.begin() + first, sample_.end());
  sample_next_ = 0;
}

void RoutingStats::check_paths(std::span<const std::uint32_t> cells, std::size_t width) const {
  const std::size_t path = static_cast<std::size_t>(layers_) * width;
  MOED_CHECK(cells.size() % path == 0, "{} sample u32 are not whole paths of {}", cells.size(),
             path);
  for (std::size_t c = 0; c < cells.size(); c += width) {
    const int layer = static_cast<int>((c / width) % static_cast<std::size_t>(layers_));
    const std::uint32_t count = cells[c];
    MOED_CHECK(count < width && count <= static_cast<std::uint32_t>(max_k_),
               "sample cell of {} experts, more than max_k {}", count, max_k_);
    check_experts(layer, cells.subspan(c + 1, count));
  }
}

void RoutingStats::append_paths(std::span<const std::uint32_t> cells, std::size_t width) {
  check_paths(cells, width);
  if (sample_capacity_ == 0) return;
  const std::size_t path = static_cast<std::size_t>(layers_) * width;
  std::size_t paths = cells.size() / path;
  // Paths that the ring would evict before this call returns are skipped.
  const std::size_t skip = paths > sample_capacity_ ? paths - sample_capacity_ : 0;
  const std::size_t own_width = static_cast<std::size_t>(max_k_) + 1;
  for (std::size_t p = skip; p < paths; ++p) {
    std::uint32_t* out = next_sample_slot();
    for (std::size_t c = p * path; c < (p + 1) * path; c += width, out += own_width) {
      const std::uint32_t count = cells[c];
      std::copy_n(cells.begin() + static_cast<std::ptrdiff_t>(c), count + 1, out);
      std::fill(out + 1 + count, out + own_width, 0u);
    }
  }
}

void RoutingStats::append_sample_cells(std::span<const std::uint32_t> cells) {
  append_paths(cells, static_cast<std::size_t>(max_k_) + 1);
}

void RoutingStats::append_sample(const RoutingStats& other) {
  MOED_CHECK(other.layers_ == layers_ && other.experts_ == experts_,
             "appending the sample of {}x{} statistics to {}x{}", other.layers_, other.experts_,
             layers_, experts_);
  const std::size_t width = static_cast<std::size_t>(other.max_k_) + 1;
  if (&other == this) {
    const std::vector<std::uint32_t> copy = sample_cells();  // we overwrite what we read
    append_paths(copy, width);
  } else {
    append_paths(other.sample_cells(), width);
  }
}

RoutingTrace RoutingStats::sample_trace() const {
  RoutingTrace trace(layers_, experts_);
  std::vector<std::vector<RoutingChoice>> per_layer(static_cast<std::size_t>(layers_));
  const std::vector<std::uint32_t>& cells = sample_cells();
  const std::size_t width = static_cast<std::size_t>(max_k_) + 1;
  for (std::size_t p = 0; p < sample_count_; ++p) {
    const std::uint32_t* cell = cells.data() + p * path_size_;
    for (auto& group : per_layer) {
      group.clear();
      const std::uint32_t count = cell[0];
      for (std::uint32_t i = 0; i < count; ++i)
        group.push_back({cell[1 + i], 1.0f / static_cast<float>(count)});
      cell += width;
    }
    trace.add_token(per_layer);
  }
  return trace;
}

RoutingStats RoutingStats::from_trace(const RoutingTrace& trace, std::size_t first,
                                      std::size_t count) {
  MOED_CHECK(first <= trace.tokens() && count <= trace.tokens() - first,
             "tokens [{}, {} + {}) of a trace of {}", first, first, count, trace.tokens());
  const int L = trace.layers();
  RoutingStats stats(L, trace.experts(), 0.0, count, std::max(trace.top_k(), 1));
  std::vector<std::vector<std::uint32_t>> experts(static_cast<std::size_t>(L));
  std::vector<std::span<const std::uint32_t>> path(static_cast<std::size_t>(L));
  for (std::size_t t = first; t < first + count; ++t) {
    for (int l = 0; l < L; ++l) {
      auto& cell = experts[static_cast<std::size_t>(l)];
      cell.clear();
      for (const RoutingChoice& c : trace.at(t, l)) cell.push_back(c.expert);
      path[static_cast<std::size_t>(l)] = cell;
    }
    for (int l = 0; l < L; ++l) {
      const auto& cell = experts[static_cast<std::size_t>(l)];
      if (cell.empty()) continue;  // no routing recorded here
      stats.add_choice(l, cell);
      if (l + 1 < L && !experts[static_cast<std::size_t>(l) + 1].empty())
        stats.add_transition(l, cell, experts[static_cast<std::size_t>(l) + 1]);
    }
    stats.add_sample(path);
  }
  return stats;
}

}  // namespace moed::routing
