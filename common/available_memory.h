// How much memory this host lets a process have now: MemAvailable of
// /proc/meminfo, or the memory cgroup's limit when that is lower. Used to
// refuse a model that cannot fit before allocating it (a std::bad_alloc or
// the OOM killer would say nothing about which setting was too large).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace moed {

struct AvailableMemory {
  std::uint64_t bytes = 0;
  std::string source;  // where the figure comes from, for messages
};

// MemAvailable (bytes) in the text of /proc/meminfo; nullopt if absent.
std::optional<std::uint64_t> parse_mem_available(std::string_view meminfo);
// A cgroup memory limit file's text (v2 memory.max, v1 memory.limit_in_bytes):
// the limit in bytes; nullopt for "max", a v1 "no limit" (>= 2^62) or junk.
std::optional<std::uint64_t> parse_cgroup_limit(std::string_view text);
// The cgroup v2 path of this process in the text of /proc/self/cgroup ("0::/a/b" -> "/a/b").
std::optional<std::string> parse_cgroup_v2_path(std::string_view text);

// The lower of MemAvailable and this process's cgroup limit; nullopt when
// neither can be read (then nothing is refused).
std::optional<AvailableMemory> available_memory();

// "52.8 TB", decimal units, for messages.
std::string human_bytes(std::uint64_t bytes);

}  // namespace moed
