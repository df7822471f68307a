#include "runtime/weights/expert_store.h"

#include <fmt/format.h>

#include <algorithm>
#include <memory>
#include <optional>

#include "common/error.h"
#include "runtime/weights/finite_check.h"
#include "runtime/weights/safetensors.h"
#include "runtime/weights/synthetic_model.h"

namespace moed::runtime {

namespace {

// Where tensors come from: a checkpoint on disk or the synthetic model; each
// checked for NaN and inf as it arrives when [model].check_finite says so.
class TensorSource {
 public:
  TensorSource(const Config& c, const ModelShape& shape)
      : shape_(shape), dtype_(*weights::parse_dtype(c.model.dtype)), check_finite_(c.model.check_finite) {
    if (c.model.weights.empty()) {
      synthetic_.emplace(shape, std::uint64_t(c.model.seed), dtype_);
      synthetic_where_ = fmt::format("synthetic weights (seed {})", c.model.seed);
    } else {
      checkpoint_ = std::make_unique<weights::Checkpoint>(c.model.weights);
    }
  }

  void gate(int l, float* out) const {
    fetch(gate_tensor(l), gate_shape(shape_), out, [&] { synthetic_->gate(l, out); });
  }
  void norm(int l, float* out) const {
    fetch(norm_tensor(l), norm_shape(shape_), out, [&] { synthetic_->norm(l, out); });
  }
  void up(int l, int e, int which, float* out) const {
    fetch(expert_tensor(l, e, which == 1 ? "w1" : "w3"), up_shape(shape_), out,
          [&] { synthetic_->up(l, e, which, out); });
  }
  void down(int l, int e, float* out) const {
    fetch(expert_tensor(l, e, "w2"), down_shape(shape_), out, [&] { synthetic_->down(l, e, out); });
  }

 private:
  template <class MakeSynthetic>
  void fetch(const std::string& name, const std::vector<std::int64_t>& dims, float* out,
             MakeSynthetic&& make) const {
    if (checkpoint_)
      checkpoint_->read_f32(name, dtype_, dims, out);
    else
      make();
    if (check_finite_)
      weights::check_finite(checkpoint_ ? checkpoint_->file_of(name) : synthetic_where_, name, dims, out);
  }

  ModelShape shape_;
  weights::DType dtype_;
  bool check_finite_;
  std::optional<SyntheticModel> synthetic_;
  std::string synthetic_where_;
  std::unique_ptr<weights::Checkpoint> checkpoint_;
};

}  // namespace

ExpertStore ExpertStore::load(const Config& config, const placement::Placement& placement, int rank) {
  ExpertStore store;
  store.shape_ = ModelShape::from(config.model);
  store.packed_ = config.experts.gemm == Gemm::fixed_order;
  store.ffn_chunks_ = int(config.experts.ffn_chunks);
  // OpenBLAS gives no promise that a shard's narrower GEMMs round as the
  // whole expert's columns do; the fixed-order GEMM does (expert_ffn.h).
  if (placement.any_sharded() && !store.packed_)
    MOED_THROW(Input, "the placement splits experts into shards, which needs [experts].gemm = \"fixed-order\" "
                      "(it is \"{}\")", name_of(config.experts.gemm));
  const ModelShape& s = store.shape_;
  TensorSource source(config, s);
  const std::size_t H = s.hidden, F = s.ffn;
  for (int l = 0; l < s.layers; ++l) {
    LayerWeights lw;
    lw.gate.resize(std::size_t(s.experts) * H);
    lw.norm.resize(H);
    source.gate(l, lw.gate.data());
    source.norm(l, lw.norm.data());
    store.layers_.push_back(std::move(lw));
    for (int e : placement.experts_on(l, rank)) {
      std::vector<float> w13(2 * F * H), w2(H * F);
      source.up(l, e, 1, w13.data());
      source.up(l, e, 3, w13.data() + F * H);
      source.down(l, e, w2.data());
      const int shards = placement.shards(l, e), shard = placement.shard_on(l, e, rank);
      if (shards > 1) {  // keep this rank's shard only
        std::vector<float> own13(2 * F * H / shards), own2(H * F / shards);
        kernels::shard_expert_weights(w13.data(), w2.data(), H, F, std::size_t(shard), std::size_t(shards),
                                      own13.data(), own2.data());
        w13 = std::move(own13), w2 = std::move(own2);
      }
      store.slots_.emplace(std::pair{l, e}, store.make_slot(std::move(w13), std::move(w2), shard, shards));
    }
  }
  return store;
}

ExpertStore::Slot ExpertStore::make_slot(std::vector<float> w13, std::vector<float> w2, int shard,
                                         int shards) const {
  MOED_CHECK(shards >= 1 && shard >= 0 && shard < shards && ffn_chunks_ % shards == 0,
             "shard {} of {} with {} canonical chunks", shard, shards, ffn_chunks_);
  Slot slot;
  slot.shard = shard;
  slot.shards = shards;
  if (!packed_) {
    slot.w13 = std::move(w13);
    slot.w2 = std::move(w2);
    return slot;
  }
  const std::size_t H = std::size_t(shape_.hidden), F = std::size_t(shape_.ffn) / std::size_t(shards);
  slot.w13_packed = kernels::PackedWeights(w13.data(), 2 * F, H);
  slot.w2_packed = kernels::PackedWeights(w2.data(), H, F);
  return slot;
}

const ExpertStore::Slot* ExpertStore::find(int layer, int expert) const {
  auto it = slots_.find({layer, expert});
  return it == slots_.end() ? nullptr : &it->second;
}

bool ExpertStore::holds(int layer, int expert) const { return find(layer, expert) != nullptr; }

std::pair<int, int> ExpertStore::shard_of(int layer, int expert) const {
  const Slot* slot = find(layer, expert);
  MOED_CHECK(slot, "layer {} expert {} is not held by this rank", layer, expert);
  return {slot->shard, slot->shards};
}

kernels::ExpertView ExpertStore::expert(int layer, int expert) const {
  const Slot* slot = find(layer, expert);
  MOED_CHECK(slot, "layer {} expert {} is not held by this rank", layer, expert);
  const std::size_t H = std::size_t(shape_.hidden), S = std::size_t(slot->shards);
  const std::size_t F = std::size_t(shape_.ffn) / S, chunks = std::size_t(ffn_chunks_) / S;
  if (packed_) return {&slot->w13_packed, &slot->w2_packed, nullptr, nullptr, H, F, chunks};
  return {nullptr, nullptr, slot->w13.data(), slot->w2.data(), H, F, chunks};
}

std::size_t ExpertStore::expert_bytes() const {
  std::size_t bytes = 0;
  for (const auto& [key, slot] : slots_) bytes += slot_floats(slot.shards) * sizeof(float);
  return bytes;
}

int ExpertStore::slots() const { return int(slots_.size()); }

void ExpertStore::copy_slot(int layer, int expert, float* out) const {
  const Slot* slot = find(layer, expert);
  MOED_CHECK(slot, "layer {} expert {} is not held by this rank", layer, expert);
  const std::size_t up = 2 * std::size_t(shape_.ffn) / std::size_t(slot->shards) * std::size_t(shape_.hidden);
  if (packed_) {
    slot->w13_packed.unpack(out);
    slot->w2_packed.unpack(out + up);
    return;
  }
  std::copy(slot->w13.begin(), slot->w13.end(), out);
  std::copy(slot->w2.begin(), slot->w2.end(), out + up);
}

void ExpertStore::add_slot(int layer, int expert, const float* weights, int shard, int shards) {
  MOED_CHECK(!holds(layer, expert), "layer {} expert {} is already held", layer, expert);
  const std::size_t up = 2 * std::size_t(shape_.ffn) / std::size_t(shards) * std::size_t(shape_.hidden);
  slots_.emplace(std::pair{layer, expert},
                 make_slot(std::vector<float>(weights, weights + up),
                           std::vector<float>(weights + up, weights + slot_floats(shards)), shard, shards));
}

void ExpertStore::drop_slot(int layer, int expert) {
  MOED_CHECK(slots_.erase({layer, expert}) == 1, "layer {} expert {} is not held", layer, expert);
}

}  // namespace moed::runtime
