#include "runtime/weights/expert_store.h"

#include <fmt/format.h>
#include <malloc.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <optional>

#include "common/error.h"
#include "kernels/cpu/amx_gemm.h"
#include "kernels/cpu/int8_dot_gemm.h"
#include "runtime/weights/finite_check.h"
#include "runtime/weights/safetensors.h"
#include "runtime/weights/synthetic_model.h"

namespace moed::runtime {

namespace {

using kernels::EncodedMatrix;
using kernels::WeightDtype;

// Where tensors come from: a checkpoint on disk or the synthetic model; each
// checked for NaN and inf as it arrives when [model].check_finite says so.
// Layers are MoE indices here; names use the model's own layer numbers.
// Expert weights come in the format held (`held`): a float checkpoint's
// (or the synthetic model's) values encoded at load, or an fp8 or mxfp4
// checkpoint's codes as they are (or their values, for f32).
class TensorSource {
 public:
  TensorSource(const Config& c, const ModelShape& shape, WeightDtype held)
      : shape_(shape),
        names_(shape.spec.family),
        dtype_(*weights::parse_dtype(c.model.dtype)),
        held_(held),
        check_finite_(c.model.check_finite) {
    if (c.model.weights.empty()) {
      synthetic_.emplace(shape, std::uint64_t(c.model.seed), dtype_);
      synthetic_where_ = fmt::format("synthetic weights (seed {})", c.model.seed);
      shipped_ = held;  // the synthetic model ships in any format
    } else {
      checkpoint_ = std::make_unique<weights::Checkpoint>(c.model.weights);
      shipped_ = shipped_format();
    }
  }

  // The experts' format in the checkpoint.
  WeightDtype shipped() const { return shipped_; }

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
    const std::string name = names_.selection_bias(L);
    fetch(name, {shape_.experts}, out, [&] { synthetic_->selection_bias(L, out); }, selection_bias_dtype(name));
  }
  void shared_gate(int l, float* out) const {
    const int L = at(l);
    fetch(names_.shared_gate(L), {1, shape_.hidden}, out, [&] { synthetic_->shared_gate(L, out); });
  }

  // A routed expert's tensors in moed's layout (W1 above W3, gate and up split).
  ExpertTensors expert(int l, int e) const {
    const int L = at(l);
    if (shape_.spec.family == Family::gpt_oss) return fused_expert(L, e);
    return whole_ffn(shape_.ffn, [&](ExpertPart p) { return names_.expert(L, e, p); },
                     [&](ExpertPart p, float* out) {
                       if (p == ExpertPart::down)
                         synthetic_->down(L, e, out);
                       else
                         synthetic_->up(L, e, p == ExpertPart::gate ? 1 : 3, out);
                     });
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

  // What the checkpoint holds its experts in, from its first expert tensor.
  WeightDtype shipped_format() const {
    const int L = at(0);
    if (shape_.spec.family == Family::gpt_oss)
      return checkpoint_->contains(names_.fused(L, "gate_up_proj_blocks")) ? WeightDtype::mxfp4
                                                                              : float_format();
    const std::optional<std::string> dtype = checkpoint_->dtype_of(names_.expert(L, 0, ExpertPart::gate));
    return dtype == "F8_E4M3" ? WeightDtype::fp8 : float_format();
  }
  WeightDtype float_format() const { return dtype_ == weights::DType::BF16 ? WeightDtype::bf16 : WeightDtype::f32; }

  // A checkpoint's experts become the format held: values encode (f32,
  // bf16 and int8 from floats), fp8 and mxfp4 stay as shipped or widen to f32.
  void check_convertible(const std::string& tensor) const {
    if (synthetic_ || held_ == shipped_ || held_ == WeightDtype::f32) return;
    const bool from_floats = shipped_ == WeightDtype::f32 || shipped_ == WeightDtype::bf16;
    if (from_floats && held_ != WeightDtype::fp8 && held_ != WeightDtype::mxfp4) return;
    MOED_THROW(Input,
               "[experts].dtype = {}: {} holds tensor '{}' in {}, which cannot become {} (fp8 and mxfp4 load only "
               "from checkpoints that ship them; a quantized checkpoint serves as shipped or widened to f32; int8 "
               "quantizes f32 or bf16 weights at load)",
               kernels::to_string(held_), checkpoint_->file_of(tensor), tensor, kernels::to_string(shipped_),
               kernels::to_string(held_));
  }

  // Float values [n, k] of `name` (or made by `make`), encoded in the format held.
  template <class Make>
  EncodedMatrix encoded_floats(const std::string& name, std::int64_t n, std::int64_t k, Make&& make) const {
    if (held_ == WeightDtype::f32) {  // the floats are the codes: read them in place
      EncodedMatrix m{held_, std::size_t(n), std::size_t(k), {}, {}};
      m.codes.resize(EncodedMatrix::code_bytes(held_, m.n, m.k));
      auto* out = reinterpret_cast<float*>(m.codes.data());  // operator new aligns them for floats
      fetch(name, {n, k}, out, [&] { make(out); });
      return m;
    }
    std::vector<float> values(std::size_t(n * k));
    fetch(name, {n, k}, values.data(), [&] { make(values.data()); });
    return kernels::encode(held_, values.data(), std::size_t(n), std::size_t(k));
  }

  // An fp8 checkpoint's [n, k] weight and its weight_scale_inv, as shipped.
  EncodedMatrix fp8_tensor(const std::string& name, std::int64_t n, std::int64_t k) const {
    const std::int64_t tile = kernels::kFp8Tile;
    EncodedMatrix m{WeightDtype::fp8, std::size_t(n), std::size_t(k), {}, {}};
    m.codes.resize(EncodedMatrix::code_bytes(m.dtype, m.n, m.k));
    m.scales.resize(EncodedMatrix::scale_bytes(m.dtype, m.n, m.k));
    checkpoint_->read_raw(name, "F8_E4M3", {n, k}, reinterpret_cast<std::byte*>(m.codes.data()));
    const std::string scale = scale_name(name);
    checkpoint_->read_raw(scale, "F32", {(n + tile - 1) / tile, (k + tile - 1) / tile},
                          reinterpret_cast<std::byte*>(m.scales.data()));
    return checked(std::move(m), name);
  }
  // "....weight" -> "....weight_scale_inv", as DeepSeek names a weight's scales.
  static std::string scale_name(const std::string& weight) { return weight + "_scale_inv"; }

  // A quantized matrix with a NaN code or scale is refused, naming it.
  EncodedMatrix checked(EncodedMatrix m, const std::string& name) const {
    const std::string nan = m.find_nan();
    if (!nan.empty())
      MOED_THROW(Input, "{}: tensor '{}' ({}): {}", checkpoint_->file_of(name), name, kernels::to_string(m.dtype),
                 nan);
    if (held_ != m.dtype) {  // widened to f32 (check_convertible allowed it)
      const std::vector<float> values = m.values();
      return kernels::encode(held_, values.data(), m.n, m.k);
    }
    return m;
  }

  // A SwiGLU FFN F wide: its gate, up and down tensors by `name(part)`, or
  // made by `make(part, out)`.
  template <class Name, class Make>
  ExpertTensors whole_ffn(std::int64_t F, Name&& name, Make&& make) const {
    const std::int64_t H = shape_.hidden;
    check_convertible(name(ExpertPart::gate));
    auto part = [&](ExpertPart p, std::int64_t n, std::int64_t k) {
      if (shipped_ == WeightDtype::fp8 && checkpoint_) return fp8_tensor(name(p), n, k);
      return encoded_floats(name(p), n, k, [&](float* out) { make(p, out); });
    };
    ExpertTensors t;
    EncodedMatrix w1 = part(ExpertPart::gate, F, H), w3 = part(ExpertPart::up, F, H);  // in this order: errors name the first
    t.w13 = kernels::stack(w1, w3);
    t.w2 = part(ExpertPart::down, H, F);
    return t;
  }

  // gpt-oss's fused tensors, one expert's entry of each: gate_up_proj
  // [E, H, 2F] (gate and up interleaved along 2F), gate_up_proj_bias [E, 2F],
  // down_proj [E, F, H], down_proj_bias [E, H]; split and transposed into
  // moed's W1|W3 [2F, H] and W2 [H, F]. Or, in mxfp4, gate_up_proj_blocks
  // [E, 2F, H/32, 16] and _scales [E, 2F, H/32] (rows interleaved likewise),
  // down_proj_blocks [E, H, F/32, 16] and _scales [E, H, F/32].
  ExpertTensors fused_expert(int L, int e) const {
    const std::int64_t E = shape_.experts, H = shape_.hidden, F = shape_.ffn;
    const std::size_t h = std::size_t(H), f = std::size_t(F);
    ExpertTensors t;
    t.b13.resize(2 * f);
    t.b2.resize(h);
    std::vector<float> w13(2 * f * h), w2(h * f);
    if (synthetic_) {
      synthetic_->up(L, e, 1, w13.data());
      synthetic_->up(L, e, 3, w13.data() + f * h);
      synthetic_->down(L, e, w2.data());
      synthetic_->expert_bias(L, e, 1, t.b13.data());
      synthetic_->expert_bias(L, e, 3, t.b13.data() + f);
      synthetic_->expert_bias(L, e, 2, t.b2.data());
      if (check_finite_)
        for (auto* v : {&w13, &w2, &t.b13, &t.b2})
          weights::check_finite(synthetic_where_, fmt::format("{} expert {}", names_.fused(L, "*"), e),
                                {std::int64_t(v->size())}, v->data());
      // W1 and W3 encoded apart, as a checkpoint ships them.
      t.w13 = kernels::stack(kernels::encode(held_, w13.data(), f, h), kernels::encode(held_, w13.data() + f * h, f, h));
      t.w2 = kernels::encode(held_, w2.data(), h, f);
      return t;
    }
    std::vector<float> bias(2 * f);
    slice(names_.fused(L, "gate_up_proj_bias"), {E, 2 * F}, e, bias.data());
    slice(names_.fused(L, "down_proj_bias"), {E, H}, e, t.b2.data());
    for (std::size_t j = 0; j < f; ++j) {
      t.b13[j] = bias[2 * j];
      t.b13[f + j] = bias[2 * j + 1];
    }
    if (shipped_ == WeightDtype::mxfp4) {
      check_convertible(names_.fused(L, "gate_up_proj_blocks"));
      const EncodedMatrix gate_up = mxfp4_entry(names_.fused(L, "gate_up_proj"), 2 * F, H, e);
      t.w13 = checked(gate_then_up(gate_up), names_.fused(L, "gate_up_proj_blocks"));
      t.w2 = checked(mxfp4_entry(names_.fused(L, "down_proj"), H, F, e), names_.fused(L, "down_proj_blocks"));
      return t;
    }
    check_convertible(names_.fused(L, "gate_up_proj"));
    std::vector<float> gate_up(2 * f * h), down(f * h);
    slice(names_.fused(L, "gate_up_proj"), {E, H, 2 * F}, e, gate_up.data());
    slice(names_.fused(L, "down_proj"), {E, F, H}, e, down.data());
    for (std::size_t j = 0; j < f; ++j)
      for (std::size_t i = 0; i < h; ++i) {
        w13[j * h + i] = gate_up[i * 2 * f + 2 * j];
        w13[(f + j) * h + i] = gate_up[i * 2 * f + 2 * j + 1];
      }
    for (std::size_t i = 0; i < h; ++i)
      for (std::size_t j = 0; j < f; ++j) w2[i * f + j] = down[j * h + i];
    t.w13 = kernels::stack(kernels::encode(held_, w13.data(), f, h), kernels::encode(held_, w13.data() + f * h, f, h));
    t.w2 = kernels::encode(held_, w2.data(), h, f);
    return t;
  }

  // gpt-oss's rows 2j (gate j) and 2j + 1 (up j) apart: W1 above W3 (mxfp4: a row's codes and scales).
  static EncodedMatrix gate_then_up(const EncodedMatrix& interleaved) {
    EncodedMatrix out{interleaved.dtype, interleaved.n, interleaved.k, {}, {}};
    const std::size_t f = interleaved.n / 2, code_row = interleaved.codes.size() / interleaved.n,
                      scale_row = interleaved.scales.size() / interleaved.n;
    out.codes.reserve(interleaved.codes.size());
    out.scales.reserve(interleaved.scales.size());
    for (std::size_t half : {0, 1})
      for (std::size_t j = 0; j < f; ++j) {
        const std::size_t row = 2 * j + half;
        out.codes.insert(out.codes.end(), interleaved.codes.begin() + std::ptrdiff_t(row * code_row),
                         interleaved.codes.begin() + std::ptrdiff_t((row + 1) * code_row));
        out.scales.insert(out.scales.end(), interleaved.scales.begin() + std::ptrdiff_t(row * scale_row),
                          interleaved.scales.begin() + std::ptrdiff_t((row + 1) * scale_row));
      }
    return out;
  }

  // Entry e of gpt-oss's `<prefix>_blocks` [E, n, k/32, 16] and `<prefix>_scales` [E, n, k/32].
  EncodedMatrix mxfp4_entry(const std::string& prefix, std::int64_t n, std::int64_t k, int e) const {
    const std::int64_t E = shape_.experts, blocks = k / kernels::kMxBlock;
    EncodedMatrix m{WeightDtype::mxfp4, std::size_t(n), std::size_t(k), {}, {}};
    m.codes.resize(EncodedMatrix::code_bytes(m.dtype, m.n, m.k));
    m.scales.resize(EncodedMatrix::scale_bytes(m.dtype, m.n, m.k));
    checkpoint_->read_raw(prefix + "_blocks", "U8", {E, n, blocks, 16}, reinterpret_cast<std::byte*>(m.codes.data()),
                          e, 1);
    checkpoint_->read_raw(prefix + "_scales", "U8", {E, n, blocks}, reinterpret_cast<std::byte*>(m.scales.data()), e,
                          1);
    return m;
  }

  // Entry e of a fused [E, ...] tensor.
  void slice(const std::string& name, const std::vector<std::int64_t>& dims, int e, float* out) const {
    checkpoint_->read_f32(name, dtype_, dims, out, e, 1);
    if (check_finite_) {
      std::vector<std::int64_t> entry(dims.begin() + 1, dims.end());
      weights::check_finite(checkpoint_->file_of(name), fmt::format("{}[{}]", name, e), entry, out);
    }
  }

  // DeepSeek's BF16 and fp8 checkpoints keep e_score_correction_bias in F32:
  // read as it is (a widening would change nothing). Any other tensor in a
  // dtype but [model].dtype is refused, naming both.
  weights::DType selection_bias_dtype(const std::string& name) const {
    return checkpoint_ && checkpoint_->dtype_of(name) == "F32" ? weights::DType::F32 : dtype_;
  }

  template <class MakeSynthetic>
  void fetch(const std::string& name, const std::vector<std::int64_t>& dims, float* out, MakeSynthetic&& make,
             std::optional<weights::DType> dtype = std::nullopt) const {
    if (checkpoint_)
      checkpoint_->read_f32(name, dtype.value_or(dtype_), dims, out);
    else
      make();
    if (check_finite_)
      weights::check_finite(checkpoint_ ? checkpoint_->file_of(name) : synthetic_where_, name, dims, out);
  }

  ModelShape shape_;
  TensorNames names_;
  weights::DType dtype_;
  WeightDtype held_, shipped_ = WeightDtype::f32;
  bool check_finite_;
  std::optional<SyntheticModel> synthetic_;
  std::string synthetic_where_;
  std::unique_ptr<weights::Checkpoint> checkpoint_;
};

// Rows [a, a + F/S) of W1 and of W3 and columns of W2 (and of b1, b3): a
// shard's own; b2 stays whole (only shard 0's view adds it).
ExpertTensors shard_of_tensors(ExpertTensors t, std::size_t F, int shard, int shards) {
  if (shards == 1) return t;
  const std::size_t S = std::size_t(shards), width = F / S, first = std::size_t(shard) * width;
  ExpertTensors own;
  own.w13 = kernels::stack(kernels::rows_of(t.w13, first, first + width),
                           kernels::rows_of(t.w13, F + first, F + first + width));
  own.w2 = kernels::columns_of(t.w2, first, first + width);
  if (!t.b13.empty()) {
    own.b13.assign(t.b13.begin() + std::ptrdiff_t(first), t.b13.begin() + std::ptrdiff_t(first + width));
    own.b13.insert(own.b13.end(), t.b13.begin() + std::ptrdiff_t(F + first),
                   t.b13.begin() + std::ptrdiff_t(F + first + width));
    own.b2 = std::move(t.b2);
  }
  return own;
}

// The shapes a format can hold: fp8's scale tiles are 128 x 128 and W1 and
// W3 are stacked, so F (and a shard's F/S) must be a multiple of 128;
// mxfp4's blocks are 32 of a row, so H and F/S must be multiples of 32.
// `what` (an expert, or the splits reoptimize may make) cut into `shards`
// shards of F / shards columns each must keep the format's scale blocks whole.
void check_shard_width(WeightDtype held, std::size_t F, std::int64_t shards, const std::string& what) {
  const std::size_t width = F / std::size_t(shards),
                    grain = std::max(kernels::column_grain(held), kernels::row_grain(held));  // powers of 2
  if (width % grain != 0)
    MOED_THROW(Usage, "[experts].dtype = {}: {} into {} shards of {} columns, which cut its scale blocks (multiples "
                      "of {} needed); use fewer shards",
               kernels::to_string(held), what, shards, width, grain);
}

void check_shape_fits(WeightDtype held, std::int64_t H, std::int64_t F, const char* what) {
  const std::int64_t grain = held == WeightDtype::fp8 ? kernels::kFp8Tile : kernels::kMxBlock;
  if (held == WeightDtype::fp8 && F % grain != 0)
    MOED_THROW(Usage, "[experts].dtype = fp8 needs {} to be a multiple of 128 (its scale tiles are 128 x 128); it "
                      "is {}", what, F);
  if (held == WeightDtype::mxfp4 && (H % grain != 0 || F % grain != 0))
    MOED_THROW(Usage, "[experts].dtype = mxfp4 needs the hidden size and {} to be multiples of 32 (its scale "
                      "blocks); they are {} and {}", what, H, F);
}

}  // namespace

ExpertStore ExpertStore::load(const Config& config, const placement::Placement& placement, int rank) {
  ExpertStore store;
  store.shape_ = ModelShape::from(config.model);
  store.packed_ = config.experts.gemm == Gemm::fixed_order;
  store.ffn_chunks_ = int(config.experts.ffn_chunks);
  MOED_CHECK(kernels::parse_weight_dtype(experts_dtype(config), &store.dtype_), "[experts].dtype {}",
             experts_dtype(config));
  // OpenBLAS gives no promise that a shard's narrower GEMMs round as the
  // whole expert's columns do; the fixed-order GEMM does (expert_ffn.h).
  if (placement.any_sharded() && !store.packed_)
    MOED_THROW(Input, "the placement splits experts into shards, which needs [experts].gemm = \"fixed-order\" "
                      "(it is \"{}\")", name_of(config.experts.gemm));
  if (store.dtype_ != WeightDtype::f32 && !store.packed_)
    MOED_THROW(Usage, "[experts].dtype = {} needs [experts].gemm = \"fixed-order\" (OpenBLAS computes in f32 only)",
               kernels::to_string(store.dtype_));
  const ModelShape& s = store.shape_;
  const ModelSpec& spec = s.spec;
  check_shape_fits(store.dtype_, s.hidden, s.ffn, "[model].ffn");
  if (spec.shared_ffn > 0) check_shape_fits(store.dtype_, s.hidden, spec.shared_ffn, "the shared expert's F");
  if (config.model.serve_dense) check_shape_fits(store.dtype_, s.hidden, spec.dense_ffn, "the dense layers' F");
  // Splits that moectl reoptimize may make must keep whole scale blocks too.
  if (config.placement.shard_over_mean > 0)
    check_shard_width(store.dtype_, std::size_t(s.ffn), config.placement.shards,
                      "[placement].shard_over_mean splits experts");
  TensorSource source(config, s, store.dtype_);
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
      check_shard_width(store.dtype_, F, shards, fmt::format("layer {} expert {} is split", spec.model_layer(l), e));
      store.slots_.emplace(std::pair{l, e},
                           store.make_slot(shard_of_tensors(source.expert(l, e), F, shard, shards), F, shard, shards));
    }
  }
  if (config.model.serve_dense)
    for (int L : spec.dense_layers()) {
      DenseLayer d{L, std::vector<float>(H), {}};
      source.dense_norm(L, d.norm.data());
      d.ffn = store.make_slot(source.dense(L), std::size_t(spec.dense_ffn), 0, 1);
      store.dense_.push_back(std::move(d));
    }
  // Loading freed a slot's worth of buffers per expert, some between the
  // slots kept (glibc's heap once its mmap threshold has risen past them):
  // give those pages back, so that what the rank holds is what it serves with.
  malloc_trim(0);
  return store;
}

void ExpertStore::load_experts(const Config& config, const std::vector<std::pair<int, int>>& experts) {
  if (experts.empty()) return;
  TensorSource source(config, shape_, dtype_);
  for (const auto& [l, e] : experts)  // one held already was loaded by a try a later loss cut short
    if (!holds(l, e)) slots_.emplace(std::pair{l, e}, make_slot(source.expert(l, e), std::size_t(shape_.ffn), 0, 1));
  malloc_trim(0);
}

ExpertStore::Slot ExpertStore::make_slot(ExpertTensors t, std::size_t ffn, int shard, int shards) const {
  MOED_CHECK(t.w13.dtype == dtype_ && t.w2.dtype == dtype_, "a {} slot in a store of {}", kernels::to_string(t.w13.dtype),
             kernels::to_string(dtype_));
  if (dtype_ == WeightDtype::f32)  // f32 codes are the floats themselves (operator new aligns them for floats)
    return f32_slot(reinterpret_cast<const float*>(t.w13.codes.data()),
                    reinterpret_cast<const float*>(t.w2.codes.data()), std::move(t.b13), std::move(t.b2), ffn, shard,
                    shards);
  Slot slot = bare_slot(std::move(t.b13), std::move(t.b2), ffn, shard, shards);
  slot.w13_quant = kernels::QuantWeights(t.w13);
  slot.w2_quant = kernels::QuantWeights(t.w2);
  return slot;
}

namespace {
// Every slot any store makes in this process gets its own number (never 0),
// so that a cache of weights (a GPU executor's) never takes a slot made again
// at the same address for the one before it.
std::uint64_t next_slot_serial() {
  static std::atomic<std::uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}
}  // namespace

ExpertStore::Slot ExpertStore::bare_slot(std::vector<float> b13, std::vector<float> b2, std::size_t ffn, int shard,
                                         int shards) const {
  MOED_CHECK(shards >= 1 && shard >= 0 && shard < shards && ffn_chunks_ % shards == 0,
             "shard {} of {} with {} canonical chunks", shard, shards, ffn_chunks_);
  Slot slot;
  slot.serial = next_slot_serial();
  slot.shard = shard;
  slot.shards = shards;
  slot.ffn = ffn;
  slot.b13 = std::move(b13);
  slot.b2 = std::move(b2);
  return slot;
}

// Packed (or row-major) straight from the floats: no copy beside the slot,
// which a migration's peak would pay.
ExpertStore::Slot ExpertStore::f32_slot(const float* w13, const float* w2, std::vector<float> b13,
                                        std::vector<float> b2, std::size_t ffn, int shard, int shards) const {
  Slot slot = bare_slot(std::move(b13), std::move(b2), ffn, shard, shards);
  const std::size_t H = std::size_t(shape_.hidden), F = ffn / std::size_t(shards);
  if (!packed_) {
    slot.w13.assign(w13, w13 + 2 * F * H);
    slot.w2.assign(w2, w2 + H * F);
    return slot;
  }
  slot.w13_packed = kernels::PackedWeights(w13, 2 * F, H);
  slot.w2_packed = kernels::PackedWeights(w2, H, F);
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
  v.serial = slot.serial;
  v.hidden = std::size_t(shape_.hidden);
  v.ffn = slot.ffn / std::size_t(slot.shards);
  v.chunks = chunks;
  if (dtype_ != WeightDtype::f32) {
    v.w13_quant = &slot.w13_quant;
    v.w2_quant = &slot.w2_quant;
  } else if (packed_) {
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

namespace {
// Bytes of an FFN F wide in `dtype`: W1|W3 [2F, H] and W2 [H, F].
std::size_t ffn_bytes(WeightDtype dtype, std::size_t H, std::size_t F) {
  return EncodedMatrix::code_bytes(dtype, 2 * F, H) + EncodedMatrix::scale_bytes(dtype, 2 * F, H) +
         EncodedMatrix::code_bytes(dtype, H, F) + EncodedMatrix::scale_bytes(dtype, H, F);
}
}  // namespace

std::size_t ExpertStore::slot_bytes(int shards) const {
  const std::size_t H = std::size_t(shape_.hidden), F = std::size_t(shape_.ffn) / std::size_t(shards);
  return ffn_bytes(dtype_, H, F) + (biased() ? (2 * F + H) * sizeof(float) : 0);
}

std::size_t ExpertStore::expert_bytes() const {
  std::size_t bytes = 0;
  for (const auto& [key, slot] : slots_) bytes += slot_bytes(slot.shards);
  return bytes;
}

std::size_t ExpertStore::shared_bytes() const {
  const std::size_t H = std::size_t(shape_.hidden);
  return shared_.size() * ffn_bytes(dtype_, H, std::size_t(shape_.spec.shared_ffn)) +
         dense_.size() * ffn_bytes(dtype_, H, std::size_t(shape_.spec.dense_ffn));
}

int ExpertStore::slots() const { return int(slots_.size()); }

void ExpertStore::copy_slot(int layer, int expert, std::uint8_t* out) const {
  const Slot* slot = find(layer, expert);
  MOED_CHECK(slot, "layer {} expert {} is not held by this rank", layer, expert);
  const std::size_t H = std::size_t(shape_.hidden), F = slot->ffn / std::size_t(slot->shards);
  if (dtype_ != WeightDtype::f32) {  // the codes and scales back from the panels
    const EncodedMatrix w13 = slot->w13_quant.encoded();
    w13.to_bytes(out);
    slot->w2_quant.encoded().to_bytes(out + w13.bytes());
  } else if (packed_) {  // the floats straight into `out` (4-byte aligned: slots are whole floats)
    slot->w13_packed.unpack(reinterpret_cast<float*>(out));
    slot->w2_packed.unpack(reinterpret_cast<float*>(out) + 2 * F * H);
  } else {
    std::memcpy(out, slot->w13.data(), slot->w13.size() * sizeof(float));
    std::memcpy(out + slot->w13.size() * sizeof(float), slot->w2.data(), slot->w2.size() * sizeof(float));
  }
  if (!biased()) return;
  out += ffn_bytes(dtype_, H, F);
  std::memcpy(out, slot->b13.data(), slot->b13.size() * sizeof(float));
  std::memcpy(out + slot->b13.size() * sizeof(float), slot->b2.data(), slot->b2.size() * sizeof(float));
}

ExpertTensors ExpertStore::tensors_from_bytes(const std::uint8_t* bytes, std::size_t F) const {
  const std::size_t H = std::size_t(shape_.hidden);
  ExpertTensors t;
  if (biased()) {
    const std::uint8_t* biases = bytes + ffn_bytes(dtype_, H, F);
    t.b13.resize(2 * F);
    t.b2.resize(H);
    std::memcpy(t.b13.data(), biases, 2 * F * sizeof(float));
    std::memcpy(t.b2.data(), biases + 2 * F * sizeof(float), H * sizeof(float));
  }
  t.w13 = EncodedMatrix::from_bytes(dtype_, 2 * F, H, bytes);
  t.w2 = EncodedMatrix::from_bytes(dtype_, H, F, bytes + t.w13.bytes());
  return t;
}

ExpertTensors ExpertStore::tensors_of(const Slot& slot) const {
  const std::size_t H = std::size_t(shape_.hidden), F = slot.ffn / std::size_t(slot.shards);
  ExpertTensors t;
  t.b13 = slot.b13;
  t.b2 = slot.b2;
  if (dtype_ != WeightDtype::f32) {
    t.w13 = slot.w13_quant.encoded();
    t.w2 = slot.w2_quant.encoded();
    return t;
  }
  const auto f32_matrix = [](std::size_t n, std::size_t k) {
    return EncodedMatrix{WeightDtype::f32, n, k, std::vector<std::uint8_t>(n * k * sizeof(float)), {}};
  };
  t.w13 = f32_matrix(2 * F, H);
  t.w2 = f32_matrix(H, F);
  auto* w13 = reinterpret_cast<float*>(t.w13.codes.data());  // operator new aligns them for floats
  auto* w2 = reinterpret_cast<float*>(t.w2.codes.data());
  if (packed_) {
    slot.w13_packed.unpack(w13);
    slot.w2_packed.unpack(w2);
  } else {
    std::memcpy(w13, slot.w13.data(), slot.w13.size() * sizeof(float));
    std::memcpy(w2, slot.w2.data(), slot.w2.size() * sizeof(float));
  }
  return t;
}

void ExpertStore::copy_shard(int layer, int expert, int shard, int shards, std::uint8_t* out) const {
  MOED_CHECK(shard_of(layer, expert) == std::pair(0, 1), "layer {} expert {}: a shard is cut from a whole copy",
             layer, expert);
  MOED_CHECK(shards >= 2 && shard >= 0 && shard < shards && ffn_chunks_ % shards == 0,
             "shard {} of {} with {} canonical chunks", shard, shards, ffn_chunks_);
  const std::size_t F = std::size_t(shape_.ffn);
  const ExpertTensors own = shard_of_tensors(tensors_of(*find(layer, expert)), F, shard, shards);
  own.w13.to_bytes(out);
  own.w2.to_bytes(out + own.w13.bytes());
  if (!biased()) return;
  out += own.w13.bytes() + own.w2.bytes();
  std::memcpy(out, own.b13.data(), own.b13.size() * sizeof(float));
  std::memcpy(out + own.b13.size() * sizeof(float), own.b2.data(), own.b2.size() * sizeof(float));
}

void ExpertStore::add_slot(int layer, int expert, const std::uint8_t* bytes, int shard, int shards, bool replace) {
  MOED_CHECK(holds(layer, expert) == replace, "layer {} expert {} is {}held", layer, expert, replace ? "not " : "already ");
  const std::size_t H = std::size_t(shape_.hidden), F = std::size_t(shape_.ffn) / std::size_t(shards);
  if (dtype_ == WeightDtype::f32) {  // straight from the landed bytes: no third copy of the slot at the peak
    std::vector<float> b13, b2;
    if (biased()) {
      const auto* biases = reinterpret_cast<const float*>(bytes + ffn_bytes(dtype_, H, F));
      b13.assign(biases, biases + 2 * F);
      b2.assign(biases + 2 * F, biases + 2 * F + H);
    }
    const auto* w = reinterpret_cast<const float*>(bytes);
    slots_.insert_or_assign(std::pair{layer, expert}, f32_slot(w, w + 2 * F * H, std::move(b13), std::move(b2),
                                                               std::size_t(shape_.ffn), shard, shards));
    return;
  }
  slots_.insert_or_assign(std::pair{layer, expert},
                          make_slot(tensors_from_bytes(bytes, F), std::size_t(shape_.ffn), shard, shards));
}

void ExpertStore::drop_slot(int layer, int expert) {
  MOED_CHECK(slots_.erase({layer, expert}) == 1, "layer {} expert {} is not held", layer, expert);
}

kernels::CompactProducts local_products(const Config& c) {
  const bool compact = experts_dtype(c) != "f32" && c.experts.gemm == Gemm::fixed_order;
  const bool here = kernels::cpu_has_bf16_dot() && kernels::gemm_isa() == kernels::GemmIsa::avx512;
  if (c.experts.products == "int8") {
    if (!kernels::cpu_has_int8_dot() || kernels::gemm_isa() != kernels::GemmIsa::avx512)
      MOED_THROW(Usage, "[experts].products = int8: this CPU {}", kernels::cpu_has_int8_dot()
                     ? fmt::format("runs them only with the avx512 GEMM kernel, and [experts].isa = {}",
                                   name_of(c.experts.isa))
                     : std::string("lacks AVX-512 VNNI or VBMI (Zen 4 and Intel since Ice Lake have both)"));
    return kernels::CompactProducts::int8;
  }
  if (c.experts.products == "amx") {
    if (!kernels::cpu_has_amx() || kernels::gemm_isa() != kernels::GemmIsa::avx512)
      MOED_THROW(Usage, "[experts].products = amx: this CPU {}", kernels::cpu_has_amx()
                     ? fmt::format("runs them only with the avx512 GEMM kernel, and [experts].isa = {}",
                                   name_of(c.experts.isa))
                     : std::string("or its OS does not grant AMX-BF16 tiles, AVX-512 BF16 and VBMI (Intel since "
                                   "Sapphire Rapids has them)"));
    return kernels::CompactProducts::amx;
  }
  if (c.experts.products == "bf16") {
    if (!here)
      MOED_THROW(Usage, "[experts].products = bf16: this CPU {}", kernels::cpu_has_bf16_dot()
                     ? fmt::format("runs them only with the avx512 GEMM kernel, and [experts].isa = {}",
                                   name_of(c.experts.isa))
                     : std::string("lacks AVX-512 BF16 or VBMI (Zen 4 and Intel since Sapphire Rapids have both)"));
    return kernels::CompactProducts::bf16;
  }
  if (c.experts.products != "auto" || !compact || !here) return kernels::CompactProducts::f32;
  return kernels::cpu_has_amx() ? kernels::CompactProducts::amx : kernels::CompactProducts::bf16;
}

int products_ability(kernels::CompactProducts products) {
  return products == kernels::CompactProducts::amx ? 2 : products == kernels::CompactProducts::bf16 ? 1 : 0;
}

kernels::CompactProducts agreed_products(kernels::CompactProducts here, int least) {
  if (products_ability(here) <= least) return here;
  return least >= 1 ? kernels::CompactProducts::bf16 : kernels::CompactProducts::f32;
}

}  // namespace moed::runtime
