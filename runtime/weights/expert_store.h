// The weights one rank serves with: every layer's router gate and norm (the
// router is replicated, and always fp32), its shared expert (every rank holds
// it whole) and the experts of this rank's slots, read in the model family's
// names and layout (runtime/weights/model.h). Experts, shared experts and
// dense layers are held in [experts].dtype (kernels/cpu/weight_codes.h): a
// checkpoint's own format by default. With [experts].gemm = "fixed-order"
// they are held packed for that GEMM (packed once, at load or when a
// migrated slot arrives), else row-major fp32 for OpenBLAS.
// A slot may hold one shard of a split expert (placement/placement.h): its
// F/S rows of W1 and W3 and columns of W2 (kernels/cpu/expert_ffn.h), served
// as a view of F/S and [experts].ffn_chunks / S canonical chunks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "kernels/cpu/bf16_dot_gemm.h"
#include "kernels/cpu/expert_ffn.h"
#include "placement/placement.h"
#include "runtime/config/config.h"
#include "runtime/weights/model.h"

namespace moed::runtime {

struct LayerWeights {
  std::vector<float> gate;            // [experts, hidden]
  std::vector<float> norm;            // [hidden]
  std::vector<float> gate_bias;       // [experts] (gpt-oss's router.bias), else empty
  std::vector<float> selection_bias;  // [experts] (DeepSeek-V3's e_score_correction_bias), else empty
  std::vector<float> shared_gate;     // [hidden] (Qwen2-MoE's shared_expert_gate), else empty
};

// An expert's tensors as loaded, in moed's layout and the format held:
// W1|W3 [2F, H], W2 [H, F] and (biased families) b1|b3 [2F], b2 [H] in fp32.
struct ExpertTensors {
  kernels::EncodedMatrix w13, w2;
  std::vector<float> b13, b2;
};

class ExpertStore {
 public:
  // From [model].weights (a checkpoint: only the tensors this rank needs are
  // read) or, when that is empty, from the synthetic model of [model].seed.
  static ExpertStore load(const Config& config, const placement::Placement& placement, int rank);

  const ModelShape& shape() const { return shape_; }
  const LayerWeights& layer(int l) const { return layers_.at(l); }
  bool holds(int layer, int expert) const;
  // The shard of (layer, expert) held here (0 of 1 for a whole copy): {shard, shards}.
  std::pair<int, int> shard_of(int layer, int expert) const;
  int ffn_chunks() const { return ffn_chunks_; }
  kernels::ExpertView expert(int layer, int expert) const;  // Internal error if not held
  // The layer's shared expert, held whole by every rank (never placed or
  // migrated); false when the family has none.
  bool has_shared() const;
  kernels::ExpertView shared_expert(int layer) const;
  // The dense layers served ([model].serve_dense; none otherwise), each held
  // whole by every rank like a shared expert, in model layer order:
  // dense layer d is model layer dense_model_layer(d).
  int dense_layers() const { return int(dense_.size()); }
  int dense_model_layer(int d) const { return dense_.at(std::size_t(d)).model_layer; }
  const std::vector<float>& dense_norm(int d) const { return dense_.at(std::size_t(d)).norm; }
  kernels::ExpertView dense_ffn(int d) const;
  std::size_t expert_bytes() const;  // bytes of the held slots, as slot_bytes counts them
  std::size_t shared_bytes() const;  // bytes of the shared experts and dense layers
  int slots() const;

  bool packed() const { return packed_; }
  kernels::WeightDtype dtype() const { return dtype_; }

  // Live migration moves a slot as its bytes in the format held
  // (kernels/cpu/encoded_matrix.h, row-major whichever way the two ranks
  // pack them): W1|W3 ([2F, H]), then W2 ([H, F]), each its codes then its
  // scales, then the biases in fp32 when the family has them (b1|b3 [2F],
  // b2 [H]); a shard's are its own ([2F/S, H], [H, F/S], [2F/S], and b2
  // whole): slot_bytes(S) bytes.
  std::size_t slot_bytes(int shards = 1) const;
  void copy_slot(int layer, int expert, std::uint8_t* out) const;  // slot_bytes(its shards) bytes
  // Shard `shard` of `shards` cut from the whole copy held here, as
  // copy_slot writes a slot of that shard (slot_bytes(shards) bytes): what a
  // migration that splits the expert sends to the shard's rank.
  void copy_shard(int layer, int expert, int shard, int shards, std::uint8_t* out) const;
  // Installs shard `shard` of `shards` (0 of 1: a whole copy). `replace`: in
  // place of the whole copy held here (a split's shard on a former holder).
  void add_slot(int layer, int expert, const std::uint8_t* bytes, int shard = 0, int shards = 1, bool replace = false);
  void drop_slot(int layer, int expert);
  // Elastic serving: whole copies of `experts` ((layer, expert)) read from
  // where load() read its own (the checkpoint, or the synthetic model): a
  // lost rank's experts that no survivor holds. Those held already stay.
  void load_experts(const Config& config, const std::vector<std::pair<int, int>>& experts);

 private:
  // One of the three forms: compact (dtype_ not f32), packed fp32 or row-major fp32 (packed_).
  struct Slot {
    kernels::QuantWeights w13_quant, w2_quant;
    kernels::PackedWeights w13_packed, w2_packed;
    std::vector<float> w13;  // [2F/S, H]
    std::vector<float> w2;   // [H, F/S]
    std::vector<float> b13;  // [2F/S] (biased families), else empty
    std::vector<float> b2;   // [H]
    int shard = 0, shards = 1;
    std::size_t ffn = 0;     // F of the whole expert (the shared expert's own)
    std::uint64_t serial = 0;  // kernels::ExpertView::serial
  };
  bool biased() const { return shape_.spec.expert.biases; }
  Slot make_slot(ExpertTensors t, std::size_t ffn, int shard, int shards) const;
  Slot bare_slot(std::vector<float> b13, std::vector<float> b2, std::size_t ffn, int shard, int shards) const;
  Slot f32_slot(const float* w13, const float* w2, std::vector<float> b13, std::vector<float> b2, std::size_t ffn,
                int shard, int shards) const;
  kernels::ExpertView view_of(const Slot& slot, std::size_t chunks) const;
  // A slot's bytes (as copy_slot writes them) read back into tensors, F its shard's width.
  ExpertTensors tensors_from_bytes(const std::uint8_t* bytes, std::size_t F) const;
  // A slot's weights as tensors (one copy of them), as it was made from.
  ExpertTensors tensors_of(const Slot& slot) const;
  const Slot* find(int layer, int expert) const;

  ModelShape shape_;
  bool packed_ = true;
  kernels::WeightDtype dtype_ = kernels::WeightDtype::f32;
  int ffn_chunks_ = 1;
  std::vector<LayerWeights> layers_;
  std::map<std::pair<int, int>, Slot> slots_;  // (layer, expert) -> weights
  std::vector<Slot> shared_;                   // per layer, when the family has a shared expert
  struct DenseLayer {
    int model_layer = 0;
    std::vector<float> norm;  // [hidden]: its post_attention_layernorm
    Slot ffn;
  };
  std::vector<DenseLayer> dense_;
};

// [experts].products on this host: f32 for f32 experts; bf16, amx or int8
// where asked (a Usage error where the CPU cannot: AVX-512 BF16 or VNNI and
// VBMI, or AMX-BF16, with the avx512 GEMM kernel); for auto, amx where this
// host can, else bf16 where it can. The daemon's ranks then agree
// (agreed_products).
kernels::CompactProducts local_products(const Config& c);

// How able a host is under products = auto: amx 2, bf16 1, anything else 0.
int products_ability(kernels::CompactProducts products);
// What a rank choosing `here` multiplies with when the least able rank's
// ability is `least`: `here` where it is no more able than that, else the
// most able choice within it (bf16 or f32).
kernels::CompactProducts agreed_products(kernels::CompactProducts here, int least);

}  // namespace moed::runtime
