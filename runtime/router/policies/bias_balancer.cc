#include "runtime/router/policies/bias_balancer.h"

#include <cmath>
#include <utility>

#include "common/error.h"

namespace moed::runtime {

BiasBalancer::BiasBalancer(int layers, int experts, double gamma)
    : layers_(layers), experts_(experts), gamma_(gamma), bias_(std::size_t(layers) * std::size_t(experts), 0.0) {}

std::span<const double> BiasBalancer::layer(int layer) const {
  return {bias_.data() + std::size_t(layer) * std::size_t(experts_), std::size_t(experts_)};
}

void BiasBalancer::update(int layer, std::span<const std::uint64_t> load) {
  MOED_CHECK(layer >= 0 && layer < layers_ && load.size() == std::size_t(experts_),
             "bias update: layer {} of {}, {} loads for {} experts", layer, layers_, load.size(), experts_);
  std::uint64_t total = 0;
  for (std::uint64_t n : load) total += n;
  if (total == 0) return;
  double* b = bias_.data() + std::size_t(layer) * std::size_t(experts_);
  // load vs mean, compared in integers: load x experts vs total.
  for (std::size_t e = 0; e < load.size(); ++e) {
    const std::uint64_t scaled = load[e] * std::uint64_t(experts_);
    if (scaled < total) b[e] += gamma_;
    else if (scaled > total) b[e] -= gamma_;
  }
}

void BiasBalancer::set_values(std::vector<double> values) {
  MOED_CHECK(values.size() == bias_.size(), "router biases: {} values for {} layers x {} experts", values.size(),
             layers_, experts_);
  for (double v : values) MOED_CHECK(std::isfinite(v), "router bias {} is not finite", v);
  bias_ = std::move(values);
}

}  // namespace moed::runtime
