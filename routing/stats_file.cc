#include "routing/stats_file.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string_view>
#include <vector>

#include "common/atomic_file.h"
#include "common/error.h"
#include "common/little_endian.h"

namespace moed::routing {

namespace {

constexpr std::string_view kMagic = "MOEDSTAT";
// Version 2 is version 1 with the router biases before the checksum; a file
// without biases is still written as version 1.
constexpr std::uint32_t kVersion = 1, kVersionWithBias = 2;
constexpr std::size_t kHeaderBytes = 8 + 4 * 4 + 8 + 8 + 8;
constexpr std::size_t kChecksumBytes = 8;
constexpr std::uint32_t kMaxLayers = 4096, kMaxExperts = 65536, kMaxK = 1024;

std::uint64_t fnv1a(std::string_view bytes) {
  std::uint64_t h = 14695981039346656037ull;
  for (char c : bytes) {
    h ^= static_cast<unsigned char>(c);
    h *= 1099511628211ull;
  }
  return h;
}

using Writer = LittleEndianWriter;
using Reader = LittleEndianReader;

std::string read_whole_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) MOED_THROW(Input, "{}: cannot open stats file: {}", path, std::strerror(errno));
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) MOED_THROW(Input, "{}: cannot read stats file", path);
  return bytes;
}

}  // namespace

void write_stats_file(const RoutingStats& stats, const std::string& path) {
  const std::vector<std::uint32_t>& cells = stats.sample_cells();
  const std::vector<double>& bias = stats.router_bias_;
  Writer w(kHeaderBytes + stats.values_.size() * 8 + cells.size() * 4 + kChecksumBytes + 4 + bias.size() * 8);
  w.bytes(kMagic);
  w.u32(bias.empty() ? kVersion : kVersionWithBias);
  w.u32(static_cast<std::uint32_t>(stats.layers_));
  w.u32(static_cast<std::uint32_t>(stats.experts_));
  w.u32(static_cast<std::uint32_t>(stats.max_k_));
  w.f64(stats.half_life_);
  w.u64(stats.steps_);
  w.u64(stats.sample_count_);
  for (double v : stats.values_) w.f64(v / stats.weight_);  // what the accessors return
  for (std::uint32_t c : cells) w.u32(c);
  if (!bias.empty()) {
    w.u32(static_cast<std::uint32_t>(bias.size()));
    for (double v : bias) w.f64(v);
  }
  w.u64(fnv1a(w.str()));
  write_file_atomically(path, w.str());
}

RoutingStats read_stats_file(const std::string& path) {
  const std::string bytes = read_whole_file(path);
  const std::size_t size = bytes.size();
  if (std::string_view(bytes).substr(0, kMagic.size()) != kMagic.substr(0, std::min(size, kMagic.size())))
    MOED_THROW(Input, "{}: not a moed stats file (it does not start with '{}')", path, kMagic);
  if (size < kHeaderBytes + kChecksumBytes)
    MOED_THROW(Input, "{}: too short: {} bytes, a stats file has at least {}", path, size,
               kHeaderBytes + kChecksumBytes);

  Reader r(std::string_view(bytes).substr(kMagic.size()));
  const std::uint32_t version = r.u32();
  if (version != kVersion && version != kVersionWithBias)
    MOED_THROW(Input, "{}: unsupported stats file version {} (supported: {}, {})", path, version, kVersion,
               kVersionWithBias);
  const std::uint32_t layers = r.u32(), experts = r.u32(), max_k = r.u32();
  const double half_life = r.f64();
  const std::uint64_t steps = r.u64(), sample_count = r.u64();
  const auto shape = [&](const char* what, std::uint32_t value, std::uint32_t max) {
    if (value == 0 || value > max)
      MOED_THROW(Input, "{}: absurd shape: {} = {} (expected 1 to {})", path, what, value, max);
  };
  shape("layers", layers, kMaxLayers);
  shape("experts", experts, kMaxExperts);
  shape("max_k", max_k, kMaxK);

  // Sizes: at most ~2^47 bytes of values and 2^24 bytes per path, so only
  // the sample count can overflow; a count that cannot fit in the file is
  // reported with the size it would need.
  const std::size_t value_count = RoutingStats::value_count(layers, experts);
  const std::size_t path_bytes = std::size_t{layers} * (max_k + 1) * 4;
  const std::size_t fixed = kHeaderBytes + value_count * 8 + kChecksumBytes;
  const std::string shape_text = fmt::format("{} layers x {} experts, max_k {}, {} sampled tokens",
                                             layers, experts, max_k, sample_count);
  if (sample_count > size / path_bytes)
    MOED_THROW(Input, "{}: size does not match the shape ({}): the sample alone needs more than "
               "the {} bytes of the file (truncated)", path, shape_text, size);
  std::size_t expected = fixed + sample_count * path_bytes;
  // Version 2: the biases' count (0 or layers x experts), then the biases.
  std::uint32_t bias_count = 0;
  if (version == kVersionWithBias) {
    const std::size_t at = expected - kChecksumBytes;
    if (size < at + 4)
      MOED_THROW(Input, "{}: size does not match the shape ({}): no room for the router biases (truncated)", path,
                 shape_text);
    bias_count = Reader(std::string_view(bytes).substr(at)).u32();
    if (bias_count != std::size_t{layers} * experts)
      MOED_THROW(Input, "{}: {} router biases, expected layers x experts = {}", path, bias_count,
                 std::size_t{layers} * experts);
    expected += 4 + std::size_t{bias_count} * 8;
  }
  if (expected != size)
    MOED_THROW(Input, "{}: size does not match the shape ({}): expected {} bytes, got {} ({})",
               path, shape_text, expected, size, expected > size ? "truncated" : "trailing bytes");

  const std::uint64_t stored = Reader(std::string_view(bytes).substr(size - 8)).u64();
  const std::uint64_t computed = fnv1a(std::string_view(bytes).substr(0, size - 8));
  if (stored != computed)
    MOED_THROW(Input, "{}: corrupt: checksum mismatch (stored {:016x}, computed {:016x})", path,
               stored, computed);
  if (!(std::isfinite(half_life) && half_life >= 0))
    MOED_THROW(Input, "{}: bad half-life {} steps (expected a finite number >= 0)", path,
               half_life);

  RoutingStats stats(static_cast<int>(layers), static_cast<int>(experts), half_life,
                     static_cast<std::size_t>(sample_count), static_cast<int>(max_k));
  stats.steps_ = steps;
  Reader body(std::string_view(bytes).substr(kHeaderBytes));
  for (std::size_t i = 0; i < value_count; ++i) {
    const double v = body.f64();
    if (!(v >= 0) || !std::isfinite(v))
      MOED_THROW(Input, "{}: value {} ({}) is {}, expected a finite count >= 0", path, i,
                 stats.describe_value(i), v);
    stats.values_[i] = v;
  }
  std::vector<std::uint32_t> cells(static_cast<std::size_t>(sample_count) * path_bytes / 4);
  for (auto& c : cells) c = body.u32();
  const std::size_t width = max_k + 1;
  for (std::size_t c = 0; c < cells.size(); c += width) {
    const std::size_t token = c / (width * layers), layer = c / width % layers;
    const std::uint32_t count = cells[c];
    if (count > max_k)
      MOED_THROW(Input, "{}: sample token {} layer {}: {} experts, more than max_k {}", path,
                 token, layer, count, max_k);
    for (std::uint32_t i = 0; i < count; ++i) {
      const std::uint32_t e = cells[c + 1 + i];
      if (e >= experts)
        MOED_THROW(Input, "{}: sample token {} layer {}: expert {} out of range (experts {})",
                   path, token, layer, e, experts);
      for (std::uint32_t j = 0; j < i; ++j)
        if (cells[c + 1 + j] == e)
          MOED_THROW(Input, "{}: sample token {} layer {}: expert {} twice", path, token, layer, e);
    }
  }
  stats.append_sample_cells(cells);
  if (bias_count) {
    body.u32();
    std::vector<double> bias(bias_count);
    for (std::size_t i = 0; i < bias.size(); ++i) {
      bias[i] = body.f64();
      if (!std::isfinite(bias[i]))
        MOED_THROW(Input, "{}: router bias {} (layer {} expert {}) is {}, expected a finite number", path, i,
                   i / experts, i % experts, bias[i]);
    }
    stats.set_router_bias(std::move(bias));
  }
  return stats;
}

}  // namespace moed::routing
