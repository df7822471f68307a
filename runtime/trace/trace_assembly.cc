#include "runtime/trace/trace_assembly.h"

#include <algorithm>
#include <set>

namespace moed::runtime::trace {

using nlohmann::json;

std::vector<LayerTrace> assemble(const TraceFragments& step) {
  std::vector<LayerTrace> out;
  out.reserve(step.homes.size());
  for (const HomeRecord& h : step.homes) {
    LayerTrace& t = out.emplace_back();
    t.home = h;
    for (const ChoiceRecord& c : step.choices)
      if (c.at == h.at) t.choices.push_back(c);
    for (const LegRecord& l : step.legs)
      if (l.at == h.at) t.legs.push_back(l);
    for (const VisitRecord& v : step.visits)
      if (v.at == h.at) t.visits.push_back(v);
    std::sort(t.legs.begin(), t.legs.end(), [](const LegRecord& a, const LegRecord& b) { return a.rank < b.rank; });
    std::sort(t.visits.begin(), t.visits.end(),
              [](const VisitRecord& a, const VisitRecord& b) { return a.expert < b.expert; });
  }
  return out;
}

void TraceRing::add(LayerTrace layer) {
  if (capacity_ == 0 || layer.home.at.layer < 0 || layer.home.at.layer >= layers_) return;
  const std::uint64_t id = layer.home.request_id;
  const std::uint32_t position = layer.home.position;
  auto it = std::find_if(tokens_.begin(), tokens_.end(),
                         [&](const TokenTrace& t) { return t.request_id == id && t.position == position; });
  if (it == tokens_.end()) {
    if (tokens_.size() == capacity_) {
      tokens_.pop_front();
      ++evicted_;
    }
    tokens_.push_back({id, position, {}});
    it = std::prev(tokens_.end());
  }
  std::vector<LayerTrace>& layers = it->layers;
  const auto at = std::lower_bound(layers.begin(), layers.end(), layer.home.at.layer,
                                   [](const LayerTrace& l, int layer) { return l.home.at.layer < layer; });
  if (at != layers.end() && at->home.at.layer == layer.home.at.layer)
    *at = std::move(layer);
  else
    layers.insert(at, std::move(layer));
}

std::vector<TokenTrace> TraceRing::find(std::uint64_t request_id) const {
  std::vector<TokenTrace> out;
  for (const TokenTrace& t : tokens_)
    if (t.request_id == request_id) out.push_back(t);
  return out;
}

namespace {

double us(double v) { return double(float(v)); }

json span(int rank, const char* phase, double start, double end) {
  return {{"rank", rank}, {"phase", phase}, {"start_us", us(start)}, {"end_us", us(std::max(start, end))}};
}

json layer_json(const LayerTrace& t, double first_sync_s, const LayerNumbers& numbers) {
  const HomeRecord& h = t.home;
  const int home = h.at.home;
  json experts = json::array();
  std::set<int> ranks{home}, islands{h.island};
  for (const ChoiceRecord& c : t.choices) {
    json e = {{"expert", c.expert}, {"weight", c.weight}, {"rank", nullptr}, {"island", nullptr}};
    for (const VisitRecord& v : t.visits)
      if (v.expert == c.expert) {
        e["rank"] = v.rank, e["island"] = v.island;
        e["queue_us"] = us(v.start_us - v.arrived_us);
        e["expert_us"] = us(v.end_us - v.start_us);
        e["call_rows"] = v.call_rows;
      }
    experts.push_back(std::move(e));
  }
  std::uint64_t row_bytes = 0, answer_bytes = 0, cross_island = 0;
  double last_back = h.sent_us;
  for (const LegRecord& l : t.legs) {
    ranks.insert(l.rank), islands.insert(l.island);
    row_bytes += l.row_bytes, answer_bytes += l.answer_bytes;
    if (l.island != h.island) cross_island += l.row_bytes + l.answer_bytes;
    if (l.back_us >= 0) last_back = std::max(last_back, double(l.back_us));
  }
  for (const VisitRecord& v : t.visits) ranks.insert(v.rank), islands.insert(v.island);

  // On the home's clock: the five phases sum to total.
  const double plan = double(h.gather_us) + h.planned_us, dispatch = double(h.sent_us) - h.planned_us,
               wait = last_back - h.sent_us, combine = double(h.combined_us) - last_back;
  json phases = {{"route", us(h.route_us)}, {"plan", us(plan)},       {"dispatch", us(dispatch)},
                 {"wait", us(wait)},        {"combine", us(combine)}, {"total", us(double(h.route_us) + h.gather_us + h.combined_us)}};
  // The wait's slowest part: the expert whose answer left last. Its travel
  // times cross clocks (each rank's own sync point), so they are estimates.
  json slowest = nullptr;
  const VisitRecord* last = nullptr;
  for (const VisitRecord& v : t.visits)
    if (!last || v.answered_us > last->answered_us) last = &v;
  if (last) {
    double back = -1;
    for (const LegRecord& l : t.legs)
      if (l.rank == last->rank) back = l.back_us;
    slowest = {{"expert", last->expert},
               {"rank", last->rank},
               {"rows_travel_us", us(std::max(0.0, double(last->arrived_us) - h.sent_us))},
               {"queue_us", us(last->start_us - last->arrived_us)},
               {"expert_us", us(last->end_us - last->start_us)},
               {"answer_wait_us", us(std::max(0.0, double(last->answered_us) - last->end_us))},
               {"answer_travel_us", back >= 0 ? json(us(std::max(0.0, back - last->answered_us))) : json(nullptr)}};
  }
  json legs = json::array();
  for (const LegRecord& l : t.legs)
    legs.push_back({{"rank", l.rank},
                    {"island", l.island},
                    {"pairs", l.pairs},
                    {"via_gateway", l.via_gateway != 0},
                    {"row_bytes", l.row_bytes},
                    {"answer_bytes", l.answer_bytes},
                    {"back_us", l.back_us >= 0 ? json(us(l.back_us)) : json(nullptr)}});
  json spans = json::array();
  const double route_end = -double(h.gather_us);
  spans.push_back(span(home, "route", route_end - h.route_us, route_end));
  spans.push_back(span(home, "plan", route_end, h.planned_us));
  spans.push_back(span(home, "dispatch", h.planned_us, h.sent_us));
  spans.push_back(span(home, "wait", h.sent_us, last_back));
  spans.push_back(span(home, "combine", last_back, h.combined_us));
  for (const VisitRecord& v : t.visits) {
    json q = span(v.rank, "queue", v.arrived_us, v.start_us), e = span(v.rank, "expert", v.start_us, v.end_us);
    q["expert"] = e["expert"] = v.expert;
    spans.push_back(std::move(q));
    spans.push_back(std::move(e));
  }
  return {{"layer", numbers.model(h.at.layer)},
          {"step", h.step},
          {"epoch", h.epoch},
          {"home", {{"rank", home}, {"island", h.island}}},
          {"at_us", us((h.sync_s - first_sync_s) * 1e6)},
          {"experts", experts},
          {"ranks", std::vector<int>(ranks.begin(), ranks.end())},
          {"islands", std::vector<int>(islands.begin(), islands.end())},
          {"bytes", {{"rows", row_bytes}, {"answers", answer_bytes}, {"cross_island", cross_island}}},
          {"legs", legs},
          {"phases_us", phases},
          {"slowest_expert", slowest},
          {"spans", spans}};
}

}  // namespace

json token_trace_json(const TokenTrace& token, int model_layers, const LayerNumbers& numbers) {
  json layers = json::array();
  double first_sync = 0;
  for (std::size_t i = 0; i < token.layers.size(); ++i) {
    const double s = token.layers[i].home.sync_s;
    if (i == 0 || s < first_sync) first_sync = s;
  }
  for (const LayerTrace& l : token.layers) layers.push_back(layer_json(l, first_sync, numbers));
  return {{"request_id", token.request_id},
          {"position", token.position},
          {"layers_traced", token.layers.size()},
          {"model_layers", model_layers},
          {"complete", int(token.layers.size()) == model_layers},
          {"layers", layers}};
}

}  // namespace moed::runtime::trace
