#include "runtime/control/control_views.h"

namespace moed::runtime {

using nlohmann::json;

json predicted_json(const placement::Cost& now, const placement::Cost& after) {
  auto pair = [](double a, double b) { return json{{"now", a}, {"after", b}}; };
  return {{"cross_island_copies_per_token",
           pair(now.cross_island_copies_per_token, after.cross_island_copies_per_token)},
          {"same_island_copies_per_token",
           pair(now.same_island_copies_per_token, after.same_island_copies_per_token)},
          {"max_mean_rank_load", pair(now.max_mean_rank_load, after.max_mean_rank_load)},
          {"link_cost_per_token", pair(now.link_cost_per_token, after.link_cost_per_token)}};
}

json placement_json(const placement::Placement& p, const LayerNumbers& numbers, ExpertGroups groups,
                    const SlotFormat& slot) {
  json layers = json::array(), split = json::array(), replicas = json::array(), shards = json::array(),
       shard_bytes = json::object();
  for (int l = 0; l < p.layers(); ++l) {
    json experts = json::array(), split_here = json::array(), replicas_here = json::array(),
         shards_here = json::object();
    for (int e = 0; e < p.experts(); ++e) {
      experts.push_back(p.replicas(l, e));
      if (p.sharded(l, e)) {
        split_here.push_back(e);
        json copies = json::array();
        for (int c = 0; c < p.copies(l, e); ++c) {
          const std::span<const int> ranks = p.copy(l, e, c);
          copies.push_back(std::vector<int>(ranks.begin(), ranks.end()));
        }
        shards_here[std::to_string(e)] = copies;
        replicas_here.push_back(json::array());
      } else {
        replicas_here.push_back(p.replicas(l, e));
      }
      if (p.sharded(l, e) && slot.bytes) shard_bytes[std::to_string(p.shards(l, e))] = slot.bytes(p.shards(l, e));
    }
    layers.push_back(experts);
    split.push_back(split_here);
    replicas.push_back(replicas_here);
    shards.push_back(shards_here);
  }
  // slots[l][e]: the ranks holding expert e of layer l: its replicas, or,
  // for an expert in split[l], its shards (each holds 1/S), copy after copy.
  // The same apart: replicas[l][e] (empty for a split expert) and
  // shards[l]["e"] (a split expert's copies, each its ranks in shard order).
  json out = {{"epoch", p.epoch()},
              {"ranks", p.ranks()},
              {"layers", p.layers()},
              {"experts", p.experts()},
              {"slots", layers},
              {"split", split},
              {"replicas", replicas},
              {"shards", shards},
              {"model_layers", numbers.all(p.layers())}};
  if (slot.bytes) out["slot"] = {{"dtype", slot.dtype}, {"bytes", slot.bytes(1)}, {"shard_bytes", shard_bytes}};
  if (groups.groups > 1)
    out["expert_groups"] = {{"groups", groups.groups}, {"kept", groups.kept}, {"size", p.experts() / groups.groups}};
  return out;
}

json stats_summary(const routing::RoutingStats& s, const LayerNumbers& numbers) {
  json layers = json::array();
  for (int l = 0; l < s.layers(); ++l) {
    int hot = 0, pa = 0, pb = s.experts() > 1 ? 1 : 0;
    double total = 0;
    for (int e = 0; e < s.experts(); ++e) {
      total += s.load(l, e);
      if (s.load(l, e) > s.load(l, hot)) hot = e;
    }
    for (int a = 0; a < s.experts(); ++a)
      for (int b = a + 1; b < s.experts(); ++b)
        if (s.coactivation(l, a, b) > s.coactivation(l, pa, pb)) pa = a, pb = b;
    const double mean = total / s.experts();
    json layer = {{"layer", numbers.model(l)},
                  {"tokens", s.tokens(l)},
                  {"hottest_expert", hot},
                  {"hottest_over_mean", mean > 0 ? s.load(l, hot) / mean : 0.0},
                  {"top_pair", {pa, pb}}};
    // Online bias balancing's biases (docs/router-policies.md), per expert.
    if (const auto& bias = s.router_bias(); !bias.empty())
      layer["router_bias"] = std::vector<double>(bias.begin() + std::ptrdiff_t(l) * s.experts(),
                                                 bias.begin() + std::ptrdiff_t(l + 1) * s.experts());
    layers.push_back(std::move(layer));
  }
  return {{"steps", s.steps()}, {"half_life_steps", s.half_life_steps()},
          {"sample_tokens", s.sample_size()}, {"per_layer", layers}};
}

json migration_json(const MigrationRecord* record, const LayerNumbers& numbers) {
  if (!record) return nullptr;
  const MigrationRecord& m = *record;
  json j = {{"id", m.id},       {"state", state_name(m.state)}, {"why", m.why},   {"bytes", m.bytes},
            {"done_bytes", m.done}, {"moves", m.moves.size()}};
  if (!m.moves.empty()) {
    j["layer"] = numbers.model(m.moves[0].layer);
    j["expert"] = m.moves[0].expert;
    j["from"] = m.moves[0].from;
    j["to"] = m.moves[0].to;
  }
  if (!m.error.empty()) j["error"] = m.error;
  j["transfer_s"] = m.transfer_seconds;
  if (m.transfer_seconds > 0) j["transfer_gbps"] = double(m.done) / m.transfer_seconds / 1e9;
  j["steps_during"] = m.step_ms_during.count();
  if (m.step_ms_during.count()) j["step_ms_p99_during"] = m.step_ms_during.quantile(0.99);
  if (m.step_ms_before.count()) j["step_ms_p99_before"] = m.step_ms_before.quantile(0.99);
  return j;
}

}  // namespace moed::runtime
