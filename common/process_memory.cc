#include "common/process_memory.h"

#include <fcntl.h>
#include <unistd.h>

#include <charconv>
#include <fstream>
#include <sstream>
#include <string>

namespace moed {

std::optional<std::uint64_t> parse_kb_line(std::string_view text, std::string_view key) {
  for (std::size_t at = 0; at < text.size();) {
    std::size_t end = text.find('\n', at);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(at, end - at);
    at = end + 1;
    if (line.size() <= key.size() || line.substr(0, key.size()) != key || line[key.size()] != ':') continue;
    line.remove_prefix(key.size() + 1);
    while (!line.empty() && (line.front() == ' ' || line.front() == '\t')) line.remove_prefix(1);
    if (line.size() < 3 || line.substr(line.size() - 3) != " kB") return std::nullopt;
    line.remove_suffix(3);
    std::uint64_t kb = 0;
    auto [ptr, ec] = std::from_chars(line.data(), line.data() + line.size(), kb);
    if (ec != std::errc() || ptr != line.data() + line.size() || kb > (UINT64_MAX >> 10)) return std::nullopt;
    return kb << 10;
  }
  return std::nullopt;
}

std::optional<ProcessMemory> process_memory() {
  std::ifstream in("/proc/self/status");
  if (!in) return std::nullopt;
  std::ostringstream text;
  text << in.rdbuf();
  const std::string status = text.str();
  const auto rss = parse_kb_line(status, "VmRSS"), peak = parse_kb_line(status, "VmHWM");
  if (!rss || !peak) return std::nullopt;
  return ProcessMemory{*rss, *peak};
}

bool reset_peak_memory() {
  const int fd = ::open("/proc/self/clear_refs", O_WRONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool ok = ::write(fd, "5", 1) == 1;
  ::close(fd);
  return ok;
}

}  // namespace moed
