#include "common/log.h"

#include <cstdio>
#include <cstdlib>

#include <spdlog/sinks/stdout_sinks.h>

#include "common/error.h"

namespace moed {

void set_log_level(const std::string& level) {
  for (const char* name : kLogLevels) {
    if (level == name) {
      spdlog::set_level(spdlog::level::from_str(level));
      return;
    }
  }
  MOED_THROW(Usage, "unknown log level '{}': use trace, debug, info, warn, error or off", level);
}

void init_logging(int rank, const std::string& level) {
  auto sink = std::make_shared<spdlog::sinks::stderr_sink_mt>();
  spdlog::set_default_logger(std::make_shared<spdlog::logger>("moed", sink));
  std::string who = rank < 0 ? "" : fmt::format("[rank {}] ", rank);
  spdlog::set_pattern("%H:%M:%S.%e " + who + "%^%l%$ %v");
  set_log_level(level);
}

void exit_now(int code) {
  if (auto logger = spdlog::default_logger()) logger->flush();
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(code);
}

}  // namespace moed
