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
// Layers are MoE indices here; names use the model's own layer numbers.
class TensorSource {
 public:
  TensorSource(const Config& c, const ModelShape& shape)
      : shape_(shape),
        names_(shape.spec.family),
        dtype_(*weights::parse_dtype(c.model.dtype)),
        check_finite_(c.model.check_finite) {
    if (c.model.weights.empty()) {
      synthetic_.emplace(shape, std::uint64_t(c.model.seed), dtype_);
      synthetic_where_ = fmt::format("synthetic weights (seed {})", c.model.seed);
    } else {
      checkpoint_ = std::make_unique<weights::Checkpoint>(c.model.weights);
    }
  }

  void gate(int l, float* out) const {
    const int L = at(l);
    fetch(names_.gate(L), gate_shape(shape_), out, [&] { synthetic_->gate(L, out); });
  }
  void norm(int l, float* out) const {
    const int L = at(l);
    fetch(names_.norm(L), norm_shape(shape_), out, [&] { synthetic_->norm(L, out); });
  }
  void gate_bias(int l, float* out) const {
    const int L = at(l);
    fetch(names_.gate_bias(L), {shape_.experts}, out, [&] { synthetic_->gate_bias(L, out); });
  }
  void selection_bias(int l, float* out) const {
    const int L = at(l);
    fetch(names_.selection_bias(L), {shape_.experts}, out, [&] { synthetic_->selection_bias(L, out); });
  }
  void shared_gate(int l, float* out) const {
    const int L = at(l);
    fetch(names_.shared_gate(L), {1, shape_.hidden}, out, [&] { synthetic_->shared_gate(L, out); });
  }

  // A routed expert's tensors in moed's layout (W1 above W3, gate and up split).
  ExpertTensors expert(int l, int e) const {
    const std::size_t H = std::size_t(shape_.hidden), F = std::size_t(shape_.ffn);
    const int L = at(l);
    ExpertTensors t;
    t.w13.resize(2 * F * H);
    t.w2.resize(H * F);
    if (shape_.spec.family == Family::gpt_oss) {
      fused_expert(L, e, t);
      return t;
    }
    const std::vector<std::int64_t> up = up_shape(shape_), down = down_shape(shape_);
    fetch(names_.expert(L, e, ExpertPart::gate), up, t.w13.data(), [&] { synthetic_->up(L, e, 1, t.w13.data()); });
    fetch(names_.expert(L, e, ExpertPart::up), up, t.w13.data() + F * H,
          [&] { synthetic_->up(L, e, 3, t.w13.data() + F * H); });
    fetch(names_.expert(L, e, ExpertPart::down), down, t.w2.data(), [&] { synthetic_->down(L, e, t.w2.data()); });
    return t;
  }

  // Dense model layer L's norm and FFN (by its model layer number).
  void dense_norm(int L, float* out) const {
    fetch(names_.norm(L), {shape_.hidden}, out, [&] { synthetic_->norm(L, out); });
  }
  ExpertTensors dense(int L) const {
    return whole_ffn(shape_.spec.dense_ffn, [&](ExpertPart p) { return names_.dense(L, p); },
                     [&](ExpertPart p, float* out) { synthetic_->dense(L, p, out); });
  }
  ExpertTensors shared(int l) const {
    const int L = at(l);
    return whole_ffn(shape_.spec.shared_ffn, [&](ExpertPart p) { return names_.shared(L, p); },
                     [&](ExpertPart p, float* out) { synthetic_->shared(L, p, out); });
  }

 private:
  int at(int l) const { return shape_.spec.model_layer(l); }

  // gpt-oss's fused tensors, one expert's entry of each: gate_up_proj
  // [E, H, 2F] (gate and up interleaved along 2F), gate_up_proj_bias [E, 2F],
  // down_proj [E, F, H], down_proj_bias [E, H]; split and transposed into
  // moed's W1|W3 [2F, H] and W2 [H, F].
  void fused_expert(int L, int e, ExpertTensors& t) const {
    const std::int64_t E = shape_.experts, H = shape_.hidden, F = shape_.ffn;
    const std::size_t h = std::size_t(H), f = std::size_t(F);
    t.b13.resize(2 * f);
    t.b2.resize(h);
    if (synthetic_) {
      synthetic_->up(L, e, 1, t.w13.data());
      synthetic_->up(L, e, 3, t.w13.data() + f * h);
      synthetic_->down(L, e, t.w2.data());
      synthetic_->expert_bias(L, e, 1, t.b13.data());
      synthetic_->expert_bias(L, e, 3, t.b13.data() + f);
      synthetic_->expert_bias(L, e, 2, t.b2.data());
      if (check_finite_)
        for (auto* v : {&t.w13, &t.w2, &t.b13, &t.b2})
          weights::check_finite(synthetic_where_, fmt::format("{} expert {}", names_.fused(L, "*"), e),
                                {std::int64_t(v->size())}, v->data());
      return;
    }
    std::vector<float> gate_up(2 * f * h), down(f * h), bias(2 * f);
    slice(names_.fused(L, "gate_up_proj"), {E, H, 2 * F}, e, gate_up.data());
    slice(names_.fused(L, "gate_up_proj_bias"), {E, 2 * F}, e, bias.data());
    slice(names_.fused(L, "down_proj"), {E, F, H}, e, down.data());
    slice(names_.fused(L, "down_proj_bias"), {E, H}, e, t.b2.data());
    for (std::size_t j = 0; j < f; ++j) {
      for (std::size_t i = 0; i < h; ++i) {
        t.w13[j * h + i] = gate_up[i * 2 * f + 2 * j];
        t.w13[(f + j) * h + i] = gate_up[i * 2 * f + 2 * j + 1];
      }
      t.b13[j] = bias[2 * j];
      t.b13[f + j] = bias[2 * j + 1];
    }
    for (std::size_t i = 0; i < h; ++i)
      for (std::size_t j = 0; j < f; ++j) t.w2[i * f + j] = down[j * h + i];
  }

  // A SwiGLU FFN every rank holds whole, F wide: its gate, up and down
  // tensors by `name(part)`, or made by `make(part, out)`.
  template <class Name, class Make>
  ExpertTensors whole_ffn(std::int64_t F, Name&& name, Make&& make) const {
    const std::int64_t H = shape_.hidden;
    ExpertTensors t;
    t.w13.resize(std::size_t(2 * F * H));
    t.w2.resize(std::size_t(H * F));
    float* up = t.w13.data() + F * H;
    fetch(name(ExpertPart::gate), {F, H}, t.w13.data(), [&] { make(ExpertPart::gate, t.w13.data()); });
    fetch(name(ExpertPart::up), {F, H}, up, [&] { make(ExpertPart::up, up); });
    fetch(name(ExpertPart::down), {H, F}, t.w2.data(), [&] { make(ExpertPart::down, t.w2.data()); });
    return t;
  }

  // Entry e of a fused [E, ...] tensor.
  void slice(const std::string& name, const std::vector<std::int64_t>& dims, int e, float* out) const {
    checkpoint_->read_f32(name, dtype_, dims, out, e, 1);
    if (check_finite_) {
      std::vector<std::int64_t> entry(dims.begin() + 1, dims.end());
      weights::check_finite(checkpoint_->file_of(name), fmt::format("{}[{}]", name, e), entry, out);
    }
  }

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
  TensorNames names_;
  weights::DType dtype_;
  bool check_finite_;
  std::optional<SyntheticModel> synthetic_;
  std::string synthetic_where_;
  std::unique_ptr<weights::Checkpoint> checkpoint_;
};

// Rows [a, a + F/S) of W1 and of W3 and columns of W2 (and of b1, b3): a
// shard's own; b2 stays whole (only shard 0's view adds it).
ExpertTensors shard_of_tensors(ExpertTensors t, std::size_t H, std::size_t F, int shard, int shards) {
  if (shards == 1) return t;
  const std::size_t S = std::size_t(shards), width = F / S, first = std::size_t(shard) * width;
  ExpertTensors own;
  own.w13.resize(2 * F * H / S);
  own.w2.resize(H * F / S);
  kernels::shard_expert_weights(t.w13.data(), t.w2.data(), H, F, std::size_t(shard), S, own.w13.data(),
                                own.w2.data());
  if (!t.b13.empty()) {
    own.b13.assign(t.b13.begin() + std::ptrdiff_t(first), t.b13.begin() + std::ptrdiff_t(first + width));
    own.b13.insert(own.b13.end(), t.b13.begin() + std::ptrdiff_t(F + first),
                   t.b13.begin() + std::ptrdiff_t(F + first + width));
    own.b2 = std::move(t.b2);
  }
  return own;
}

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
  const ModelSpec& spec = s.spec;
  TensorSource source(config, s);
  const std::size_t H = s.hidden, F = s.ffn, E = std::size_t(s.experts);
  for (int l = 0; l < s.layers; ++l) {
    LayerWeights lw;
    lw.gate.resize(E * H);
    lw.norm.resize(H);
    source.gate(l, lw.gate.data());
    source.norm(l, lw.norm.data());
    if (spec.router.gate_bias) source.gate_bias(l, (lw.gate_bias = std::vector<float>(E)).data());
    if (spec.router.selection_bias) source.selection_bias(l, (lw.selection_bias = std::vector<float>(E)).data());
    if (spec.shared_gated) source.shared_gate(l, (lw.shared_gate = std::vector<float>(H)).data());
    store.layers_.push_back(std::move(lw));
    if (spec.shared_ffn > 0) store.shared_.push_back(store.make_slot(source.shared(l), std::size_t(spec.shared_ffn), 0, 1));
    for (int e : placement.experts_on(l, rank)) {
      const int shards = placement.shards(l, e), shard = placement.shard_on(l, e, rank);
      store.slots_.emplace(std::pair{l, e}, store.make_slot(shard_of_tensors(source.expert(l, e), H, F, shard, shards),
                                                            F, shard, shards));
    }
  }
  if (config.model.serve_dense)
    for (int L : spec.dense_layers()) {
      DenseLayer d{L, std::vector<float>(H), {}};
      source.dense_norm(L, d.norm.data());
      d.ffn = store.make_slot(source.dense(L), std::size_t(spec.dense_ffn), 0, 1);
      store.dense_.push_back(std::move(d));
    }
  return store;
}

ExpertStore::Slot ExpertStore::make_slot(ExpertTensors t, std::size_t ffn, int shard, int shards) const {
  MOED_CHECK(shards >= 1 && shard >= 0 && shard < shards && ffn_chunks_ % shards == 0,
             "shard {} of {} with {} canonical chunks", shard, shards, ffn_chunks_);
  Slot slot;
  slot.shard = shard;
  slot.shards = shards;
  slot.ffn = ffn;
  slot.b13 = std::move(t.b13);
  slot.b2 = std::move(t.b2);
  if (!packed_) {
    slot.w13 = std::move(t.w13);
    slot.w2 = std::move(t.w2);
    return slot;
  }
  const std::size_t H = std::size_t(shape_.hidden), F = ffn / std::size_t(shards);
  slot.w13_packed = kernels::PackedWeights(t.w13.data(), 2 * F, H);
  slot.w2_packed = kernels::PackedWeights(t.w2.data(), H, F);
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

kernels::ExpertView ExpertStore::view_of(const Slot& slot, std::size_t chunks) const {
  kernels::ExpertView v;
  v.hidden = std::size_t(shape_.hidden);
  v.ffn = slot.ffn / std::size_t(slot.shards);
  v.chunks = chunks;
  if (packed_) {
    v.w13_packed = &slot.w13_packed;
    v.w2_packed = &slot.w2_packed;
  } else {
    v.w13 = slot.w13.data();
    v.w2 = slot.w2.data();
  }
  if (!slot.b13.empty()) {
    v.b13 = slot.b13.data();
    v.b2 = slot.shard == 0 ? slot.b2.data() : nullptr;  // added once, with the expert's first chunk
  }
  const ExpertSpec& x = shape_.spec.expert;
  v.activation = {x.activation == Activation::clamped_swiglu, float(x.alpha), float(x.limit)};
  return v;
}

kernels::ExpertView ExpertStore::expert(int layer, int expert) const {
  const Slot* slot = find(layer, expert);
  MOED_CHECK(slot, "layer {} expert {} is not held by this rank", layer, expert);
  return view_of(*slot, std::size_t(ffn_chunks_) / std::size_t(slot->shards));
}

bool ExpertStore::has_shared() const { return !shared_.empty(); }

kernels::ExpertView ExpertStore::dense_ffn(int d) const {
  MOED_CHECK(d >= 0 && std::size_t(d) < dense_.size(), "dense layer {} of {} served", d, dense_.size());
  return view_of(dense_[std::size_t(d)].ffn, 1);
}

kernels::ExpertView ExpertStore::shared_expert(int layer) const {
  MOED_CHECK(layer >= 0 && std::size_t(layer) < shared_.size(), "layer {}: no shared expert ({} held)", layer,
             shared_.size());
  return view_of(shared_[std::size_t(layer)], 1);
}

std::size_t ExpertStore::expert_bytes() const {
  std::size_t bytes = 0;
  for (const auto& [key, slot] : slots_) bytes += slot_floats(slot.shards) * sizeof(float);
  return bytes;
}

std::size_t ExpertStore::shared_bytes() const {
  return (shared_.size() * std::size_t(shape_.spec.shared_ffn) + dense_.size() * std::size_t(shape_.spec.dense_ffn)) *
         3 * std::size_t(shape_.hidden) * sizeof(float);
}

int ExpertStore::slots() const { return int(slots_.size()); }

void ExpertStore::copy_slot(int layer, int expert, float* out) const {
  const Slot* slot = find(layer, expert);
  MOED_CHECK(slot, "layer {} expert {} is not held by this rank", layer, expert);
  const std::size_t H = std::size_t(shape_.hidden), F = std::size_t(shape_.ffn) / std::size_t(slot->shards);
  if (packed_) {
    slot->w13_packed.unpack(out);
    slot->w2_packed.unpack(out + 2 * F * H);
  } else {
    std::copy(slot->w13.begin(), slot->w13.end(), out);
    std::copy(slot->w2.begin(), slot->w2.end(), out + 2 * F * H);
  }
  if (!biased()) return;
  std::copy(slot->b13.begin(), slot->b13.end(), out + 3 * F * H);
  std::copy(slot->b2.begin(), slot->b2.end(), out + 3 * F * H + 2 * F);
}

void ExpertStore::add_slot(int layer, int expert, const float* weights, int shard, int shards) {
  MOED_CHECK(!holds(layer, expert), "layer {} expert {} is already held", layer, expert);
  const std::size_t H = std::size_t(shape_.hidden), F = std::size_t(shape_.ffn) / std::size_t(shards);
  ExpertTensors t;
  t.w13.assign(weights, weights + 2 * F * H);
  t.w2.assign(weights + 2 * F * H, weights + 3 * F * H);
  if (biased()) {
    t.b13.assign(weights + 3 * F * H, weights + 3 * F * H + 2 * F);
    t.b2.assign(weights + 3 * F * H + 2 * F, weights + 3 * F * H + 2 * F + H);
  }
  slots_.emplace(std::pair{layer, expert}, make_slot(std::move(t), std::size_t(shape_.ffn), shard, shards));
}

void ExpertStore::drop_slot(int layer, int expert) {
  MOED_CHECK(slots_.erase({layer, expert}) == 1, "layer {} expert {} is not held", layer, expert);
}

}  // namespace moed::runtime
