// Online bias balancing, as DeepSeek-V3's auxiliary-loss-free balancing: a
// bias per (layer, expert) is added to the gate's logits for selection only
// (never to the gate weights), and after each step's layer every bias moves
// by gamma toward balance: up for an expert under the mean load, down for one
// over it (the sign of the gap, as in DeepSeek-V3). Pure: the same loads give
// the same biases, so every rank fed the all-gathered loads holds the same.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace moed::runtime {

class BiasBalancer {
 public:
  BiasBalancer(int layers, int experts, double gamma);

  // The biases of `layer` (experts values).
  std::span<const double> layer(int layer) const;
  // One step's loads of `layer` (pairs per expert, whole job).
  void update(int layer, std::span<const std::uint64_t> load);

  // [layer * experts + e]: what the statistics file keeps (set: a resumed run).
  const std::vector<double>& values() const { return bias_; }
  void set_values(std::vector<double> values);

 private:
  int layers_, experts_;
  double gamma_;
  std::vector<double> bias_;
};

}  // namespace moed::runtime
