#include "runtime/join/join_wire.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>

#include "common/hex.h"

namespace moed::runtime::join {

namespace {

using json = nlohmann::json;

std::string hex(const std::uint8_t* data, std::size_t bytes) {
  return to_hex(std::span(reinterpret_cast<const std::byte*>(data), bytes));
}
std::string hex(const std::vector<std::byte>& bytes) { return to_hex(bytes); }

template <std::size_t N>
std::array<std::uint8_t, N> fixed(const json& j, const char* key, const std::string& from) {
  const std::vector<std::byte> bytes = from_hex(j.at(key).get<std::string>(), fmt::format("{}: \"{}\"", from, key));
  if (bytes.size() != N) MOED_THROW(Runtime, "{}: \"{}\" holds {} bytes, not {}", from, key, bytes.size(), N);
  std::array<std::uint8_t, N> out{};
  for (std::size_t i = 0; i < N; ++i) out[i] = std::uint8_t(bytes[i]);
  return out;
}

std::vector<std::byte> bytes_of(const json& j, const std::string& what) { return from_hex(j.get<std::string>(), what); }

// Parses `text` as the message `kind`: a refusal throws JoinRefused, any
// other fault (not JSON, a key missing or of the wrong type, another
// version) a Runtime error naming `from`.
template <class Read>
auto parse(const std::string& text, const char* kind, const std::string& from, Read read) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    MOED_THROW(Runtime, "{}: its {} is not JSON ({})", from, kind, e.what());
  }
  if (j.is_object() && j.contains("refused") && j["refused"].is_string())
    throw JoinRefused(fmt::format("{} refused: {}", from, j["refused"].get<std::string>()), __FILE__, __LINE__);
  try {
    if (j.at("join").get<int>() != kVersion)
      MOED_THROW(Runtime, "{}: its {} is of join protocol version {}, this moed speaks {}", from, kind,
                 j.at("join").get<int>(), kVersion);
    if (j.at("kind").get<std::string>() != kind)
      MOED_THROW(Runtime, "{}: a \"{}\" came where its {} was expected", from, j.at("kind").get<std::string>(), kind);
    return read(j);
  } catch (const json::exception& e) {
    MOED_THROW(Runtime, "{}: its {} is malformed ({})", from, kind, e.what());
  }
}

json message(const char* kind) { return json{{"join", kVersion}, {"kind", kind}}; }

}  // namespace

std::string Hello::signed_text() const { return json{{"command", command}, {"host", host}, {"products", products_ability}}.dump(); }

std::string encode(const Challenge& m) {
  json j = message("challenge");
  j["nonce"] = hex(m.nonce.data(), m.nonce.size());
  return j.dump();
}

std::string encode(const Hello& m) {
  json j = message("hello");
  j["command"] = m.command;
  j["host"] = m.host;
  j["products"] = m.products_ability;
  j["nonce"] = hex(m.nonce.data(), m.nonce.size());
  j["proof"] = hex(m.proof.data(), m.proof.size());
  return j.dump();
}

std::string encode(const Offer& m) {
  json j = message("offer");
  j["world_rank"] = m.world_rank;
  j["launched_ranks"] = m.launched_ranks;
  j["world_ranks"] = m.world_ranks;
  j["proof"] = hex(m.proof.data(), m.proof.size());
  return j.dump();
}

std::string encode_address(const std::vector<std::byte>& address) {
  json j = message("address");
  j["address"] = hex(address);
  return j.dump();
}

std::string encode(const Welcome& m) {
  json j = message("welcome");
  json addresses = json::array();
  for (const auto& a : m.addresses) addresses.push_back(hex(a));
  j["addresses"] = std::move(addresses);
  j["hosts"] = m.hosts;
  j["islands"] = m.islands;
  j["serving_ranks"] = m.serving_ranks;
  j["epoch"] = m.view.epoch;
  j["members"] = m.view.members;
  j["products"] = m.products;
  return j.dump();
}

std::string encode_refusal(const std::string& why) { return json{{"refused", why}}.dump(); }

Challenge decode_challenge(const std::string& text, const std::string& from) {
  return parse(text, "challenge", from, [&](const json& j) { return Challenge{fixed<wire::kNonceBytes>(j, "nonce", from)}; });
}

Hello decode_hello(const std::string& text, const std::string& from) {
  return parse(text, "hello", from, [&](const json& j) {
    Hello h;
    h.command = j.at("command").get<std::string>();
    h.host = j.at("host").get<std::string>();
    h.products_ability = j.at("products").get<int>();
    h.nonce = fixed<wire::kNonceBytes>(j, "nonce", from);
    h.proof = fixed<32>(j, "proof", from);
    return h;
  });
}

Offer decode_offer(const std::string& text, const std::string& from) {
  return parse(text, "offer", from, [&](const json& j) {
    Offer o;
    o.world_rank = j.at("world_rank").get<int>();
    o.launched_ranks = j.at("launched_ranks").get<int>();
    o.world_ranks = j.at("world_ranks").get<int>();
    o.proof = fixed<32>(j, "proof", from);
    if (o.launched_ranks < 1 || o.world_rank < o.launched_ranks || o.world_rank >= o.world_ranks)
      MOED_THROW(Runtime, "{}: offered world rank {}, outside the join slots [{}, {})", from, o.world_rank,
                 o.launched_ranks, o.world_ranks);
    return o;
  });
}

std::vector<std::byte> decode_address(const std::string& text, const std::string& from) {
  return parse(text, "address", from, [&](const json& j) {
    std::vector<std::byte> address = bytes_of(j.at("address"), from + ": \"address\"");
    if (address.empty()) MOED_THROW(Runtime, "{}: an empty worker address", from);
    return address;
  });
}

Welcome decode_welcome(const std::string& text, const std::string& from) {
  return parse(text, "welcome", from, [&](const json& j) {
    Welcome w;
    for (const json& a : j.at("addresses")) w.addresses.push_back(bytes_of(a, from + ": \"addresses\""));
    w.hosts = j.at("hosts").get<std::vector<std::string>>();
    w.islands = j.at("islands").get<std::vector<int>>();
    w.serving_ranks = j.at("serving_ranks").get<int>();
    w.view.epoch = j.at("epoch").get<std::uint64_t>();
    w.view.members = j.at("members").get<std::vector<int>>();
    w.products = j.at("products").get<std::string>();
    const std::size_t n = w.addresses.size();
    if (n == 0 || w.hosts.size() != n || w.islands.size() != n)
      MOED_THROW(Runtime, "{}: {} addresses, {} hosts and {} islands: one of each per world rank", from, n,
                 w.hosts.size(), w.islands.size());
    if (w.view.members.empty() || !std::is_sorted(w.view.members.begin(), w.view.members.end()) ||
        w.view.members.front() < 0 || std::size_t(w.view.members.back()) >= n)
      MOED_THROW(Runtime, "{}: the members are not ascending world ranks below {}", from, n);
    for (int m : w.view.members)
      if (w.addresses[std::size_t(m)].empty()) MOED_THROW(Runtime, "{}: no address for member world rank {}", from, m);
    if (w.serving_ranks < 1 || std::size_t(w.serving_ranks) > n)
      MOED_THROW(Runtime, "{}: {} ranks served at start of {}", from, w.serving_ranks, n);
    if (std::any_of(w.islands.begin(), w.islands.end(), [](int i) { return i < 0; }))
      MOED_THROW(Runtime, "{}: a negative island", from);
    return w;
  });
}

}  // namespace moed::runtime::join
