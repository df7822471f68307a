// Experts held in each [experts].dtype (f32, bf16, fp8, mxfp4, int8) on one
// core, at three expert shapes, against bounds measured in the same run:
//   memory     resident bytes of an expert slot (packed, padding included)
//              and of a rank holding --rank-slots of them;
//   migration  one slot copied out (QuantWeights::encoded + to_bytes; f32:
//              unpack) and installed again (from_bytes + packing), as
//              ExpertStore::copy_slot / add_slot do, and the bytes moved;
//   decode     expert_ffn at 1, 4 and 16 rows, cycling through a set of
//              distinct experts at least --llc-times the last-level cache
//              (every call reads its weights from DRAM), against the bound
//              weight bytes per call / the bandwidth this core gets summing a
//              buffer the size of that set;
//   prefill    expert_ffn at 256 rows against the best dense GEMM of the
//              same two shapes: OpenBLAS fp32 sgemm, and where oneDNN is
//              installed its bf16 and int8 matmuls (and those at decode);
//   accuracy   64 unit-variance rows: the dtype's output against fp32 on the
//              dtype's own values (bitwise equal with f32 products, by
//              design) and against the unquantized fp32 weights; and, on a
//              4-layer toy MoE, how many tokens' top-2 sets at the last
//              layer match the fp32 run.
// Compact dtypes multiply with --products (auto: bf16 where the CPU has it,
// every compact dtype once more with amx products where it has AMX:
// "fp8/amx" and so on; and int8 and mxfp4 once more with int8 products
// where it has VNNI: "int8/vnni", "mxfp4/vnni").
// Figures are medians over --reps measurements; it asserts nothing beyond the
// bitwise check (the machines are shared and noisy).
// Usage: bench_precision [--quick] [--reps N] [--seconds S] [--shape NAME]...
//          [--dtype NAME]... [--isa avx512|avx2|portable] [--llc-mb MB]
//          [--llc-times X] [--memory-gb GB] [--rank-slots N]
#include <fmt/format.h>
#include <immintrin.h>
#include <unistd.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <new>
#include <optional>
#include <string>
#include <vector>

#include "common/rng.h"
#include "common/summary_stats.h"
#include "kernels/cpu/amx_gemm.h"
#include "kernels/cpu/bf16_dot_gemm.h"
#include "kernels/cpu/encoded_matrix.h"
#include "kernels/cpu/int8_dot_gemm.h"
#include "kernels/cpu/expert_ffn.h"
#include "kernels/cpu/fixed_order_gemm.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/quant_weights.h"
#include "kernels/cpu/weight_codes.h"
#include "tests/bench/bench_timing.h"
#if MOED_BENCH_ONEDNN
#include "tests/bench/onednn_matmul.h"
#endif

using namespace moed;
using kernels::EncodedMatrix;
using kernels::ExpertView;
using kernels::PackedWeights;
using kernels::QuantWeights;
using kernels::WeightDtype;
using bench::seconds_per_call;
using bench::seconds_since;

namespace {

constexpr double kMB = 1e6, kGB = 1e9;
constexpr float kDownScale = 0.25f;  // runtime/weights/synthetic_model.cc: W2's scale against W1 and W3's

struct Shape {
  std::string name, label;
  std::size_t H, F;
};
const std::vector<Shape> kShapes{{"serving", "the serving benchmark's layer (configs/bench-prefill.toml)", 1024, 2816},
                                 {"qwen3-30b", "Qwen3-30B-A3B's expert", 2048, 768},
                                 {"deepseek-v3", "DeepSeek-V3's expert", 7168, 2048}};
const std::vector<WeightDtype> kDtypes{WeightDtype::f32, WeightDtype::bf16, WeightDtype::fp8, WeightDtype::mxfp4,
                                       WeightDtype::int8};

double median(const std::vector<double>& v) { return percentile(v, 0.5); }

// ---- the machine -------------------------------------------------------------------------------

std::string cpu_name() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("model name", 0) == 0) {
      std::string name = line.substr(line.find(':') + 1);
      name.erase(0, name.find_first_not_of(" \t"));
      return name;
    }
  return "unknown CPU";
}

// The last-level cache in bytes and where the figure came from ("" if
// nothing says). /sys first: in some VMs sysconf's figure is the cache of
// every L3 of the host (320 MB where /sys, and lscpu, say 32 MB).
std::pair<std::size_t, std::string> llc_bytes() {
  const long sc = sysconf(_SC_LEVEL3_CACHE_SIZE);
  std::ifstream in("/sys/devices/system/cpu/cpu0/cache/index3/size");
  std::string text;
  if (in >> text && !text.empty()) {
    char* end = nullptr;
    const unsigned long long v = std::strtoull(text.c_str(), &end, 10);
    const std::size_t unit = *end == 'K' ? 1024 : *end == 'M' ? 1024 * 1024 : 1;
    if (v > 0) {
      const std::size_t bytes = std::size_t(v) * unit;
      std::string source = "/sys/devices/system/cpu/cpu0/cache/index3/size";
      if (sc > 0 && std::size_t(sc) != bytes)
        source += fmt::format("; sysconf says {:.0f} MB", double(sc) / 1024 / 1024);
      return {bytes, source};
    }
  }
  if (sc > 0) return {std::size_t(sc), "sysconf(_SC_LEVEL3_CACHE_SIZE)"};
  return {0, ""};
}

// ---- streaming read bandwidth ------------------------------------------------------------------

__attribute__((target("avx512f"))) float sum_avx512(const float* p, std::size_t n) {
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
  std::size_t i = 0;
  for (; i + 128 <= n; i += 128) {
    a0 = _mm512_add_ps(a0, _mm512_load_ps(p + i));
    a1 = _mm512_add_ps(a1, _mm512_load_ps(p + i + 16));
    a2 = _mm512_add_ps(a2, _mm512_load_ps(p + i + 32));
    a3 = _mm512_add_ps(a3, _mm512_load_ps(p + i + 48));
    a4 = _mm512_add_ps(a4, _mm512_load_ps(p + i + 64));
    a5 = _mm512_add_ps(a5, _mm512_load_ps(p + i + 80));
    a6 = _mm512_add_ps(a6, _mm512_load_ps(p + i + 96));
    a7 = _mm512_add_ps(a7, _mm512_load_ps(p + i + 112));
  }
  a0 = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),
                     _mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(a6, a7)));
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, a0);
  float s = 0;
  for (float l : lanes) s += l;
  for (; i < n; ++i) s += p[i];
  return s;
}

__attribute__((target("avx2"))) float sum_avx2(const float* p, std::size_t n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
  std::size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    a0 = _mm256_add_ps(a0, _mm256_load_ps(p + i));
    a1 = _mm256_add_ps(a1, _mm256_load_ps(p + i + 8));
    a2 = _mm256_add_ps(a2, _mm256_load_ps(p + i + 16));
    a3 = _mm256_add_ps(a3, _mm256_load_ps(p + i + 24));
    a4 = _mm256_add_ps(a4, _mm256_load_ps(p + i + 32));
    a5 = _mm256_add_ps(a5, _mm256_load_ps(p + i + 40));
    a6 = _mm256_add_ps(a6, _mm256_load_ps(p + i + 48));
    a7 = _mm256_add_ps(a7, _mm256_load_ps(p + i + 56));
  }
  a0 = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)),
                     _mm256_add_ps(_mm256_add_ps(a4, a5), _mm256_add_ps(a6, a7)));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, a0);
  float s = 0;
  for (float l : lanes) s += l;
  for (; i < n; ++i) s += p[i];
  return s;
}

float sum_plain(const float* p, std::size_t n) {
  float a[8] = {};
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) a[j] += p[i + j];
  float s = 0;
  for (float v : a) s += v;
  for (; i < n; ++i) s += p[i];
  return s;
}

// The widest sum this CPU runs: a read stream the expert calls can be held to.
float stream_sum(const float* p, std::size_t n) {
  static const bool avx512 = __builtin_cpu_supports("avx512f"), avx2 = __builtin_cpu_supports("avx2");
  return avx512 ? sum_avx512(p, n) : avx2 ? sum_avx2(p, n) : sum_plain(p, n);
}
const char* stream_isa() {
  return __builtin_cpu_supports("avx512f") ? "AVX-512" : __builtin_cpu_supports("avx2") ? "AVX2" : "scalar";
}

volatile float g_sink;  // keeps the sums (and so the reads) alive

struct Buffer {
  float* data = nullptr;
  std::size_t floats = 0;
  explicit Buffer(std::size_t bytes) : floats((bytes + 63) / 64 * 16) {
    data = static_cast<float*>(std::aligned_alloc(64, floats * sizeof(float)));
    if (!data) throw std::bad_alloc();
    std::memset(data, 0x3c, floats * sizeof(float));  // 0x3c3c3c3c: a normal float, every page touched
  }
  ~Buffer() { std::free(data); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
};

// ---- experts -----------------------------------------------------------------------------------

// One expert's unquantized weights, scaled as the synthetic model scales them:
// W1|W3 [2F, H] uniform with sqrt(3/H) (unit variance of W x), W2 [H, F] with
// 0.25 sqrt(3/F).
struct Original {
  std::size_t H = 0, F = 0;
  std::vector<float> w13, w2;
};

Original make_original(std::size_t H, std::size_t F, std::uint64_t seed) {
  Original o{H, F, std::vector<float>(2 * F * H), std::vector<float>(H * F)};
  const CounterRng r13(hash_combine(seed, 13)), r2(hash_combine(seed, 2));
  const float s13 = std::sqrt(3.0f / float(H)), s2 = kDownScale * std::sqrt(3.0f / float(F));
  for (std::size_t i = 0; i < o.w13.size(); ++i) o.w13[i] = s13 * r13.symmetric(i);
  for (std::size_t i = 0; i < o.w2.size(); ++i) o.w2[i] = s2 * r2.symmetric(i);
  return o;
}

// An expert slot as a rank holds it: packed fp32, or packed codes.
struct Slot {
  WeightDtype dtype = WeightDtype::f32;
  std::size_t H = 0, F = 0;
  PackedWeights w13p, w2p;
  QuantWeights w13q, w2q;

  std::size_t bytes() const {
    return dtype == WeightDtype::f32 ? (w13p.floats() + w2p.floats()) * sizeof(float) : w13q.bytes() + w2q.bytes();
  }
  ExpertView view() const {
    ExpertView v;
    v.hidden = H;
    v.ffn = F;
    if (dtype == WeightDtype::f32) {
      v.w13_packed = &w13p;
      v.w2_packed = &w2p;
    } else {
      v.w13_quant = &w13q;
      v.w2_quant = &w2q;
    }
    return v;
  }
};

Slot f32_slot(const float* w13, const float* w2, std::size_t H, std::size_t F) {
  Slot s;
  s.H = H;
  s.F = F;
  s.w13p = PackedWeights(w13, 2 * F, H);
  s.w2p = PackedWeights(w2, H, F);
  return s;
}

// Packs encoded matrices as ExpertStore::make_slot does.
Slot slot_of(const EncodedMatrix& e13, const EncodedMatrix& e2) {
  const std::size_t H = e13.k, F = e2.k;
  if (e13.dtype == WeightDtype::f32) return f32_slot(e13.values().data(), e2.values().data(), H, F);
  Slot s;
  s.dtype = e13.dtype;
  s.H = H;
  s.F = F;
  s.w13q = QuantWeights(e13);
  s.w2q = QuantWeights(e2);
  return s;
}

Slot encode_slot(WeightDtype dtype, const Original& o) {
  if (dtype == WeightDtype::f32) return f32_slot(o.w13.data(), o.w2.data(), o.H, o.F);
  return slot_of(kernels::encode(dtype, o.w13.data(), 2 * o.F, o.H), kernels::encode(dtype, o.w2.data(), o.H, o.F));
}

// What a migration moves: the slot as EncodedMatrix bytes, W1|W3 then W2
// (ExpertStore::copy_slot); and the slot installed from them (add_slot).
std::size_t wire_bytes(const Slot& s) {
  return EncodedMatrix::code_bytes(s.dtype, 2 * s.F, s.H) + EncodedMatrix::scale_bytes(s.dtype, 2 * s.F, s.H) +
         EncodedMatrix::code_bytes(s.dtype, s.H, s.F) + EncodedMatrix::scale_bytes(s.dtype, s.H, s.F);
}

void copy_out(const Slot& s, std::uint8_t* out) {
  if (s.dtype != WeightDtype::f32) {
    const EncodedMatrix e13 = s.w13q.encoded(), e2 = s.w2q.encoded();
    e13.to_bytes(out);
    e2.to_bytes(out + e13.bytes());
    return;
  }
  std::vector<float> w13(2 * s.F * s.H), w2(s.H * s.F);
  s.w13p.unpack(w13.data());
  s.w2p.unpack(w2.data());
  const EncodedMatrix e13 = kernels::encode(WeightDtype::f32, w13.data(), 2 * s.F, s.H),
                      e2 = kernels::encode(WeightDtype::f32, w2.data(), s.H, s.F);
  e13.to_bytes(out);
  e2.to_bytes(out + e13.bytes());
}

Slot install(WeightDtype dtype, std::size_t H, std::size_t F, const std::uint8_t* in) {
  const EncodedMatrix e13 = EncodedMatrix::from_bytes(dtype, 2 * F, H, in);
  const EncodedMatrix e2 = EncodedMatrix::from_bytes(dtype, H, F, in + e13.bytes());
  return slot_of(e13, e2);
}

std::vector<float> normalish_rows(std::size_t rows, std::size_t H, std::uint64_t seed) {
  std::vector<float> x(rows * H);
  const CounterRng r(seed);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = r.normalish(i);
  return x;
}

std::vector<float> ffn(const Slot& s, const std::vector<float>& x, std::size_t m) {
  std::vector<float> y(m * s.H), scratch(kernels::expert_ffn_scratch(s.view(), m));
  const ExpertView v = s.view();
  kernels::expert_ffn(v, x.data(), m, y.data(), scratch.data());
  return y;
}

// ---- accuracy ----------------------------------------------------------------------------------

struct Accuracy {
  double same_max_abs = 0;  // against fp32 on the dtype's own values
  bool bitwise = false;
  double rel_max = 0, rel_mean = 0, cos_min = 1;  // against the unquantized fp32 weights, per row
};

Accuracy compare(const std::vector<float>& y, const std::vector<float>& same, const std::vector<float>& ref,
                 std::size_t rows, std::size_t H) {
  Accuracy a;
  a.bitwise = std::memcmp(y.data(), same.data(), y.size() * sizeof(float)) == 0;
  for (std::size_t i = 0; i < y.size(); ++i)
    a.same_max_abs = std::max(a.same_max_abs, double(std::fabs(y[i] - same[i])));
  double rel_sum = 0;
  for (std::size_t r = 0; r < rows; ++r) {
    double dd = 0, rr = 0, yy = 0, yr = 0;
    for (std::size_t j = 0; j < H; ++j) {
      const double q = y[r * H + j], f = ref[r * H + j];
      dd += (q - f) * (q - f);
      rr += f * f;
      yy += q * q;
      yr += q * f;
    }
    const double rel = std::sqrt(dd / rr);
    a.rel_max = std::max(a.rel_max, rel);
    rel_sum += rel;
    a.cos_min = std::min(a.cos_min, yr / std::sqrt(yy * rr));
  }
  a.rel_mean = rel_sum / double(rows);
  return a;
}

// ---- the toy model: top-k agreement ------------------------------------------------------------

constexpr std::size_t kToyH = 512, kToyF = 512, kToyExperts = 16, kToyTopK = 2, kToyLayers = 4, kToyTokens = 256;

struct ToyModel {
  std::vector<std::vector<float>> gates;       // [layer]: [E, H], uniform sqrt(3/H): unit-variance logits
  std::vector<std::vector<Original>> experts;  // [layer][expert]
};

ToyModel make_toy() {
  ToyModel t;
  const float sg = std::sqrt(3.0f / float(kToyH));
  for (std::size_t l = 0; l < kToyLayers; ++l) {
    std::vector<float> g(kToyExperts * kToyH);
    const CounterRng r(hash_combine(7000 + l, 1));
    for (std::size_t i = 0; i < g.size(); ++i) g[i] = sg * r.symmetric(i);
    t.gates.push_back(std::move(g));
    t.experts.emplace_back();
    for (std::size_t e = 0; e < kToyExperts; ++e)
      t.experts.back().push_back(make_original(kToyH, kToyF, hash_combine(8000 + l, e)));
  }
  return t;
}

struct ToyRun {
  std::vector<std::vector<std::array<int, kToyTopK>>> sets;  // [layer][token]: the top-k experts, ascending
  std::vector<float> residual;                               // [tokens, H] after the last layer
};

// Per layer: u = rmsnorm(x); fp32 gate logits u · gᵀ, softmax over the top
// k; the chosen experts run on u (rows grouped per expert, as a rank runs
// them); x += sum of gate weight · expert output.
ToyRun run_toy(const ToyModel& t, WeightDtype dtype) {
  const std::size_t H = kToyH, T = kToyTokens, E = kToyExperts, K = kToyTopK;
  ToyRun run;
  run.residual = normalish_rows(T, H, 9000);
  std::vector<float>& x = run.residual;
  std::vector<float> u(T * H), buf(T * H), out(T * H), scratch(T * 2 * kToyF);
  for (std::size_t l = 0; l < kToyLayers; ++l) {
    std::vector<Slot> slots;
    for (std::size_t e = 0; e < E; ++e) slots.push_back(encode_slot(dtype, t.experts[l][e]));
    for (std::size_t tok = 0; tok < T; ++tok) {
      double ss = 0;
      for (std::size_t j = 0; j < H; ++j) ss += double(x[tok * H + j]) * x[tok * H + j];
      const float inv = float(1.0 / std::sqrt(ss / double(H) + 1e-6));
      for (std::size_t j = 0; j < H; ++j) u[tok * H + j] = x[tok * H + j] * inv;
    }
    std::vector<std::array<int, K>> sets(T);
    std::vector<std::array<float, K>> weights(T);
    for (std::size_t tok = 0; tok < T; ++tok) {
      std::vector<std::pair<float, int>> logits(E);
      for (std::size_t e = 0; e < E; ++e) {
        float z = 0;
        for (std::size_t j = 0; j < H; ++j) z += u[tok * H + j] * t.gates[l][e * H + j];
        logits[e] = {z, int(e)};
      }
      std::partial_sort(logits.begin(), logits.begin() + K, logits.end(), [](auto a, auto b) {
        return a.first > b.first || (a.first == b.first && a.second < b.second);
      });
      float denom = 0;
      for (std::size_t k = 0; k < K; ++k) denom += std::exp(logits[k].first - logits[0].first);
      for (std::size_t k = 0; k < K; ++k) {
        sets[tok][k] = logits[k].second;
        weights[tok][k] = std::exp(logits[k].first - logits[0].first) / denom;
      }
    }
    for (std::size_t e = 0; e < E; ++e) {
      std::vector<std::pair<std::size_t, float>> rows;  // token, gate weight
      for (std::size_t tok = 0; tok < T; ++tok)
        for (std::size_t k = 0; k < K; ++k)
          if (sets[tok][k] == int(e)) rows.emplace_back(tok, weights[tok][k]);
      if (rows.empty()) continue;
      for (std::size_t r = 0; r < rows.size(); ++r) std::copy_n(u.data() + rows[r].first * H, H, buf.data() + r * H);
      const ExpertView v = slots[e].view();
      kernels::expert_ffn(v, buf.data(), rows.size(), out.data(), scratch.data());
      for (std::size_t r = 0; r < rows.size(); ++r)
        for (std::size_t j = 0; j < H; ++j) x[rows[r].first * H + j] += rows[r].second * out[r * H + j];
    }
    for (auto& s : sets) std::sort(s.begin(), s.end());
    run.sets.push_back(std::move(sets));
  }
  return run;
}

// ---- one shape ---------------------------------------------------------------------------------

struct Options {
  int reps = 5;
  double seconds = 0.25;
  double llc_times = 4;
  double memory_gb = 6;
  int rank_slots = 64;
  std::size_t llc = 0;
};

struct Row {
  WeightDtype dtype = WeightDtype::f32;
  kernels::CompactProducts products = kernels::CompactProducts::f32;
  std::string label;  // the dtype; int8/vnni, mxfp4/vnni: with int8 products
  std::size_t slot_bytes = 0, wire = 0;
  double copy_ms = 0, install_ms = 0;
  bool roundtrip = false;
  std::size_t set_experts = 0, set_bytes = 0;
  double stream_gbs = 0;
  std::array<double, 3> decode_gflops{};  // m = 1, 4, 16
  double prefill_gflops = 0, sgemm_gflops = 0;
  double gemms_gflops = 0;  // the expert's two GEMMs alone (no activation): what the dense bound does
  // oneDNN's dense matmul of the same shapes (0: not measured): bf16 for
  // bf16, fp8 and mxfp4 (which it has no GEMM for), int8 (u8 x s8) for int8.
  std::array<double, 3> onednn_decode_gflops{};
  double onednn_prefill_gflops = 0;
  Accuracy acc;
};

constexpr std::array<std::size_t, 3> kDecodeRows{1, 4, 16};
constexpr std::size_t kPrefillRows = 256, kAccuracyRows = 64;

double flops_per_call(const Shape& s, std::size_t m) { return 2.0 * double(m) * 3.0 * double(s.H) * double(s.F); }

#if MOED_BENCH_ONEDNN
// One expert's two GEMMs as oneDNN runs them densely.
struct OneDnnExpert {
  bench::OneDnnMatmul w13, w2;
  OneDnnExpert(bench::OneDnnMatmul::Kind kind, std::size_t m, const Original& w)
      : w13(kind, m, 2 * w.F, w.H, w.w13.data()), w2(kind, m, w.H, w.F, w.w2.data()) {}
  void run() {
    w13.run();
    w2.run();
  }
};

bench::OneDnnMatmul::Kind onednn_kind(WeightDtype dtype) {
  return dtype == WeightDtype::int8 ? bench::OneDnnMatmul::Kind::int8 : bench::OneDnnMatmul::Kind::bf16;
}

// oneDNN at the decode sizes, cycling through a set of n experts as moed's
// decode does; bf16 for the bf16-valued dtypes, int8 for int8. (Its prefill
// is measured beside moed's, below.)
void measure_onednn(const Shape& shape, WeightDtype dtype, const Original& w, std::size_t n, const Options& o,
                    Row& row) {
  if (dtype == WeightDtype::f32) return;  // its bound is OpenBLAS's sgemm
  const auto kind = onednn_kind(dtype);
  auto gflops = [&](std::size_t m, std::size_t experts) {
    std::vector<OneDnnExpert> set;
    set.reserve(experts);
    for (std::size_t i = 0; i < experts; ++i) set.emplace_back(kind, m, w);
    std::size_t next = 0;
    auto call = [&] {
      set[next].run();
      next = (next + 1) % experts;
    };
    for (std::size_t i = 0; i < experts; ++i) call();
    std::vector<double> runs;
    for (int r = 0; r < o.reps; ++r) runs.push_back(seconds_per_call(call, o.seconds));
    return flops_per_call(shape, m) / median(runs) / kGB;
  };
  // Its weights take bf16's bytes (int8's: int8's): the set that size, past the LLC.
  const double bytes = 3.0 * double(shape.H) * double(shape.F) * (kind == bench::OneDnnMatmul::Kind::bf16 ? 2 : 1);
  const std::size_t experts = std::max<std::size_t>(
      2, std::min(n * 4, std::size_t(std::ceil(o.llc_times * double(o.llc) / bytes))));
  for (std::size_t i = 0; i < kDecodeRows.size(); ++i) row.onednn_decode_gflops[i] = gflops(kDecodeRows[i], experts);
}

#endif

// A dtype as measured: with the products it multiplies with.
struct Variant {
  WeightDtype dtype;
  kernels::CompactProducts products;
  std::string label() const {
    const bool vnni =
        (dtype == WeightDtype::int8 || dtype == WeightDtype::mxfp4) && products == kernels::CompactProducts::int8;
    const bool amx = products == kernels::CompactProducts::amx && dtype != WeightDtype::f32;
    return fmt::format("{}{}", kernels::to_string(dtype), vnni ? "/vnni" : amx ? "/amx" : "");
  }
};

Row measure(const Shape& shape, const Variant& variant, const std::vector<Original>& originals,
            const Slot& reference, const std::vector<float>& x_acc, const std::vector<float>& y_ref,
            const Options& o) {
  const std::size_t H = shape.H, F = shape.F;
  const WeightDtype dtype = variant.dtype;
  kernels::set_compact_products(variant.products);
  Row row;
  row.dtype = dtype;
  row.products = variant.products;
  row.label = variant.label();
  // Distinct experts in this dtype; the decode set is copies of them.
  std::vector<Slot> distinct;
  for (const Original& orig : originals) distinct.push_back(encode_slot(dtype, orig));
  row.slot_bytes = distinct[0].bytes();
  row.wire = wire_bytes(distinct[0]);

  // Accuracy: the same rows through the dtype, through fp32 on its values, and through the unquantized weights.
  {
    std::vector<float> y_same;
    if (dtype == WeightDtype::f32) {
      y_same = ffn(reference, x_acc, kAccuracyRows);
    } else {
      const Slot on_values =
          f32_slot(distinct[0].w13q.encoded().values().data(), distinct[0].w2q.encoded().values().data(), H, F);
      y_same = ffn(on_values, x_acc, kAccuracyRows);
    }
    row.acc = compare(ffn(distinct[0], x_acc, kAccuracyRows), y_same, y_ref, kAccuracyRows, H);
  }

  // Migration: copy one slot out and install it again; the installed slot must copy out to the same bytes.
  {
    std::vector<std::uint8_t> wire(row.wire), again(row.wire);
    std::vector<double> out_runs, in_runs;
    Slot installed;
    for (int r = 0; r < o.reps; ++r) {
      out_runs.push_back(seconds_per_call([&] { copy_out(distinct[0], wire.data()); }, o.seconds));
      in_runs.push_back(seconds_per_call([&] { installed = install(dtype, H, F, wire.data()); }, o.seconds));
    }
    copy_out(installed, again.data());
    row.roundtrip = installed.bytes() == row.slot_bytes && wire == again;
    row.copy_ms = median(out_runs) * 1e3;
    row.install_ms = median(in_runs) * 1e3;
  }

  // Decode: a set of distinct slots, together at least llc_times the LLC, in fresh memory each.
  const double cap = o.memory_gb * kGB / 2;  // the set and the stream buffer of its size
  std::size_t n =
      std::max<std::size_t>(2, std::size_t(std::ceil(o.llc_times * double(o.llc) / double(row.slot_bytes))));
  n = std::max<std::size_t>(1, std::min(n, std::size_t(cap / double(row.slot_bytes))));
  std::vector<Slot> set;
  set.reserve(n);
  for (std::size_t i = 0; i < n; ++i) set.push_back(distinct[i % distinct.size()]);  // deep copies
  distinct.clear();
  row.set_experts = n;
  row.set_bytes = n * row.slot_bytes;
  std::vector<ExpertView> views;
  for (const Slot& s : set) views.push_back(s.view());
  const std::vector<float> x = normalish_rows(kPrefillRows, H, 4242);
  std::vector<float> y(kPrefillRows * H), scratch(kPrefillRows * 2 * F);
  // Calls go round the set, carrying on from one measurement to the next: an
  // expert's weights were last read n - 1 calls before, long evicted. The
  // stream reads its buffer the same way, one slot's bytes at a time.
  std::size_t next = 0;
  auto call = [&](std::size_t m) {
    kernels::expert_ffn(views[next], x.data(), m, y.data(), scratch.data());
    next = (next + 1) % n;
  };
  {
    Buffer stream(row.set_bytes);
    const std::size_t chunk = row.slot_bytes / sizeof(float) / 16 * 16;  // floats; the buffer holds n of them
    std::size_t next_chunk = 0;
    auto read = [&] {
      g_sink = stream_sum(stream.data + next_chunk * chunk, chunk);
      next_chunk = (next_chunk + 1) % n;
    };
    std::vector<double> stream_runs;
    std::array<std::vector<double>, 3> decode_runs;
    for (std::size_t i = 0; i < n; ++i) read();  // warm: page tables and code paths; the data cannot stay cached
    for (std::size_t i = 0; i < std::min<std::size_t>(n, 4); ++i) call(1);
    for (int r = 0; r < o.reps; ++r) {
      stream_runs.push_back(seconds_per_call(read, o.seconds) / double(chunk * sizeof(float)));  // seconds per byte
      for (std::size_t i = 0; i < kDecodeRows.size(); ++i)
        decode_runs[i].push_back(seconds_per_call([&] { call(kDecodeRows[i]); }, o.seconds));
    }
    row.stream_gbs = 1.0 / median(stream_runs) / kGB;
    for (std::size_t i = 0; i < kDecodeRows.size(); ++i)
      row.decode_gflops[i] = flops_per_call(shape, kDecodeRows[i]) / median(decode_runs[i]) / kGB;
  }

  // Prefill: one expert at 256 rows, alternating with OpenBLAS on the
  // unquantized fp32 weights of the same shapes and with oneDNN's dense
  // matmul (the bound): this host's speed drifts by tens of percent over
  // seconds, and a ratio of measurements taken side by side drifts less.
  {
    const Original& w = originals[0];
    const ExpertView v = set[0].view();
    std::vector<double> ffn_runs, blas_runs, onednn_runs, gemm_runs;
#if MOED_BENCH_ONEDNN
    std::optional<OneDnnExpert> dense;
    if (dtype != WeightDtype::f32) dense.emplace(onednn_kind(dtype), kPrefillRows, w);
#endif
    for (int r = 0; r < o.reps; ++r) {
#if MOED_BENCH_ONEDNN
      if (dense) onednn_runs.push_back(seconds_per_call([&] { dense->run(); }, o.seconds));
#endif
      blas_runs.push_back(seconds_per_call(
          [&] {
            kernels::gemm_xwt(x.data(), kPrefillRows, H, w.w13.data(), 2 * F, scratch.data());
            kernels::gemm_xwt(scratch.data(), kPrefillRows, F, w.w2.data(), H, y.data(), /*lda=*/2 * F);
          },
          o.seconds));
      ffn_runs.push_back(seconds_per_call(
          [&] { kernels::expert_ffn(v, x.data(), kPrefillRows, y.data(), scratch.data()); }, o.seconds));
      // The same two GEMMs without the activation between them (W2 takes
      // the up-projection's first F columns as they are).
      gemm_runs.push_back(seconds_per_call(
          [&] {
            if (v.w13_quant) {
              kernels::gemm_fixed_order(x.data(), kPrefillRows, *v.w13_quant, scratch.data());
              kernels::gemm_fixed_order(scratch.data(), kPrefillRows, *v.w2_quant, y.data(), /*lda=*/2 * F);
            } else {
              kernels::gemm_fixed_order(x.data(), kPrefillRows, *v.w13_packed, scratch.data());
              kernels::gemm_fixed_order(scratch.data(), kPrefillRows, *v.w2_packed, y.data(), /*lda=*/2 * F);
            }
          },
          o.seconds));
    }
    row.gemms_gflops = flops_per_call(shape, kPrefillRows) / median(gemm_runs) / kGB;
    row.prefill_gflops = flops_per_call(shape, kPrefillRows) / median(ffn_runs) / kGB;
    row.sgemm_gflops = flops_per_call(shape, kPrefillRows) / median(blas_runs) / kGB;
    if (!onednn_runs.empty()) row.onednn_prefill_gflops = flops_per_call(shape, kPrefillRows) / median(onednn_runs) / kGB;
  }
#if MOED_BENCH_ONEDNN
  measure_onednn(shape, dtype, originals[0], n, o, row);
#endif
  return row;
}

void print_shape(const Shape& s, const std::vector<Row>& rows, const Options& o) {
  const double weights = 3.0 * double(s.H) * double(s.F);
  fmt::print("\n== {}: H={} F={} (W1|W3 [{}, {}] + W2 [{}, {}], {:.1f}M weights), medians of {} ==\n", s.label, s.H,
             s.F, 2 * s.F, s.H, s.H, s.F, weights / 1e6, o.reps);
  std::size_t f32_bytes = 0;
  for (const Row& r : rows)
    if (r.dtype == WeightDtype::f32) f32_bytes = r.slot_bytes;
  if (!f32_bytes) f32_bytes = std::size_t(weights * 4);  // f32 not measured: its unpadded size

  fmt::print(
      "memory and migration of one expert slot (copy out: encoded() + to_bytes; install: from_bytes + pack; one core, "
      "the wire not included):\n");
  fmt::print("  {:<10} {:>9} {:>7} {:>6} {:>12} {:>9} {:>10} {:>10} {:>9}\n", "dtype", "slot MB", "/ f32", "bits/w",
             fmt::format("GB/{} slots", o.rank_slots), "moved MB", "copy ms", "install ms", "roundtrip");
  for (const Row& r : rows)
    fmt::print("  {:<10} {:>9.2f} {:>7.3f} {:>6.2f} {:>12.2f} {:>9.2f} {:>10.2f} {:>10.2f} {:>9}\n",
               r.label, double(r.slot_bytes) / kMB, double(r.slot_bytes) / double(f32_bytes),
               double(r.slot_bytes) * 8 / weights, double(r.slot_bytes) * o.rank_slots / kGB, double(r.wire) / kMB,
               r.copy_ms, r.install_ms, r.roundtrip ? "same" : "DIFFERS");

  fmt::print(
      "decode, GFLOP/s per core, cycling through the set (bound: a call's weight bytes at the stream GB/s of a\n"
      "buffer the set's size; at m rows it is m x the bound at 1):\n");
  fmt::print("  {:<10} {:>7} {:>8} {:>6} {:>11} {:>9} {:>8} {:>6} {:>8} {:>6} {:>8} {:>6}\n", "dtype", "experts",
             "set MB", "x LLC", "stream GB/s", "bound m=1", "m=1", "ratio", "m=4", "ratio", "m=16", "ratio");
  for (const Row& r : rows) {
    const double bound1 = flops_per_call(s, 1) / (double(r.slot_bytes) / (r.stream_gbs * kGB)) / kGB;
    fmt::print("  {:<10} {:>7} {:>8.0f} {:>6.1f} {:>11.1f} {:>9.2f}", r.label, r.set_experts,
               double(r.set_bytes) / kMB, double(r.set_bytes) / double(o.llc), r.stream_gbs, bound1);
    for (std::size_t i = 0; i < kDecodeRows.size(); ++i)
      fmt::print(" {:>8.2f} {:>6.2f}", r.decode_gflops[i], r.decode_gflops[i] / (bound1 * double(kDecodeRows[i])));
    fmt::print("\n");
    if (double(r.set_bytes) < o.llc_times * double(o.llc))
      fmt::print("  ({}: --memory-gb held the set under {}x the LLC: part of its weights may come from the cache)\n",
                 r.label, o.llc_times);
  }

  const bool onednn = std::any_of(rows.begin(), rows.end(), [](const Row& r) { return r.onednn_prefill_gflops > 0; });
  fmt::print(
      "prefill, {} rows per expert, GFLOP/s per core (bound: the best dense GEMM of the two shapes, no activation:\n"
      "OpenBLAS fp32 sgemm for f32; {}):\n",
      kPrefillRows,
      onednn ? "oneDNN's bf16 matmul for bf16, fp8 and mxfp4, its int8 matmul (u8 activations) for int8"
             : "oneDNN is not installed, so OpenBLAS's sgemm for all");
  fmt::print("  (GEMMs: the expert's two GEMMs alone, without the activation between them and its pass over the\n"
             "  up-projection: the work the bound does; the aim is on the expert)\n");
  fmt::print("  {:<10} {:>9} {:>11} {:>12} {:>6} {:>9} {:>6}\n", "dtype", "expert", "sgemm fp32", "oneDNN dense",
             "ratio", "GEMMs", "ratio");
  for (const Row& r : rows) {
    const double bound = r.onednn_prefill_gflops > 0 ? r.onednn_prefill_gflops : r.sgemm_gflops;
    fmt::print("  {:<10} {:>9.1f} {:>11.1f} {:>12} {:>6.2f} {:>9.1f} {:>6.2f}\n", r.label, r.prefill_gflops,
               r.sgemm_gflops, r.onednn_prefill_gflops > 0 ? fmt::format("{:.1f}", r.onednn_prefill_gflops) : "-",
               r.prefill_gflops / bound, r.gemms_gflops, r.gemms_gflops / bound);
  }
  if (onednn) {
    fmt::print(
        "moed against oneDNN's dense matmul at decode, the same set cycling (GFLOP/s; > 1: moed faster):\n");
    fmt::print("  {:<10} {:>10} {:>10} {:>10} {:>8} {:>8} {:>8}\n", "dtype", "oneDNN m=1", "m=4", "m=16", "x m=1",
               "x m=4", "x m=16");
    for (const Row& r : rows) {
      if (r.onednn_prefill_gflops <= 0) continue;
      fmt::print("  {:<10} {:>10.2f} {:>10.2f} {:>10.2f}", r.label, r.onednn_decode_gflops[0],
                 r.onednn_decode_gflops[1], r.onednn_decode_gflops[2]);
      for (std::size_t i = 0; i < kDecodeRows.size(); ++i)
        fmt::print(" {:>8.2f}", r.decode_gflops[i] / r.onednn_decode_gflops[i]);
      fmt::print("\n");
    }
  }

  fmt::print("accuracy, {} unit-variance rows (per row: rel err = |y - y_fp32| / |y_fp32|, cos = cosine similarity):\n",
             kAccuracyRows);
  fmt::print("  {:<10} {:>21} {:>8} | {:>25} {:>12} {:>12}\n", "dtype", "vs fp32 on its values", "bitwise",
             "vs unquantized: rel err max", "rel err mean", "cos min");
  for (const Row& r : rows)
    fmt::print("  {:<10} {:>21.3g} {:>8} | {:>25.3e} {:>12.3e} {:>12.8f}\n", r.label,
               r.acc.same_max_abs,
               r.products != kernels::CompactProducts::f32 && r.dtype != WeightDtype::f32 ? "-"
               : r.acc.bitwise                                                            ? "yes"
                                                                                          : "NO",
               r.acc.rel_max, r.acc.rel_mean, r.acc.cos_min);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app(
      "bench_precision: experts in f32, bf16, fp8, mxfp4 and int8 on one core, against bounds measured in the same "
      "run");
  Options o;
  bool quick = false;
  std::string isa = kernels::to_string(kernels::best_gemm_isa());
  std::vector<std::string> shape_names, dtype_names;
  double llc_mb = 0;
  int reps = 0;
  double seconds = 0, llc_times = 0;
  app.add_flag("--quick", quick, "a short run: 3 reps of 0.05 s, decode sets 2x the LLC (defaults 5, 0.25 s, 4x)");
  app.add_option("--reps", reps, "measurements per figure (medians printed)")->check(CLI::Range(1, 99));
  app.add_option("--seconds", seconds, "least time per measurement")->check(CLI::Range(0.001, 60.0));
  app.add_option("--shape", shape_names, "serving, qwen3-30b or deepseek-v3 (repeatable; default all)")
      ->check(CLI::IsMember({"serving", "qwen3-30b", "deepseek-v3"}));
  app.add_option("--dtype", dtype_names, "f32, bf16, fp8, mxfp4 or int8 (repeatable; default all)")
      ->check(CLI::IsMember({"f32", "bf16", "fp8", "mxfp4", "int8"}));
  app.add_option("--isa", isa, "fixed-order kernel and decoders: avx512, avx2 or portable")
      ->check(CLI::IsMember({"avx512", "avx2", "portable"}));
  std::string products = "auto";
  app.add_option("--products", products,
                 "compact dtypes' products: f32, bf16 (AVX-512 BF16 dot products), int8 (int8 experts: VNNI), amx "
                 "(AMX tiles) or auto (bf16 where the CPU has them; again with amx where it has AMX; int8 and mxfp4 "
                 "also with int8 where it has VNNI)")
      ->check(CLI::IsMember({"auto", "f32", "bf16", "int8", "amx"}));
  app.add_option("--llc-mb", llc_mb, "last-level cache in MB (default: what sysconf or /sys says)")
      ->check(CLI::Range(1.0, 1e6));
  app.add_option("--llc-times", llc_times, "a decode set's bytes at least this many times the LLC")
      ->check(CLI::Range(1.0, 100.0));
  app.add_option("--memory-gb", o.memory_gb, "at most this for a decode set and its stream buffer together")
      ->check(CLI::Range(0.1, 1e4));
  app.add_option("--rank-slots", o.rank_slots, "expert slots a rank holds, for the per-rank memory column")
      ->check(CLI::Range(1, 1000000));
  CLI11_PARSE(app, argc, argv);

  o.reps = reps ? reps : quick ? 3 : 5;
  o.seconds = seconds > 0 ? seconds : quick ? 0.05 : 0.25;
  o.llc_times = llc_times > 0 ? llc_times : quick ? 2 : 4;
  const auto [llc_found, llc_source] = llc_bytes();
  o.llc = llc_mb > 0 ? std::size_t(llc_mb * 1024 * 1024) : llc_found;
  if (!o.llc) {
    fmt::print(
        stderr,
        "bench_precision: the last-level cache size is unknown here (neither sysconf nor /sys says): pass --llc-mb\n");
    return 2;
  }
  bool isa_set = false;
  for (auto candidate : {kernels::GemmIsa::portable, kernels::GemmIsa::avx2, kernels::GemmIsa::avx512})
    if (kernels::to_string(candidate) == isa) {
      if (int(candidate) > int(kernels::best_gemm_isa())) {
        fmt::print(stderr, "bench_precision: --isa {}: this CPU runs at most {}\n", isa,
                   kernels::to_string(kernels::best_gemm_isa()));
        return 2;
      }
      kernels::set_gemm_isa(candidate);
      isa_set = true;
    }
  if (!isa_set) return 2;  // unreachable: CLI11 checked the name
  // auto: bf16 products where the CPU has them, every compact dtype a second
  // time with amx products where it has AMX, and int8 and mxfp4 with int8
  // products where it has those.
  const bool both_int8 = products == "auto" && kernels::cpu_has_int8_dot();
  const bool also_amx = products == "auto" && kernels::cpu_has_amx();
  if (products == "auto") products = kernels::cpu_has_bf16_dot() ? "bf16" : "f32";
  const kernels::CompactProducts chosen = products == "bf16"   ? kernels::CompactProducts::bf16
                                          : products == "int8" ? kernels::CompactProducts::int8
                                          : products == "amx"  ? kernels::CompactProducts::amx
                                                               : kernels::CompactProducts::f32;
  kernels::set_compact_products(chosen);
  std::vector<Shape> shapes;
  for (const Shape& s : kShapes)
    if (shape_names.empty() || std::find(shape_names.begin(), shape_names.end(), s.name) != shape_names.end())
      shapes.push_back(s);
  std::vector<Variant> variants;
  for (WeightDtype d : kDtypes)
    if (dtype_names.empty() ||
        std::find(dtype_names.begin(), dtype_names.end(), kernels::to_string(d)) != dtype_names.end()) {
      variants.push_back({d, chosen});
      if (d != WeightDtype::f32 && also_amx) variants.push_back({d, kernels::CompactProducts::amx});
      if ((d == WeightDtype::int8 || d == WeightDtype::mxfp4) && both_int8)
        variants.push_back({d, kernels::CompactProducts::int8});
    }

  kernels::set_blas_threads(1);
  const auto start = std::chrono::steady_clock::now();
  fmt::print("CPU: {}; {} cores online; last-level cache {:.0f} MB (from {})\n", cpu_name(),
             sysconf(_SC_NPROCESSORS_ONLN), double(o.llc) / 1024 / 1024, llc_mb > 0 ? "--llc-mb" : llc_source);
  fmt::print("one thread; fixed-order kernel {}; stream sum {}; {}\n", kernels::to_string(kernels::gemm_isa()),
             stream_isa(), kernels::blas_description());
  fmt::print(
      "medians of {} measurements of >= {} s each{}; decode sets >= {}x the LLC (at least 2 experts), set + stream "
      "buffer <= {} GB\n",
      o.reps, o.seconds, quick ? " (--quick)" : "", o.llc_times, o.memory_gb);
  fmt::print(
      "FLOPs per expert call: 2 m (3 H F); weights uniform at the synthetic model's scales (no outliers: real\n"
      "checkpoints quantize worse); compact dtypes multiply with {} products ([experts].products){}{}\n",
      kernels::to_string(chosen),
      both_int8 ? "; int8/vnni, mxfp4/vnni: int8 products (8-bit activations, AVX-512 VNNI)" : "",
      also_amx ? "; <dtype>/amx: amx products (bf16 activations, AMX tiles of 32 steps)" : "");
  for (const Shape& shape : shapes) {
    // Two distinct experts (one where the set is a single expert); the decode sets copy them.
    std::vector<Original> originals;
    for (std::uint64_t i = 0; i < 2; ++i)
      originals.push_back(make_original(shape.H, shape.F, hash_combine(shape.H * 31 + shape.F, i)));
    const Slot reference = encode_slot(WeightDtype::f32, originals[0]);
    const std::vector<float> x_acc = normalish_rows(kAccuracyRows, shape.H, 77);
    const std::vector<float> y_ref = ffn(reference, x_acc, kAccuracyRows);
    std::vector<Row> rows;
    for (const Variant& v : variants) rows.push_back(measure(shape, v, originals, reference, x_acc, y_ref, o));
    print_shape(shape, rows, o);
    std::fflush(stdout);
  }

  fmt::print(
      "\n== top-{} agreement: a {}-layer toy MoE (H={} F={}, {} experts, top-{}, {} tokens; fp32 gates, RMS norm,\n"
      "   residual), each dtype's run against the unquantized fp32 run: tokens whose top-{} set is identical ==\n",
      kToyTopK, kToyLayers, kToyH, kToyF, kToyExperts, kToyTopK, kToyTokens, kToyTopK);
  const ToyModel toy = make_toy();
  kernels::set_compact_products(kernels::CompactProducts::f32);
  const ToyRun ref = run_toy(toy, WeightDtype::f32);
  fmt::print("  {:<10}", "dtype");
  for (std::size_t l = 0; l < kToyLayers; ++l) fmt::print(" {:>9}", fmt::format("layer {}", l + 1));
  fmt::print(" {:>22}\n", "final residual rel err");
  for (const Variant& v : variants) {
    kernels::set_compact_products(v.products);
    const ToyRun run = run_toy(toy, v.dtype);
    fmt::print("  {:<10}", v.label());
    for (std::size_t l = 0; l < kToyLayers; ++l) {
      std::size_t same = 0;
      for (std::size_t t = 0; t < kToyTokens; ++t) same += run.sets[l][t] == ref.sets[l][t];
      fmt::print(" {:>9.4f}", double(same) / double(kToyTokens));
    }
    double dd = 0, rr = 0;
    for (std::size_t i = 0; i < ref.residual.size(); ++i) {
      const double diff = double(run.residual[i]) - ref.residual[i];
      dd += diff * diff;
      rr += double(ref.residual[i]) * ref.residual[i];
    }
    fmt::print(" {:>22.3e}\n", std::sqrt(dd / rr));
  }
  fmt::print("\nbench_precision: {:.0f} s\n", seconds_since(start));
  return 0;
}
