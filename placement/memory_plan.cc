#include "placement/memory_plan.h"

#include <map>

#include <fmt/format.h>

#include <algorithm>
#include <charconv>

#include "common/error.h"
#include "common/quote.h"
#include "common/saturating.h"

namespace moed::placement {

namespace {

using U = std::uint64_t;
constexpr U kF32 = 4;
// Rows per expert call at most (the executor's block): its scratch is sized for them.
constexpr U kCallRows = 256;

const char* const kSlots = "expert slots";
const char* const kRouter = "router and norm";
const char* const kBuffers = "dispatch and combine";
const char* const kMigration = "migration";
const char* const kStats = "statistics and traces";
const char* const kProcess = "process";

// " x 4 bytes", or the block format's bytes per value.
std::string per_value(const WeightFormat& f) {
  if (f.block_elements == 1) return fmt::format("{} bytes", f.block_bytes);
  return fmt::format("{} ({} bytes per {} values)", f.name, f.block_bytes, f.block_elements);
}

}  // namespace

const std::vector<std::string>& memory_groups() {
  static const std::vector<std::string> groups{kSlots, kRouter, kBuffers, kMigration, kStats, kProcess};
  return groups;
}

std::uint64_t MemoryEstimate::total() const {
  U sum = 0;
  for (const MemoryPart& p : parts) sum = saturating_add(sum, p.bytes);
  return sum;
}

std::uint64_t MemoryEstimate::group_total(const std::string& group) const {
  U sum = 0;
  for (const MemoryPart& p : parts)
    if (p.group == group) sum = saturating_add(sum, p.bytes);
  return sum;
}

std::uint64_t slot_bytes(const RankMemoryInputs& in, std::uint64_t shards) {
  // A shard's F/S, rounded up: the last shard may be narrower, none is wider.
  const U f = (in.ffn + shards - 1) / shards;
  const U values = saturating_mul({3, in.hidden, f});
  const U bias = in.expert_bias ? saturating_add(saturating_mul(2, f), in.hidden) : 0;
  return saturating_add(in.expert_format.bytes(values), in.expert_format.bytes(bias));
}

std::uint64_t stats_bytes(U L, U E, U sample_tokens, U max_k) {
  // Loads, co-activation pairs, next-layer affinity, tokens per layer (8 bytes
  // each); the sample: 4 bytes x L x (max_k + 1) per token.
  const U pairs = E ? saturating_mul({L, E, E - 1}) / 2 : 0;
  const U affinity = L ? saturating_mul({L - 1, E, E}) : 0;
  const U values = saturating_add(saturating_add(saturating_mul(L, E), pairs), saturating_add(affinity, L));
  return saturating_add(saturating_mul(8, values), saturating_mul({4, L, max_k + 1, sample_tokens}));
}

MemoryEstimate rank_memory(const RankMemoryInputs& in) {
  const U L = in.layers, E = in.experts, H = in.hidden, F = in.ffn, k = in.max_k;
  MemoryEstimate e;
  auto add = [&](std::string group, std::string what, std::string keys, U bytes) {
    e.parts.push_back({std::move(what), std::move(keys), bytes, std::move(group)});
  };
  const std::string value = per_value(in.expert_format);

  // Expert slots: whole experts, then each group of shards.
  for (const SlotGroup& g : in.slots) {
    if (g.shards != 1) continue;
    add(kSlots,
        fmt::format("expert weights: {} slots x 3 x [model].hidden {} x [model].ffn {}{} x {}", g.count, H, F,
                    in.expert_bias ? " (+ biases)" : "", value),
        "[model].hidden, [model].ffn, or the slots per rank ([model].experts x [model].layers, spread over "
        "more ranks)",
        saturating_mul(g.count, slot_bytes(in)));
    // The copy a slot is packed from: freed after the load, but the
    // allocator keeps its pages (glibc's mmap threshold has grown past it).
    if (in.pack_at_load && g.count)
      add(kSlots, "packing at load: one slot more, packed from and kept by the allocator",
          "[model].hidden, [model].ffn", slot_bytes(in));
  }
  for (const SlotGroup& g : in.slots) {
    if (g.shards == 1 || !g.count) continue;
    add(kSlots,
        fmt::format("expert shards: {} slots of 1/{} x 3 x [model].hidden {} x [model].ffn {} / {} x {}", g.count,
                    g.shards, H, F, g.shards, value),
        "[model].hidden, [model].ffn, or the shards per rank", saturating_mul(g.count, slot_bytes(in, g.shards)));
  }
  if (in.shared_ffn)
    add(kSlots,
        fmt::format("shared experts: [model].layers {} x 3 x [model].hidden {} x {} (shared expert F) x {}", L, H,
                    in.shared_ffn, value),
        "[model].hidden, the checkpoint's shared expert size", in.expert_format.bytes(saturating_mul({L, 3, H, in.shared_ffn})));
  if (in.dense_layers && in.dense_ffn)
    add(kSlots,
        fmt::format("dense layers ([model].serve_dense): {} x (3 x [model].hidden {} x {} (dense F) x {} + the norm)",
                    in.dense_layers, H, in.dense_ffn, value),
        "[model].serve_dense, the checkpoint's dense layers",
        saturating_add(in.expert_format.bytes(saturating_mul({in.dense_layers, 3, H, in.dense_ffn})),
                       saturating_mul({in.dense_layers, H, kF32})));
  // Router and norm, replicated: moed routes in fp32.
  if (in.cpu_router)
    add(kRouter,
        fmt::format("gates: 2 x [model].layers {} x [model].experts {} x [model].hidden {} x 4 bytes", L, E, H),
        "[model].layers, [model].experts, [model].hidden",
        saturating_add(saturating_mul({2, L, E, H, kF32}),
                       saturating_add(saturating_mul({L, H, kF32}), saturating_mul({E, H, kF32}))));
  else
    add(kRouter,
        fmt::format("gates and norms: [model].layers {} x ([model].experts {} + 1) x [model].hidden {} x 4 bytes", L,
                    E, H),
        "[model].layers, [model].experts, [model].hidden", saturating_mul({L, E + 1, H, kF32}));

  // Dispatch and combine. Per local token: its row, normalised row, output
  // and fixed-point sum, and its gate logits; per (token, expert) pair that
  // leaves the rank ((R - 1) / R of them, routing taken as balanced: a rank's
  // own rows never travel): the row sent and received, the answer sent and
  // received.
  const U R = std::max<U>(1, in.ranks);
  const U per_token = saturating_add(saturating_mul(H, 4 + 4 + 4 + 8), saturating_mul(E, kF32));
  const U per_pair = saturating_mul({2, H, 4 + 8});
  const U travelling = saturating_mul({in.tokens, k, R - 1}) / R;
  add(kBuffers,
      fmt::format("step buffers: {} tokens per rank x [model].hidden {} (rows, sums, and the rows and answers of "
                  "{} of their {} experts per token on other ranks)",
                  in.tokens, H, travelling, k),
      fmt::format("{}, [model].hidden, [model].top_k", in.tokens_key),
      saturating_add(saturating_mul(in.tokens, per_token), saturating_mul(travelling, per_pair)));
  // The rows of one expert call, their outputs, and the FFN's [rows, 2F] scratch.
  const U call_rows = std::min(kCallRows, std::max<U>(1, saturating_mul(in.tokens, k)));
  add(kBuffers,
      fmt::format("expert call scratch: {} rows x (2 x [model].ffn {} + 2 x [model].hidden {}) x 4 bytes", call_rows,
                  F, H),
      fmt::format("[model].ffn, [model].hidden, {}", in.tokens_key),
      saturating_mul({call_rows, saturating_add(saturating_mul(2, F), saturating_mul(2, H)), kF32}));

  // Migration: slots travel as flat fp32 arrays (or the held format off the
  // CPU path) through a registered window holding the incoming ones and the
  // staged outgoing ones; the arrivals are installed before the departures
  // are released.
  if (in.migration_in || in.migration_out) {
    const U slot = slot_bytes(in);
    add(kMigration,
        fmt::format("migration window: {} incoming + {} outgoing slots x {} bytes{}", in.migration_in,
                    in.migration_out, slot, in.keep_window ? " (kept for the next migration: [migration].keep_window)" : ""),
        "[migration].memory_mb caps the incoming slots; fewer moves per migration (moectl --max-moves)",
        saturating_mul(saturating_add(in.migration_in, in.migration_out), slot));
    if (in.migration_out && in.maps_peer_windows)
      add(kMigration,
          fmt::format("peer windows mapped: {} slots a source writes into its destinations' windows over shared "
                      "memory (counted in its resident memory too)",
                      in.migration_out),
          "fewer moves per migration (moectl --max-moves)", saturating_mul(in.migration_out, slot));
    if (in.migration_in)
      add(kMigration,
          fmt::format("migration arrivals: {} slots installed before the departures are released", in.migration_in),
          "fewer moves per migration (moectl --max-moves)", saturating_mul(in.migration_in, slot));
  }

  // Statistics and traces.
  if (in.stats) {
    const U one = stats_bytes(L, E, in.stats_sample_tokens, k);
    add(kStats,
        fmt::format("routing statistics: {} layers x {} experts (loads, pairs, affinity) + {} sampled tokens, "
                    "and the copy merged at a gather",
                    L, E, in.stats_sample_tokens),
        "[stats].sample_tokens, or [stats].half_life_steps = 0 to turn them off", saturating_mul(2, one));
    if (in.gathers_stats)
      add(kStats,
          fmt::format("gathered statistics: the last merged copy (admin socket) and the one being written, "
                      "{} sampled tokens",
                      in.gathered_sample_tokens),
          "[stats].sample_tokens, [stats].file",
          saturating_mul(2, stats_bytes(L, E, in.gathered_sample_tokens, k)));
  }
  if (in.load_window_steps)
    add(kStats,
        fmt::format("expert load window: [metrics].load_window_steps {} x {} layers x {} experts x 8 bytes",
                    in.load_window_steps, L, E),
        "[metrics].load_window_steps", saturating_mul({in.load_window_steps, L, E, 8}));
  if (in.trace_tokens)
    add(kStats,
        fmt::format("replayed trace: {} tokens x {} layers x ({} choices x 8 + 8) bytes", in.trace_tokens, L, k),
        "[workload].trace", saturating_mul({in.trace_tokens, L, saturating_add(saturating_mul(k, 8), 8)}));

  if (in.process_bytes) add(kProcess, in.process_what, "", in.process_bytes);
  return e;
}

MemoryPhases phases(const MemoryEstimate& e) {
  MemoryPhases p;
  const U load = 0, buffers = e.group_total(kBuffers), migration = e.group_total(kMigration);
  p.after_load = e.total() - load - buffers - migration;
  p.load_peak = saturating_add(p.after_load, load);
  p.serving = saturating_add(p.after_load, buffers);
  p.migrating = saturating_add(p.serving, migration);
  return p;
}

std::optional<int> fewest_ranks(const std::function<MemoryEstimate(int)>& largest_rank, std::uint64_t budget,
                                int max_ranks) {
  for (int r = 1; r <= max_ranks; ++r)
    if (largest_rank(r).total() <= budget) return r;
  return std::nullopt;
}

}  // namespace moed::placement

namespace moed::placement {

std::uint64_t parse_memory_size(const std::string& text, const std::string& flag) {
  struct Unit {
    const char* suffix;
    double bytes;
  };
  static const Unit units[] = {{"GiB", 1073741824.0}, {"GB", 1e9}, {"G", 1073741824.0}, {"MiB", 1048576.0},
                               {"MB", 1e6},           {"M", 1048576.0}, {"TiB", 1099511627776.0}, {"TB", 1e12},
                               {"", 1073741824.0}};
  for (const Unit& u : units) {
    const std::string suffix = u.suffix;
    if (text.size() <= suffix.size() || text.compare(text.size() - suffix.size(), suffix.size(), suffix) != 0)
      continue;
    const std::string number = text.substr(0, text.size() - suffix.size());
    double value = 0;
    auto [ptr, ec] = std::from_chars(number.data(), number.data() + number.size(), value);
    if (ec != std::errc() || ptr != number.data() + number.size() || !(value > 0) || value * u.bytes > 1e18) break;
    return std::uint64_t(value * u.bytes);
  }
  MOED_THROW(Usage, "{} {}: expected a size such as 80 or 80GiB (GiB), 141GB (10^9 bytes) or 512MiB", flag,
             quote_input(text));
}

std::vector<SlotGroup> slot_groups(const Placement& placement, int rank) {
  std::map<std::uint64_t, std::uint64_t> by_shards;
  for (int l = 0; l < placement.layers(); ++l)
    for (int e = 0; e < placement.experts(); ++e)
      if (placement.shard_on(l, e, rank) >= 0) ++by_shards[std::uint64_t(std::max(1, placement.shards(l, e)))];
  std::vector<SlotGroup> out;
  for (const auto& [shards, count] : by_shards) out.push_back({count, shards});
  return out;
}

}  // namespace moed::placement
