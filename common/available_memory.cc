#include "common/available_memory.h"

#include <fmt/format.h>

#include <charconv>
#include <fstream>
#include <sstream>

namespace moed {

namespace {

std::optional<std::uint64_t> parse_uint(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.remove_suffix(1);
  std::uint64_t v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return v;
}

std::optional<std::string> read_text(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

std::optional<std::uint64_t> parse_mem_available(std::string_view meminfo) {
  constexpr std::string_view kKey = "MemAvailable:";
  for (std::size_t at = 0; at < meminfo.size();) {
    std::size_t end = meminfo.find('\n', at);
    if (end == std::string_view::npos) end = meminfo.size();
    std::string_view line = meminfo.substr(at, end - at);
    at = end + 1;
    if (line.substr(0, kKey.size()) != kKey) continue;
    line.remove_prefix(kKey.size());
    if (line.size() >= 3 && line.substr(line.size() - 3) == " kB") line.remove_suffix(3);
    const auto kb = parse_uint(line);
    if (!kb || *kb > (UINT64_MAX >> 10)) return std::nullopt;
    return *kb << 10;
  }
  return std::nullopt;
}

std::optional<std::uint64_t> parse_cgroup_limit(std::string_view text) {
  const auto v = parse_uint(text);
  if (!v || *v >= (std::uint64_t(1) << 62)) return std::nullopt;  // "max", or v1's page-rounded LONG_MAX
  return v;
}

std::optional<std::string> parse_cgroup_v2_path(std::string_view text) {
  for (std::size_t at = 0; at < text.size();) {
    std::size_t end = text.find('\n', at);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view line = text.substr(at, end - at);
    at = end + 1;
    if (line.substr(0, 3) == "0::") return std::string(line.substr(3));
  }
  return std::nullopt;
}

std::optional<AvailableMemory> available_memory() {
  std::optional<AvailableMemory> best;
  auto consider = [&](std::optional<std::uint64_t> bytes, std::string source) {
    if (bytes && (!best || *bytes < best->bytes)) best = AvailableMemory{*bytes, std::move(source)};
  };
  if (auto meminfo = read_text("/proc/meminfo")) consider(parse_mem_available(*meminfo), "MemAvailable in /proc/meminfo");
  std::string v2 = "/sys/fs/cgroup/memory.max";
  if (auto self = read_text("/proc/self/cgroup"))
    if (auto path = parse_cgroup_v2_path(*self); path && read_text("/sys/fs/cgroup" + *path + "/memory.max"))
      v2 = "/sys/fs/cgroup" + *path + "/memory.max";
  for (const std::string& file : {v2, std::string("/sys/fs/cgroup/memory/memory.limit_in_bytes")})
    if (auto text = read_text(file)) consider(parse_cgroup_limit(*text), "the cgroup limit in " + file);
  return best;
}

std::string human_bytes(std::uint64_t bytes) {
  const char* units[] = {"B", "kB", "MB", "GB", "TB", "PB", "EB"};
  double b = double(bytes);
  int u = 0;
  while (b >= 1000 && u < 6) b /= 1000, ++u;
  return u == 0 ? fmt::format("{} B", bytes) : fmt::format("{:.1f} {}", b, units[u]);
}

}  // namespace moed
