#include "runtime/control/control_messages.h"

#include "common/hex.h"

#include <nlohmann/json.hpp>

#include "common/error.h"

namespace moed::runtime {

using nlohmann::json;

namespace {

constexpr ControlAction::Kind kKinds[] = {ControlAction::Kind::gather_stats, ControlAction::Kind::prepare,
                                          ControlAction::Kind::transfer,     ControlAction::Kind::verify,
                                          ControlAction::Kind::commit,       ControlAction::Kind::release,
                                          ControlAction::Kind::abort};

ControlAction::Kind kind_named(const std::string& name) {
  for (auto kind : kKinds)
    if (kind_name(kind) == name) return kind;
  MOED_THROW(Internal, "control action \"{}\" is not one the ranks know", name);
}

json moves_json(const std::vector<placement::Move>& moves) {
  json out = json::array();
  for (const auto& m : moves) out.push_back({m.layer, m.expert, m.from, m.to, m.drop, m.shard, m.shards, m.cut, m.copy});
  return out;
}

std::vector<placement::Move> moves_from(const json& list) {
  std::vector<placement::Move> moves;
  for (const auto& m : list)
    moves.push_back({m.at(0), m.at(1), m.at(2), m.at(3), m.at(4), m.at(5), m.at(6), m.at(7).get<bool>(), m.at(8)});
  return moves;
}

template <class Decode>
auto parse(const std::string& text, const char* what, Decode decode) {
  try {
    return decode(json::parse(text));
  } catch (const json::exception& e) {
    MOED_THROW(Internal, "malformed {} ({}): {}", what, e.what(), text.substr(0, 200));
  }
}

}  // namespace

std::string encode_actions(const BoundaryActions& boundary) {
  if (boundary.actions.empty() && !boundary.stop && boundary.follow.empty() && boundary.arrivals.empty()) return "";
  json ops = json::array();
  for (const ControlAction& a : boundary.actions) {
    json op = {{"op", kind_name(a.kind)}};
    if (a.kind != ControlAction::Kind::gather_stats) op["id"] = a.migration;
    if (a.kind == ControlAction::Kind::prepare) op["moves"] = moves_json(a.moves);
    if (a.kind == ControlAction::Kind::verify) op["expected"] = a.expected;
    if (a.kind == ControlAction::Kind::commit) op["epoch"] = a.epoch;
    ops.push_back(std::move(op));
  }
  json out{{"ops", ops}, {"stop", boundary.stop}};
  if (!boundary.follow.empty()) out["follow"] = boundary.follow;
  for (const JoinerArrival& a : boundary.arrivals)
    out["arrivals"].push_back({{"rank", a.world_rank}, {"host", a.host}, {"address", to_hex(a.address)}});
  return out.dump();
}

BoundaryActions decode_actions(const std::string& text) {
  if (text.empty()) return {};
  return parse(text, "control actions", [](const json& j) {
    BoundaryActions out;
    out.stop = j.at("stop").get<bool>();
    if (j.contains("follow")) out.follow = j["follow"].get<std::vector<std::uint64_t>>();
    if (j.contains("arrivals"))
      for (const json& a : j["arrivals"])
        out.arrivals.push_back({a.at("rank").get<int>(), a.at("host").get<std::string>(),
                                from_hex(a.at("address").get<std::string>(), "a joiner's address")});
    for (const json& op : j.at("ops")) {
      ControlAction a;
      a.kind = kind_named(op.at("op").get<std::string>());
      a.migration = op.value("id", std::uint64_t{0});
      if (op.contains("moves")) a.moves = moves_from(op["moves"]);
      if (op.contains("expected")) a.expected = op["expected"].get<std::vector<std::uint64_t>>();
      a.epoch = op.value("epoch", std::uint64_t{0});
      out.actions.push_back(std::move(a));
    }
    return out;
  });
}

std::string encode_report(const StageReport& r) {
  json j = {{"sent", r.sent_bytes}, {"send_s", r.send_seconds}};
  if (r.refused) j["refused"] = *r.refused;
  if (r.failed) j["failed"] = *r.failed;
  if (!r.checksums.empty()) j["checksums"] = r.checksums;
  if (!r.bad_moves.empty()) j["bad"] = r.bad_moves;
  return j.dump();
}

StageReport decode_report(const std::string& text) {
  return parse(text, "migration report", [](const json& j) {
    StageReport r;
    r.sent_bytes = j.at("sent").get<std::size_t>();
    r.send_seconds = j.at("send_s").get<double>();
    if (j.contains("refused")) r.refused = j["refused"].get<std::string>();
    if (j.contains("failed")) r.failed = j["failed"].get<std::string>();
    if (j.contains("checksums"))
      r.checksums = j["checksums"].get<std::vector<std::pair<std::size_t, std::uint64_t>>>();
    if (j.contains("bad")) r.bad_moves = j["bad"].get<std::vector<std::size_t>>();
    return r;
  });
}

}  // namespace moed::runtime
