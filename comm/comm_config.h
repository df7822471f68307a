// The [comm] config section: which Transport backend carries token traffic.
#pragma once

#include <cstdint>
#include <string>

#include "common/config_table.h"

namespace moed::comm {

struct CommConfig {
  std::string backend;
  std::int64_t timeout_ms = 0;
  bool hierarchical = true;
};

const config::Section<CommConfig>& comm_config_section();

}  // namespace moed::comm
