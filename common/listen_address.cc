#include "common/listen_address.h"

#include <arpa/inet.h>

#include <charconv>

#include "common/error.h"
#include "common/quote.h"

namespace moed {

std::string ListenAddress::describe() const {
  return host.find(':') != std::string::npos ? fmt::format("[{}]:{}", host, port) : fmt::format("{}:{}", host, port);
}

namespace {

int parse_port(std::string_view digits, std::string_view key, std::string_view text) {
  int port = -1;
  const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), port);
  if (digits.empty() || error != std::errc() || end != digits.data() + digits.size() || port < 0 || port > 65535)
    MOED_THROW(Usage, "{} = {}: the port must be a number from 0 to 65535 (0: any free port)", key,
               quote_input(text));
  return port;
}

}  // namespace

ListenAddress parse_listen_address(std::string_view text, std::string_view key) {
  constexpr std::string_view kForm = "\"PORT\" (loopback), \"HOST:PORT\" or \"[IPV6]:PORT\", e.g. \"127.0.0.1:9464\"";
  if (text.find_first_not_of("0123456789") == std::string_view::npos)
    return {"127.0.0.1", parse_port(text, key, text)};
  std::string host;
  std::string_view port;
  if (text.front() == '[') {
    const std::size_t close = text.find(']');
    if (close == std::string_view::npos || close + 1 >= text.size() || text[close + 1] != ':')
      MOED_THROW(Usage, "{} = {}: expected {}", key, quote_input(text), kForm);
    host = std::string(text.substr(1, close - 1));
    port = text.substr(close + 2);
    in6_addr v6{};
    if (::inet_pton(AF_INET6, host.c_str(), &v6) != 1)
      MOED_THROW(Usage, "{} = {}: {} is not an IPv6 address", key, quote_input(text), quote_input(host));
    return {host, parse_port(port, key, text)};
  }
  const std::size_t colon = text.rfind(':');
  if (colon == std::string_view::npos) MOED_THROW(Usage, "{} = {}: expected {}", key, quote_input(text), kForm);
  if (colon == 0)
    MOED_THROW(Usage, "{} = {}: name the host: \"127.0.0.1{}\" for this host only, \"0.0.0.0{}\" for every interface",
               key, quote_input(text), text, text);
  host = std::string(text.substr(0, colon));
  port = text.substr(colon + 1);
  if (host == "localhost") host = "127.0.0.1";
  in_addr v4{};
  if (::inet_pton(AF_INET, host.c_str(), &v4) != 1)
    MOED_THROW(Usage, "{} = {}: {} is not a numeric IPv4 address (host names other than localhost are not "
               "resolved; an IPv6 address goes in brackets)", key, quote_input(text), quote_input(host));
  return {host, parse_port(port, key, text)};
}

}  // namespace moed
