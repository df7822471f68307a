// Logging: spdlog with the MPI rank in every line.
#pragma once

#include <spdlog/spdlog.h>

#include <string>

namespace moed {

// Names accepted for a log level, in increasing severity.
inline constexpr const char* kLogLevels[] = {"trace", "debug", "info", "warn", "error", "off"};

// Sets the default logger to stderr with "[rank R]" in each line. rank < 0: no
// rank yet (single process tools). Throws a Usage error for an unknown level.
void init_logging(int rank, const std::string& level);
void set_log_level(const std::string& level);

// Flushes the logs and stdio, then ends the process at once with `code`,
// running no destructor: for a rank that must not wait in MPI_Finalize or
// a collective teardown for peers that are gone (elastic serving).
[[noreturn]] void exit_now(int code);

}  // namespace moed
