// The weights one rank serves with: every layer's router gate and norm (the
// router is replicated) and the experts of this rank's slots, in fp32. With
// [experts].gemm = "fixed-order" the experts are held packed for that GEMM
// (packed once, at load or when a migrated slot arrives), else row-major.
#pragma once

#include <cstddef>
#include <map>
#include <utility>
#include <vector>

#include "kernels/cpu/expert_ffn.h"
#include "placement/placement.h"
#include "runtime/config.h"
#include "runtime/model.h"

namespace moed::runtime {

struct LayerWeights {
  std::vector<float> gate;  // [experts, hidden]
  std::vector<float> norm;  // [hidden]
};

class ExpertStore {
 public:
  // From [model].weights (a checkpoint: only the tensors this rank needs are
  // read) or, when that is empty, from the synthetic model of [model].seed.
  static ExpertStore load(const Config& config, const placement::Placement& placement, int rank);

  const ModelShape& shape() const { return shape_; }
  const LayerWeights& layer(int l) const { return layers_.at(l); }
  bool holds(int layer, int expert) const;
  kernels::ExpertView expert(int layer, int expert) const;  // Internal error if not held
  std::size_t expert_bytes() const;                          // fp32 bytes of the held slots
  int slots() const;

  bool packed() const { return packed_; }

  // Live migration moves slots as flat fp32 arrays: W1|W3 ([2F, H]) then W2
  // ([H, F]), row-major whichever way the two ranks hold them.
  std::size_t slot_floats() const { return 3 * std::size_t(shape_.hidden) * std::size_t(shape_.ffn); }
  void copy_slot(int layer, int expert, float* out) const;  // slot_floats() floats
  void add_slot(int layer, int expert, const float* weights);
  void drop_slot(int layer, int expert);

 private:
  // One of the two forms, as packed_ says.
  struct Slot {
    kernels::PackedWeights w13_packed, w2_packed;
    std::vector<float> w13;  // [2F, H]
    std::vector<float> w2;   // [H, F]
  };
  Slot make_slot(std::vector<float> w13, std::vector<float> w2) const;
  const Slot* find(int layer, int expert) const;

  ModelShape shape_;
  bool packed_ = true;
  std::vector<LayerWeights> layers_;
  std::map<std::pair<int, int>, Slot> slots_;  // (layer, expert) -> weights
};

}  // namespace moed::runtime
