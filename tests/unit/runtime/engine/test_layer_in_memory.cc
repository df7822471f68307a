// A whole layer simulated in memory from the pure parts (dispatch_plan.h,
// wire_format.h, chunk_schedule.h, the ExpertExecutor), over 1 to 6 ranks in
// 1 to 3 islands: every token travels once to each rank of its experts, by
// the route the plan says, the tasks follow the chunk rule, and the output
// bits are the same for every placement and either route, narrowed against
// a one-rank run at full width; traffic by link class, flat against
// hierarchical, counted by hand.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common/rng.h"
#include "kernels/cpu/expert_ffn.h"
#include "kernels/cpu/fixed_combine.h"
#include "placement/placement.h"
#include "placement/topology.h"
#include "runtime/config/config.h"
#include "runtime/engine/chunk_schedule.h"
#include "runtime/engine/dispatch_plan.h"
#include "runtime/engine/cpu_expert_executor.h"
#include "runtime/engine/wire_format.h"
#include "runtime/router/router.h"
#include "runtime/weights/expert_store.h"
#include "tests/unit/runtime/engine/plan_test_support.h"

namespace moed::runtime {
namespace {

using placement::LinkClass;
using placement::Placement;
using placement::Topology;

// ---------------------------------------------------------------- a layer in memory

// A received pair: the message's source, its row and its pair.
struct ExpertRowRef {
  std::uint32_t source, row, pair;
};

// One exchange of a layer (hop 1 or hop 2), both ways, on one rank.
struct Hop {
  std::vector<std::byte> send, recv, back_send, back_recv;
  comm::ExchangeLayout out, back;
  ReceivedRows received;
};

// One rank's side of one layer.
struct RankSide {
  std::size_t start = 0;    // index of its token 0 among the global tokens
  std::uint64_t first = 0;  // global id of its token 0
  std::size_t count = 0;
  Routing routing;
  std::vector<float> x;     // its tokens' rows
  DispatchPlan plan;
  Hop hop1, hop2;
  ChunkSchedule schedule;
  // [slot][home]: the pairs received for that expert from that home, in arrival order.
  std::vector<std::vector<std::vector<ExpertRowRef>>> rows;
  GatewayAnswers gateway;
  std::vector<std::int64_t> acc;
};

// What went over each link class: rows per hop, bytes each way (an empty batch is no
// message, as in the engine).
struct Traffic {
  std::size_t rows[2][placement::kLinkClasses] = {};  // [hop 1, hop 2][link class]
  std::size_t dispatch_bytes[placement::kLinkClasses] = {};
  std::size_t combine_bytes[placement::kLinkClasses] = {};
};
constexpr int kSameRank = int(LinkClass::SameRank), kSameIsland = int(LinkClass::SameIsland),
              kCross = int(LinkClass::CrossIsland);

struct LayerRun {
  int ranks;
  int layer;
  int hidden;
  std::uint64_t chunk_rows, step;
  const Placement* placement;
  const Topology* topology;
  bool hierarchical;
  ExpertCounts counts;
  std::vector<RankSide> side;
  Traffic traffic;
  bool share_small_experts = false;  // PlanInput's

  // As the engine: two hops when hierarchical and there is more than one island.
  bool two_hops() const { return hierarchical && topology->islands() > 1; }
  PlanInput input(int r) const {
    PlanInput in{&side[r].routing, placement, layer, &counts, r, chunk_rows, step, topology, hierarchical,
                 side[r].first};
    in.share_small_experts = share_small_experts;
    return in;
  }
};

// An all-to-all-v in memory over `hop` (dispatch, or its answers when `back`): block d of
// rank s's send lands in rank d's receive buffer, blocks in source order. Fills the receive
// halves of the layouts and counts the bytes by link class.
void all_to_all(LayerRun& run, Hop RankSide::*hop, bool back) {
  const std::size_t R = run.side.size();
  auto send = [&](std::size_t r) -> const std::vector<std::byte>& {
    return back ? (run.side[r].*hop).back_send : (run.side[r].*hop).send;
  };
  auto layout = [&](std::size_t r) -> comm::ExchangeLayout& {
    return back ? (run.side[r].*hop).back : (run.side[r].*hop).out;
  };
  std::size_t* bytes = back ? run.traffic.combine_bytes : run.traffic.dispatch_bytes;
  for (std::size_t d = 0; d < R; ++d) {
    comm::ExchangeLayout& in = layout(d);
    in.recv_bytes.assign(R, 0);
    for (std::size_t s = 0; s < R; ++s) {
      in.recv_bytes[s] = layout(s).send_bytes[d];
      bytes[int(run.topology->link(int(s), int(d)))] += in.recv_bytes[s];
    }
    in.recv_offsets = comm::ExchangeLayout::prefix_offsets(in.recv_bytes);
    std::vector<std::byte>& recv = back ? (run.side[d].*hop).back_recv : (run.side[d].*hop).recv;
    recv.assign(in.recv_total(), std::byte{0});
    for (std::size_t s = 0; s < R; ++s)
      if (in.recv_bytes[s])
        std::memcpy(recv.data() + in.recv_offsets[s], send(s).data() + layout(s).send_offsets[d],
                    in.recv_bytes[s]);
  }
}

void count_rows(LayerRun& run, std::vector<RowBatch> DispatchPlan::*hop, int which) {
  for (int s = 0; s < run.ranks; ++s)
    for (int d = 0; d < run.ranks; ++d)
      run.traffic.rows[which][int(run.topology->link(s, d))] += (run.side[s].plan.*hop)[d].rows();
}

// Global tokens: rows and routing. The routing of a token is its own: the same whatever
// rank it sits on.
struct Tokens {
  std::size_t count;
  int hidden, experts;
  std::vector<float> x;
  Routing routing;
};

Tokens make_tokens(std::size_t n, int hidden, int experts, int top_k, std::uint64_t seed) {
  Tokens t{n, hidden, experts, {}, {}};
  CounterRng rng(seed);
  t.x.resize(n * hidden);
  for (std::size_t i = 0; i < t.x.size(); ++i) t.x[i] = 2.0f * rng.normalish(i);
  CounterRng lrng(seed + 1);
  std::vector<float> logits(n * experts);
  for (std::size_t i = 0; i < logits.size(); ++i) logits[i] = 2.0f * lrng.normalish(i);
  RouterParams p;
  p.top_k = top_k;
  route(logits.data(), n, experts, p, t.routing);
  return t;
}

// The home rank of a token key.
int home_of(const LayerRun& run, std::uint64_t key) {
  for (int h = 0; h < run.ranks; ++h)
    if (key >= run.side[h].first && key < run.side[h].first + run.side[h].count) return h;
  ADD_FAILURE() << "token " << key << " has no home";
  return 0;
}

// As LayerPass does: the schedule from the counts, then each received pair filed under
// its expert and home in arrival order; what arrived must be what the schedule expects.
void file_rows_by_home(LayerRun& run, int r, bool split_by_home) {
  RankSide& s = run.side[r];
  s.schedule = schedule_chunks(run.input(r), split_by_home);
  std::vector<int> slot_of(std::size_t(run.counts.experts()), -1);
  for (std::size_t i = 0; i < s.schedule.experts.size(); ++i) slot_of[s.schedule.experts[i]] = int(i);
  s.rows.assign(s.schedule.experts.size(), std::vector<std::vector<ExpertRowRef>>(std::size_t(run.ranks)));
  for (std::uint32_t src = 0; src < s.hop2.received.from.size(); ++src) {
    const auto& f = s.hop2.received.from[src];
    for (std::uint32_t row = 0; row < f.rows; ++row)
      for (std::uint32_t p = f.first_pair[row]; p < f.first_pair[row] + f.pairs_per_row[row]; ++p) {
        ASSERT_GE(slot_of[f.experts[p]], 0) << "rank " << r << " got expert " << f.experts[p];
        s.rows[slot_of[f.experts[p]]][home_of(run, f.token[row])].push_back({src, row, p});
      }
  }
  for (std::size_t slot = 0; slot < s.rows.size(); ++slot)
    for (int h = 0; h < run.ranks; ++h)
      EXPECT_EQ(s.rows[slot][h].size(), s.schedule.rows_from[slot][h])
          << "rank " << r << " expert " << s.schedule.experts[slot] << " home " << h;
  // The tasks, taken in order, give each home's rows in order, once each.
  std::vector<std::vector<std::uint32_t>> next(s.rows.size(), std::vector<std::uint32_t>(std::size_t(run.ranks), 0));
  for (const ExpertTask& t : s.schedule.tasks) {
    std::uint32_t rows = 0;
    for (const TaskSegment& seg : t.segments) {
      EXPECT_EQ(seg.first, next[t.slot][seg.home]);
      next[t.slot][seg.home] += seg.rows;
      rows += seg.rows;
    }
    EXPECT_EQ(rows, t.rows);
  }
  for (std::size_t slot = 0; slot < s.rows.size(); ++slot)
    EXPECT_EQ(next[slot], s.schedule.rows_from[slot]) << "rank " << r;
}

// Every rank could size its receives from the counts: the pairs each home sent each rank.
void check_pairs_to_ranks(const LayerRun& run) {
  for (int h = 0; h < run.ranks; ++h) {
    std::vector<std::uint64_t> arrived(std::size_t(run.ranks), 0);
    for (int d = 0; d < run.ranks; ++d)
      for (const auto& f : run.side[d].hop2.received.from)
        for (std::uint32_t row = 0; row < f.rows; ++row)
          if (home_of(run, f.token[row]) == h) arrived[d] += f.pairs_per_row[row];
    for (int r = 0; r < run.ranks; ++r)
      EXPECT_EQ(pairs_to_ranks(run.input(r), h), arrived) << "home " << h << " as planned on rank " << r;
  }
}

// Splits the global tokens evenly by rank (as the engine does; global id = step * count +
// index, as the engine's) and runs plan, [pack, exchange, parse and forward hop 1], pack,
// exchange, parse and batch hop 2 on every rank.
LayerRun dispatch_layer(const Tokens& tokens, const Placement& placement, const Topology& topology,
                        bool hierarchical, int layer, std::uint64_t chunk_rows, std::uint64_t step,
                        bool split_by_home = false, bool share_small_experts = false) {
  const int R = placement.ranks(), H = tokens.hidden, E = tokens.experts;
  EXPECT_EQ(topology.ranks(), R);
  LayerRun run{R, layer, H, chunk_rows, step, &placement, &topology, hierarchical,
               ExpertCounts(R, E), std::vector<RankSide>(R), {}, share_small_experts};
  for (int r = 0; r < R; ++r) {
    RankSide& s = run.side[r];
    s.start = tokens.count * r / R;
    s.first = step * tokens.count + s.start;
    s.count = tokens.count * (r + 1) / R - s.start;
    s.x.assign(tokens.x.begin() + s.start * H, tokens.x.begin() + (s.start + s.count) * H);
    for (std::size_t t = 0; t < s.count; ++t) {
      auto e = tokens.routing.experts_of(s.start + t);
      auto w = tokens.routing.weights_of(s.start + t);
      for (std::size_t i = 0; i < e.size(); ++i) s.routing.add(e[i], w[i]);
      s.routing.end_token();
    }
    const std::vector<std::uint32_t> mine = ExpertCounts::local(s.routing, E);
    std::memcpy(run.counts.data() + std::size_t(r) * E, mine.data(), E * sizeof(std::uint32_t));
  }
  for (int r = 0; r < R; ++r) run.side[r].plan = plan_dispatch(run.input(r), run.side[r].x.data(), H);
  if (run.two_hops()) {
    count_rows(run, &DispatchPlan::hop1, 0);
    for (RankSide& s : run.side) pack_rows(s.plan.hop1, H, s.hop1.send, s.hop1.out);
    all_to_all(run, &RankSide::hop1, false);
    for (RankSide& s : run.side) {
      s.hop1.received = parse_rows(s.hop1.recv.data(), s.hop1.out, H);
      plan_forward(s.hop1.received, H, s.plan);
    }
  }
  count_rows(run, &DispatchPlan::hop2, 1);
  for (RankSide& s : run.side) pack_rows(s.plan.hop2, H, s.hop2.send, s.hop2.out);
  all_to_all(run, &RankSide::hop2, false);
  for (int r = 0; r < R; ++r) {
    RankSide& s = run.side[r];
    s.hop2.received = parse_rows(s.hop2.recv.data(), s.hop2.out, H);
    file_rows_by_home(run, r, split_by_home);
  }
  check_pairs_to_ranks(run);
  return run;
}

// Every expert of a model shape in one store, shared by the simulated ranks: an expert's
// weights are the synthetic model's whichever rank holds it.
const ExpertStore& all_experts(int layers, int experts, int hidden) {
  static std::map<std::tuple<int, int, int>, ExpertStore> stores;
  const std::tuple key{layers, experts, hidden};
  auto it = stores.find(key);
  if (it == stores.end()) {
    Config c = default_config();
    c.model.layers = layers;
    c.model.experts = experts;
    c.model.top_k = 1;
    c.model.hidden = hidden;
    c.model.ffn = 5;
    it = stores.emplace(key, ExpertStore::load(c, placement::contiguous(1, layers, experts), 0)).first;
  }
  return it->second;
}

// The hop-2 answers, written by the ExpertExecutor: one answer per received row, task by
// task (fp32 unweighted for a single pair, fixed-point weighted sums otherwise), then
// narrowed when `narrow`.
void run_experts(RankSide& s, const LayerRun& run, bool narrow) {
  const int H = run.hidden;
  const ReceivedRows& received = s.hop2.received;
  comm::ExchangeLayout& layout = s.hop2.back;
  layout.send_bytes = combine_message_bytes(received, AnswerFormat(H));
  layout.send_offsets = comm::ExchangeLayout::prefix_offsets(layout.send_bytes);
  s.hop2.back_send.resize(layout.send_total());
  std::vector<std::vector<std::size_t>> row_at(received.from.size());
  for (std::size_t src = 0; src < received.from.size(); ++src) {
    const ReceivedRows::Source& from = received.from[src];
    lay_out_answers(s.hop2.back_send.data() + layout.send_offsets[src], from.pairs_per_row, from.rows, AnswerFormat(H));
    std::size_t at = layout.send_offsets[src];
    for (std::uint32_t row = 0; row < from.rows; ++row) {
      const bool single = from.pairs_per_row[row] == 1;
      row_at[src].push_back(at + (single ? 0 : kFixedRowHeaderBytes));
      at += combine_row_bytes(from.pairs_per_row[row], AnswerFormat(H));
    }
  }
  const ExpertStore& store = all_experts(run.placement->layers(), run.counts.experts(), H);
  CpuExpertExecutor executor;
  std::vector<ExpertRow> rows;
  for (const ExpertTask& t : s.schedule.tasks) {
    rows.clear();
    for (const TaskSegment& seg : t.segments)
      for (std::uint32_t k = seg.first; k < seg.first + seg.rows; ++k) {
        const ExpertRowRef& row = s.rows[t.slot][seg.home][k];
        const auto& src = received.from[row.source];
        rows.push_back({src.data + std::size_t(row.row) * H, s.hop2.back_send.data() + row_at[row.source][row.row],
                        src.weights[row.pair], src.pairs_per_row[row.row] == 1});
      }
    EXPECT_EQ(executor.run(store.expert(run.layer, s.schedule.experts[t.slot]), rows).saturated, 0u) << "saturated";
  }
  if (!narrow) return;
  for (std::size_t src = 0; src < received.from.size(); ++src)
    layout.send_bytes[src] = narrow_answers(s.hop2.back_send.data() + layout.send_offsets[src],
                                            received.from[src].pairs_per_row, received.from[src].rows, AnswerFormat(H));
}

// What a sender gets back: its full-width answers' size, or less once narrowed.
void expect_answer_bytes(const std::vector<std::size_t>& got, const std::vector<std::size_t>& full, bool narrow) {
  if (!narrow) {
    EXPECT_EQ(got, full);
    return;
  }
  ASSERT_EQ(got.size(), full.size());
  for (std::size_t i = 0; i < got.size(); ++i) EXPECT_LE(got[i], full[i]) << "from rank " << i;
}

// The whole layer: dispatch, experts, hop-2 answers into homes and gateways,
// [hop-1 answers into homes], residual. Returns the global outputs; `traffic` gets the counts.
// `narrow`: answers travel narrowed, as the engine sends them by default.
std::vector<float> run_layer(const Tokens& tokens, const Placement& placement, const Topology& topology,
                             bool hierarchical, int layer, std::uint64_t chunk_rows, std::uint64_t step,
                             Traffic* traffic = nullptr, bool narrow = true, bool share_small_experts = false) {
  LayerRun run = dispatch_layer(tokens, placement, topology, hierarchical, layer, chunk_rows, step,
                                /*split_by_home=*/false, share_small_experts);
  const int H = tokens.hidden;
  for (RankSide& s : run.side) run_experts(s, run, narrow);
  all_to_all(run, &RankSide::hop2, true);
  for (RankSide& s : run.side) {
    // What a sender expects back agrees with what the experts sent.
    expect_answer_bytes(s.hop2.back.recv_bytes, combine_message_bytes(s.plan.hop2, AnswerFormat(H)), narrow);
    if (run.two_hops()) s.gateway = prepare_gateway_answers(s.hop1.received, AnswerFormat(H));
    s.acc.assign(s.count * H, 0);
    EXPECT_EQ(accumulate_answers(s.plan.hop2, s.hop2.back_recv.data(), s.hop2.back, AnswerFormat(H), s.acc.data(),
                                 run.two_hops() ? &s.gateway : nullptr),
              0u);
  }
  if (run.two_hops()) {
    for (RankSide& s : run.side) {
      if (narrow) narrow_gateway_answers(s.gateway, AnswerFormat(H));
      s.hop1.back_send = s.gateway.send;
      s.hop1.back = s.gateway.layout;
    }
    all_to_all(run, &RankSide::hop1, true);
    for (RankSide& s : run.side) {
      expect_answer_bytes(s.hop1.back.recv_bytes, combine_message_bytes(s.plan.hop1, AnswerFormat(H)), narrow);
      EXPECT_EQ(
          accumulate_answers(s.plan.hop1, s.hop1.back_recv.data(), s.hop1.back, AnswerFormat(H), s.acc.data(), nullptr),
          0u);
    }
  }
  std::vector<float> out(tokens.count * H);
  for (RankSide& s : run.side)
    kernels::residual_from_fixed(s.x.data(), s.acc.data(), s.count * H, out.data() + s.start * H);
  if (traffic) *traffic = run.traffic;
  return out;
}

// The placements and topologies the layer is checked under; layer 1 of 2 is the one served.
struct PlacementCase {
  const char* name;
  std::function<Placement()> make;
  std::vector<int> island_of_rank;
  Topology topology() const { return Topology(island_of_rank); }
};

constexpr int kExperts = 6, kLayers = 2, kLayer = 1;

Placement everywhere_thrice() {
  // 4 ranks, each expert on three of them, replica order rotating.
  Placement p(4, kLayers, kExperts);
  for (int l = 0; l < kLayers; ++l)
    for (int e = 0; e < kExperts; ++e) p.set_replicas(l, e, {e % 4, (e + 1) % 4, (e + 2) % 4});
  return p;
}

const std::vector<PlacementCase>& placement_cases() {
  using placement::add_random_replicas, placement::contiguous, placement::shuffled;
  static const std::vector<PlacementCase> cases = {
      {"OneRank", [] { return contiguous(1, kLayers, kExperts); }, {0}},
      {"ThreeRanksOneIsland", [] { return contiguous(3, kLayers, kExperts); }, {0, 0, 0}},
      {"ThreeRanksShuffledWithReplicas",
       [] { return add_random_replicas(shuffled(3, kLayers, kExperts, 17), 4, 5); }, {0, 0, 1}},
      {"FourRanksTwoIslandsContiguous", [] { return contiguous(4, kLayers, kExperts); }, {0, 0, 1, 1}},
      {"FourRanksTwoIslandsShuffled", [] { return shuffled(4, kLayers, kExperts, 23); }, {0, 0, 1, 1}},
      {"FourRanksTwoIslandsShuffledWithReplicas",
       [] { return add_random_replicas(shuffled(4, kLayers, kExperts, 23), 4, 7); }, {0, 0, 1, 1}},
      {"FourRanksThreeReplicasEach", everywhere_thrice, {0, 0, 1, 1}},
      // Ranks 3 and 4 hold no expert: island 1 only sends.
      {"FiveRanksUnevenIslandsSomeWithoutExperts", [] { return contiguous(5, kLayers, kExperts); },
       {0, 0, 0, 1, 1}},
      {"SixRanksThreeIslandsContiguous", [] { return contiguous(6, kLayers, kExperts); },
       {0, 0, 1, 1, 2, 2}},
      {"SixRanksThreeIslandsShuffled", [] { return shuffled(6, kLayers, kExperts, 29); },
       {0, 0, 1, 1, 2, 2}},
      {"SixRanksThreeIslandsShuffledWithReplicas",
       [] { return add_random_replicas(shuffled(6, kLayers, kExperts, 31), 6, 11); }, {0, 0, 1, 1, 2, 2}},
      {"SixRanksTwoIslandsOfThreeWithReplicas",
       [] { return add_random_replicas(shuffled(6, kLayers, kExperts, 37), 5, 13); }, {0, 0, 0, 1, 1, 1}},
  };
  return cases;
}

bool has_replicas(const Placement& p, int layer) {
  for (int e = 0; e < p.experts(); ++e)
    if (p.replicas(layer, e).size() > 1) return true;
  return false;
}

TEST(PlacementCases, ReplicaCasesReallyHaveReplicas) {
  // Otherwise the replica paths of the layer tests would not be exercised.
  for (const auto& c : placement_cases()) {
    const std::string name = c.name;
    EXPECT_EQ(has_replicas(c.make(), kLayer), name.find("Replica") != std::string::npos) << name;
    EXPECT_NO_THROW(c.make().validate(c.name));
    EXPECT_EQ(c.topology().ranks(), c.make().ranks()) << name;
  }
}

// 37 tokens, top-3 of 6 experts, H = 7 (odd: padded rows), chunks of 3 rows, step 5.
const Tokens& layer_tokens() {
  static const Tokens tokens = make_tokens(37, 7, kExperts, 3, 99);
  return tokens;
}
constexpr std::uint64_t kChunk = 3, kStep = 5;

class LayerInMemory : public ::testing::TestWithParam<std::tuple<std::size_t, bool>> {
 protected:
  const PlacementCase& which() const { return placement_cases()[std::get<0>(GetParam())]; }
  bool hierarchical() const { return std::get<1>(GetParam()); }
  LayerRun dispatch() const {
    return dispatch_layer(tokens, p, topology, hierarchical(), kLayer, kChunk, kStep);
  }
  const Tokens& tokens = layer_tokens();
  const Placement p = which().make();
  const Topology topology = which().topology();
};

std::string case_name(const ::testing::TestParamInfo<std::tuple<std::size_t, bool>>& info) {
  return std::string(placement_cases()[std::get<0>(info.param)].name) +
         (std::get<1>(info.param) ? "Hierarchical" : "Flat");
}

TEST_P(LayerInMemory, CombineSizesAgreeOnBothSides) {
  LayerRun run = dispatch();
  const int H = tokens.hidden;
  for (int r = 0; r < run.ranks; ++r)
    for (int s = 0; s < run.ranks; ++s) {
      EXPECT_EQ(combine_message_bytes(run.side[r].hop2.received, AnswerFormat(H))[s],
                combine_message_bytes(run.side[s].plan.hop2, AnswerFormat(H))[r])
          << "hop 2: rank " << r << " answering rank " << s;
      if (run.two_hops()) {
        EXPECT_EQ(combine_message_bytes(run.side[r].hop1.received, AnswerFormat(H))[s],
                  combine_message_bytes(run.side[s].plan.hop1, AnswerFormat(H))[r])
            << "hop 1: rank " << r << " answering rank " << s;
      }
    }
}

// Where each pair is computed, by the chunk rule: token id -> {(expert, rank)}.
std::map<std::uint64_t, std::set<std::pair<std::uint32_t, int>>> expected_pairs(const LayerRun& run,
                                                                                const Tokens& tokens) {
  std::map<std::uint64_t, std::set<std::pair<std::uint32_t, int>>> want;
  std::vector<std::uint64_t> position(tokens.experts, 0);
  const std::uint64_t base = run.step * tokens.count;
  for (std::size_t t = 0; t < tokens.count; ++t)
    for (std::uint32_t e : tokens.routing.experts_of(t)) {
      const std::uint64_t chunk = position[e]++ / run.chunk_rows;
      const int rank = run.placement->replicas(run.layer, int(e))[chunk_replica(run.input(0), int(e), chunk)];
      want[base + t].emplace(e, rank);
    }
  return want;
}

TEST_P(LayerInMemory, EveryTokenTravelsOnceToEachRankOfItsExperts) {
  LayerRun run = dispatch();
  const auto want = expected_pairs(run, tokens);
  // What arrived in hop 2, from homes and gateways alike: at most one row per (token, rank).
  std::map<std::uint64_t, std::set<std::pair<std::uint32_t, int>>> got;
  std::set<std::pair<std::uint64_t, int>> rows;
  std::size_t pairs = 0;
  for (int d = 0; d < run.ranks; ++d)
    for (const auto& src : run.side[d].hop2.received.from)
      for (std::uint32_t r = 0; r < src.rows; ++r) {
        EXPECT_TRUE(rows.emplace(src.token[r], d).second)
            << "token " << src.token[r] << " twice at rank " << d;
        for (std::uint32_t q = src.first_pair[r]; q < src.first_pair[r] + src.pairs_per_row[r]; ++q) {
          EXPECT_EQ(src.dests[q], std::uint32_t(d));
          got[src.token[r]].emplace(src.experts[q], d);
          ++pairs;
        }
      }
  EXPECT_EQ(got, want);
  EXPECT_EQ(pairs, tokens.routing.pairs());
  // Each home's rows of its own tokens, per destination, are in token order with
  // token = first + origin.
  for (const RankSide& s : run.side)
    for (const auto* hop : {&s.plan.hop1, &s.plan.hop2})
      for (const RowBatch& b : *hop) {
        std::int64_t last = -1;
        for (std::size_t r = 0; r < b.rows(); ++r) {
          if (b.origin[r] < 0) continue;
          EXPECT_GT(b.origin[r], last);
          last = b.origin[r];
          EXPECT_EQ(b.token[r], s.first + std::uint64_t(b.origin[r]));
        }
      }
}

TEST_P(LayerInMemory, RowsGoOnlyWhereTheRouteSays) {
  LayerRun run = dispatch();
  const Topology& t = topology;
  for (int s = 0; s < run.ranks; ++s) {
    const DispatchPlan& plan = run.side[s].plan;
    for (int d = 0; d < run.ranks; ++d) {
      const bool cross = t.island_of(s) != t.island_of(d);
      if (!run.two_hops()) {
        EXPECT_EQ(plan.hop1[d].rows(), 0u) << "flat: no hop 1, rank " << s << " to " << d;
        continue;
      }
      // Hop 1 only to the gateways of remote islands; one row per (token, remote island).
      if (plan.hop1[d].rows()) {
        EXPECT_TRUE(cross && d == gateway(t, s, t.island_of(d))) << "hop 1 from " << s << " to " << d;
      }
      for (std::size_t r = 1; r < plan.hop1[d].rows(); ++r)
        EXPECT_LT(plan.hop1[d].token[r - 1], plan.hop1[d].token[r]);
      // Hop 2 stays inside islands: the home's own rows and the forwarded ones.
      if (cross) {
        EXPECT_EQ(plan.hop2[d].rows(), 0u) << "hop 2 across islands, " << s << " to " << d;
      }
    }
  }
}

TEST_P(LayerInMemory, TasksFollowTheChunkRule) {
  LayerRun run = dispatch();
  const int H = tokens.hidden;
  const std::uint64_t base = kStep * tokens.count;
  bool split = false;  // some expert's rows divided between replicas
  for (int e = 0; e < kExperts; ++e) {
    // Expert e's pairs in global token order, by a plain walk over the global routing.
    std::vector<std::uint64_t> global;
    std::vector<float> weight;
    for (std::size_t t = 0; t < tokens.count; ++t)
      for (std::size_t i = 0; i < tokens.routing.experts_of(t).size(); ++i)
        if (tokens.routing.experts_of(t)[i] == std::uint32_t(e)) {
          global.push_back(t);
          weight.push_back(tokens.routing.weights_of(t)[i]);
        }
    EXPECT_EQ(run.counts.total(e), global.size());
    const std::vector<int>& replicas = p.replicas(kLayer, e);
    for (std::size_t k = 0; k < replicas.size(); ++k) {
      // Chunk j (rows [3j, 3j + 3)) belongs to replica chunk_replica(j) (its rule is
      // checked by hand above); on one island that is (j + step) mod R.
      std::vector<std::uint64_t> want_tokens;
      std::vector<float> want_weights;
      std::vector<std::uint32_t> want_chunks;
      for (std::size_t j = 0; j * kChunk < global.size(); ++j) {
        const std::size_t owner = chunk_replica(run.input(0), e, j);
        if (topology.islands() == 1) {
          EXPECT_EQ(owner, (j + kStep) % replicas.size());
        }
        if (owner != k) continue;
        const std::size_t end = std::min<std::size_t>(global.size(), (j + 1) * kChunk);
        want_chunks.push_back(std::uint32_t(end - j * kChunk));
        for (std::size_t q = j * kChunk; q < end; ++q) {
          want_tokens.push_back(global[q]);
          want_weights.push_back(weight[q]);
        }
      }
      const RankSide& holder = run.side[replicas[k]];
      const auto slot_it = std::find(holder.schedule.experts.begin(), holder.schedule.experts.end(), e);
      ASSERT_NE(slot_it, holder.schedule.experts.end()) << "expert " << e << " is not scheduled on rank " << replicas[k];
      const int slot = int(slot_it - holder.schedule.experts.begin());
      // The expert's rows in task order, and the tasks' sizes (whole chunks here).
      std::vector<ExpertRowRef> rows;
      std::vector<std::uint32_t> chunks;
      for (const ExpertTask& t : holder.schedule.tasks) {
        if (t.slot != slot) continue;
        chunks.push_back(t.rows);
        for (const TaskSegment& seg : t.segments)
          for (std::uint32_t q = seg.first; q < seg.first + seg.rows; ++q) rows.push_back(holder.rows[slot][seg.home][q]);
      }
      EXPECT_EQ(chunks, want_chunks) << "expert " << e << " replica " << k;
      ASSERT_EQ(rows.size(), want_tokens.size()) << "expert " << e << " replica " << k;
      split |= replicas.size() > 1 && !want_tokens.empty() && want_tokens.size() < global.size();
      for (std::size_t i = 0; i < rows.size(); ++i) {
        const ExpertRowRef& row = rows[i];
        const auto& src = holder.hop2.received.from[row.source];
        const std::uint64_t token = src.token[row.row] - base;
        EXPECT_EQ(token, want_tokens[i]) << "expert " << e << " replica " << k << " row " << i;
        EXPECT_EQ(src.experts[row.pair], std::uint32_t(e));
        EXPECT_EQ(src.weights[row.pair], want_weights[i]);
        EXPECT_EQ(std::memcmp(src.data + std::size_t(row.row) * H, tokens.x.data() + token * H,
                              H * sizeof(float)),
                  0);
      }
    }
  }
  if (has_replicas(p, kLayer)) {
    EXPECT_TRUE(split) << "no expert was split between its replicas";
  }
  // Every rank schedules exactly its local experts, ascending.
  for (int r = 0; r < run.ranks; ++r) EXPECT_EQ(run.side[r].schedule.experts, p.experts_on(kLayer, r)) << "rank " << r;
}

TEST_P(LayerInMemory, CountsThatDisagreeWithTheRowsChangeTheSchedule) {
  LayerRun run = dispatch();
  // Claim more pairs of expert 0 than were sent: 2 n more chunks (n replicas) from the last
  // rank, after every row sent. At least 2 n - 1 of them are whole and from the last rank's
  // island, so they rotate among the replicas there (among all when none is there): the
  // holder, one of those, expects rows from the last rank that never came (LayerPass
  // refuses such a layer as an Internal error when the message is filed).
  const int e = 0, last = run.ranks - 1;
  const std::vector<int>& replicas = p.replicas(kLayer, e);
  int holder = replicas[0];
  for (int r : replicas)
    if (topology.island_of(r) == topology.island_of(last)) {
      holder = r;
      break;
    }
  run.counts.data()[std::size_t(last) * kExperts + e] += std::uint32_t(2 * kChunk * replicas.size());
  const ChunkSchedule wrong = schedule_chunks(run.input(holder), false);
  const RankSide& s = run.side[holder];
  const std::size_t slot = std::size_t(
      std::find(s.schedule.experts.begin(), s.schedule.experts.end(), e) - s.schedule.experts.begin());
  EXPECT_GT(wrong.rows_from[slot][last], s.rows[slot][last].size());
}

TEST_P(LayerInMemory, OutputMatchesAPlainSum) {
  const std::vector<float> out = run_layer(tokens, p, topology, hierarchical(), kLayer, kChunk, kStep);
  const int H = tokens.hidden;
  const ExpertStore& store = all_experts(kLayers, kExperts, H);
  std::vector<float> y(H), scratch(kernels::expert_ffn_scratch(store.expert(kLayer, 0), 1));
  for (std::size_t t = 0; t < tokens.count; ++t) {
    std::vector<double> want(tokens.x.begin() + std::ptrdiff_t(t * H), tokens.x.begin() + std::ptrdiff_t((t + 1) * H));
    for (std::size_t k = 0; k < tokens.routing.experts_of(t).size(); ++k) {
      kernels::expert_ffn(store.expert(kLayer, int(tokens.routing.experts_of(t)[k])), tokens.x.data() + t * H, 1,
                          y.data(), scratch.data());
      for (int i = 0; i < H; ++i) want[i] += double(tokens.routing.weights_of(t)[k]) * y[i];
    }
    for (int i = 0; i < H; ++i)
      EXPECT_NEAR(out[t * H + i], want[i], 1e-5 * (1 + std::abs(want[i]))) << "token " << t << " element " << i;
  }
}

TEST_P(LayerInMemory, OutputBitsEqualTheOneRankRun) {
  const PlacementCase& one = placement_cases()[0];
  // At full width; every other case narrows its answers.
  const std::vector<float> reference =
      run_layer(tokens, one.make(), one.topology(), false, kLayer, kChunk, kStep, nullptr, false);
  const std::vector<float> here = run_layer(tokens, p, topology, hierarchical(), kLayer, kChunk, kStep);
  ASSERT_EQ(reference.size(), here.size());
  for (std::size_t i = 0; i < reference.size(); ++i)
    ASSERT_EQ(std::bit_cast<std::uint32_t>(reference[i]), std::bit_cast<std::uint32_t>(here[i]))
        << "token " << i / tokens.hidden << " element " << i % tokens.hidden;
}

// Decode-sized steps: chunks of 64 rows, more than any expert gets here, so
// each expert is one chunk, which goes whole to one replica. With
// share_small_experts a replicated expert's rows are cut into one chunk per
// replica instead: more ranks compute each replicated expert, and the bits
// are still those of one rank.
TEST_P(LayerInMemory, SmallExpertsSharedByTheirReplicasKeepTheBits) {
  constexpr std::uint64_t kDecodeChunk = 64;
  const PlacementCase& one = placement_cases()[0];
  const std::vector<float> reference =
      run_layer(tokens, one.make(), one.topology(), false, kLayer, kDecodeChunk, kStep, nullptr, false);
  const std::vector<float> here =
      run_layer(tokens, p, topology, hierarchical(), kLayer, kDecodeChunk, kStep, nullptr, true, true);
  ASSERT_EQ(reference.size(), here.size());
  for (std::size_t i = 0; i < reference.size(); ++i)
    ASSERT_EQ(std::bit_cast<std::uint32_t>(reference[i]), std::bit_cast<std::uint32_t>(here[i]))
        << "token " << i / tokens.hidden << " element " << i % tokens.hidden;
  // Ranks computing rows of each expert, chunks whole and shared.
  auto computing = [&](bool share) {
    const LayerRun run =
        dispatch_layer(tokens, p, topology, hierarchical(), kLayer, kDecodeChunk, kStep, false, share);
    std::vector<std::set<int>> ranks(static_cast<std::size_t>(kExperts));
    for (int r = 0; r < run.ranks; ++r) {
      const ChunkSchedule schedule = schedule_chunks(run.input(r), false);
      for (const ExpertTask& t : schedule.tasks)
        if (t.rows) ranks[std::size_t(schedule.experts[std::size_t(t.slot)])].insert(r);
    }
    return ranks;
  };
  const auto whole = computing(false), shared = computing(true);
  std::size_t more = 0;
  for (int e = 0; e < kExperts; ++e) {
    EXPECT_LE(whole[std::size_t(e)].size(), 1u) << "expert " << e << ": one chunk, one replica";
    EXPECT_GE(shared[std::size_t(e)].size(), whole[std::size_t(e)].size()) << "expert " << e;
    EXPECT_LE(shared[std::size_t(e)].size(), p.replicas(kLayer, e).size()) << "expert " << e;
    more += shared[std::size_t(e)].size() > whole[std::size_t(e)].size();
  }
  if (has_replicas(p, kLayer)) {
    EXPECT_GT(more, 0u) << "no replicated expert was shared";
  }
}

INSTANTIATE_TEST_SUITE_P(Placements, LayerInMemory,
                         ::testing::Combine(::testing::Range<std::size_t>(0, placement_cases().size()),
                                            ::testing::Bool()),
                         case_name);

// ---------------------------------------------------------------- traffic by link class

// Flat against hierarchical on the same tokens and placement: the same bits, and one
// cross-island row per (token, remote island) instead of one per (token, remote rank).
class LayerTraffic : public ::testing::TestWithParam<std::size_t> {};

TEST_P(LayerTraffic, HierarchicalCrossesIslandsOncePerTokenAndIsland) {
  const PlacementCase& c = placement_cases()[GetParam()];
  const Placement p = c.make();
  const Topology t = c.topology();
  const Tokens& tokens = layer_tokens();
  Traffic flat, hier;
  const std::vector<float> a = run_layer(tokens, p, t, false, kLayer, kChunk, kStep, &flat);
  const std::vector<float> b = run_layer(tokens, p, t, true, kLayer, kChunk, kStep, &hier);
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);

  // By hand from the chunk rule: the remote ranks and remote islands of each token.
  LayerRun run = dispatch_layer(tokens, p, t, false, kLayer, kChunk, kStep);
  std::size_t remote_ranks = 0, remote_islands = 0;
  for (const auto& [token, pairs] : expected_pairs(run, tokens)) {
    const int home = int(std::upper_bound(run.side.begin(), run.side.end(), token,
                                          [](std::uint64_t id, const RankSide& s) { return id < s.first; }) -
                         run.side.begin()) - 1;
    std::set<int> ranks, islands;
    for (const auto& [e, rank] : pairs)
      if (t.island_of(rank) != t.island_of(home)) {
        ranks.insert(rank);
        islands.insert(t.island_of(rank));
      }
    remote_ranks += ranks.size();
    remote_islands += islands.size();
  }
  EXPECT_EQ(flat.rows[1][kCross], remote_ranks);
  EXPECT_EQ(hier.rows[0][kCross], remote_islands);
  EXPECT_EQ(hier.rows[1][kCross], 0u);
  EXPECT_LE(hier.rows[0][kCross], flat.rows[1][kCross]);  // strictly fewer: by hand, below
  // The answers crossing back are not more bytes either: one per hop-1 row, a narrowed sum
  // (under 8 bytes an element here) where flat had two or more answers of at least 4 H
  // bytes each.
  EXPECT_LE(hier.combine_bytes[kCross], flat.combine_bytes[kCross]);
  // Each token reaches the same ranks either way: hop 2 holds the same rows in total.
  std::size_t flat_rows = 0, hier_rows = 0;
  for (int l = 0; l < placement::kLinkClasses; ++l) {
    flat_rows += flat.rows[1][l];
    hier_rows += hier.rows[1][l];
  }
  EXPECT_EQ(flat_rows, hier_rows);
}

INSTANTIATE_TEST_SUITE_P(Placements, LayerTraffic, ::testing::Range<std::size_t>(0, placement_cases().size()),
                         [](const ::testing::TestParamInfo<std::size_t>& info) {
                           return placement_cases()[info.param].name;
                         });

// Islands {0, 1} and {2, 3}, expert e on rank e, H = 64 (256-byte rows), two tokens per rank:
//   home 0: token 0 -> experts 2, 3    token 1 -> 1, 2
//   home 1: token 2 -> 2, 3            token 3 -> 0
//   home 2: token 4 -> 0, 1            token 5 -> 3
//   home 3: token 6 -> 2               token 7 -> 0, 1, 3
// Flat, rows by link class (one per token and rank): same rank 1 (7 -> 3); same island 4
// (1 -> 1, 3 -> 0, 5 -> 3, 6 -> 2); across 9 (0 -> 2, 3; 1 -> 2; 2 -> 2, 3; 4 -> 0, 1;
// 7 -> 0, 1). Hierarchical, hop 1: one row per token and remote island: 0, 1, 2, 4, 7 = 5
// across, to gateways 2 (home 0), 3 (home 1), 0 (home 2), 1 (home 3); hop 2 then holds the
// same 14 (token, rank) rows, none across: same rank 1 + 5 at the gateways (0 -> 2, 1 -> 2,
// 2 -> 3, 4 -> 0, 7 -> 1) = 6, same island 4 + 4 forwarded (0 -> 3, 2 -> 2, 4 -> 1, 7 -> 0) = 8.
//
// Bytes across (a message is 16-padded header 8 + 12/row + 12/pair, then 256/row; every
// rank sends every rank a message, 16 bytes when empty):
//   flat dispatch: 0 -> 2 holds 2 rows 2 pairs (64 + 512 = 576), the 7 other cross
//     messages 1 row 1 pair (32 + 256 = 288): 576 + 7 * 288 = 2592.
//   hierarchical hop 1: 0 -> 2: 2 rows 3 pairs (80 + 512 = 592); 1 -> 3, 2 -> 0, 3 -> 1:
//     1 row 2 pairs (48 + 256 = 304); 4 empty: 592 + 3 * 304 + 4 * 16 = 1568; hop 2 sends
//     8 empty messages across: 128. In all 1696.
//   combine, flat: 9 fp32 answers of 256 = 2304; hierarchical: tokens 0, 2, 4, 7 answered
//     in fixed point, token 1 in fp32 (256). At full width a sum is 8 + 512 = 520 bytes
//     (2336 in all, more than flat); narrowed, these sums (|sum| < 2^39) need 5 bytes an
//     element, 8 + 320 = 328: 1568.
TEST(LayerTraffic, TwoExpertsOnTwoRanksOfARemoteIslandCrossOnce) {
  const int H = 64;
  Tokens tokens{8, H, 4, {}, make_routing({{{2, .5f}, {3, .5f}},
                                           {{1, .75f}, {2, .25f}},
                                           {{2, .25f}, {3, .75f}},
                                           {{0, 1}},
                                           {{0, .5f}, {1, .5f}},
                                           {{3, 1}},
                                           {{2, 1}},
                                           {{0, .5f}, {1, .25f}, {3, .25f}}})};
  tokens.x = make_tokens(8, H, 4, 1, 5).x;
  Placement p(4, 1, 4);
  for (int e = 0; e < 4; ++e) p.set_replicas(0, e, {e});
  const Topology t = Topology::blocks(4, 2);
  Traffic flat, hier;
  const std::vector<float> a = run_layer(tokens, p, t, false, 0, 4, 0, &flat);
  const std::vector<float> b = run_layer(tokens, p, t, true, 0, 4, 0, &hier);
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);

  EXPECT_EQ(flat.rows[1][kSameRank], 1u);
  EXPECT_EQ(flat.rows[1][kSameIsland], 4u);
  EXPECT_EQ(flat.rows[1][kCross], 9u);
  EXPECT_EQ(flat.rows[0][kCross] + flat.rows[0][kSameIsland] + flat.rows[0][kSameRank], 0u);
  EXPECT_EQ(hier.rows[0][kCross], 5u);
  EXPECT_EQ(hier.rows[0][kSameIsland] + hier.rows[0][kSameRank], 0u);
  EXPECT_EQ(hier.rows[1][kSameRank], 6u);
  EXPECT_EQ(hier.rows[1][kSameIsland], 8u);
  EXPECT_EQ(hier.rows[1][kCross], 0u);

  EXPECT_EQ(flat.dispatch_bytes[kCross], 2592u);
  EXPECT_EQ(hier.dispatch_bytes[kCross], 1504u);  // 12 empty hop-1 batches send nothing
  EXPECT_EQ(flat.combine_bytes[kCross], 2304u);
  EXPECT_EQ(hier.combine_bytes[kCross], 1568u);
  Traffic full_width;
  const std::vector<float> c = run_layer(tokens, p, t, true, 0, 4, 0, &full_width, false);
  EXPECT_EQ(std::memcmp(a.data(), c.data(), a.size() * sizeof(float)), 0);
  EXPECT_EQ(full_width.combine_bytes[kCross], 2336u);
}

}  // namespace
}  // namespace moed::runtime
