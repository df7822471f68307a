// The [comm] config section: which Transport backend carries token traffic.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/config_table.h"

namespace moed::comm {

struct CommConfig {
  std::string backend;
  std::int64_t timeout_ms = 0;
  bool hierarchical = true;
  bool narrow_answers = true;
  std::int64_t wait_spin_polls = 32, wait_yield_polls = 2048, wait_sleep_us = 20, wait_sleep_max_us = 1000;
};

const config::Section<CommConfig>& comm_config_section();
// "auto" and the names of the transport backends, as [comm].backend accepts them.
const std::vector<std::string>& transport_backend_choices();

}  // namespace moed::comm
