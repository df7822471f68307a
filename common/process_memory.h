// This process's resident memory as the kernel counts it (/proc/self/status):
// VmRSS now and VmHWM, its peak. The peak can be reset (writing 5 to
// /proc/self/clear_refs), so that it measures one phase, e.g. serving after
// the load. What moed reports so that the memory planner's prediction can be
// checked against the real process (docs/memory-planning.md).
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace moed {

struct ProcessMemory {
  std::uint64_t rss_bytes = 0;
  std::uint64_t peak_bytes = 0;
};

// The value of a "Key:   N kB" line of /proc/self/status (or meminfo), in
// bytes; nullopt when the key is absent or its value is not N kB.
std::optional<std::uint64_t> parse_kb_line(std::string_view text, std::string_view key);
// VmRSS and VmHWM of this process; nullopt where /proc does not say.
std::optional<ProcessMemory> process_memory();
// Resets VmHWM to the current VmRSS; false where the kernel does not allow it.
bool reset_peak_memory();

}  // namespace moed
