#include "comm/comm_config.h"

#include "comm/transport.h"

namespace moed::comm {

const config::Section<CommConfig>& comm_config_section() {
  using C = CommConfig;
  static const config::Section<C> section(
      "comm", "token traffic between ranks",
      {
          config::choice<C>("backend", &C::backend, "mpi", transport_backend_names(),
                            "Transport backend for dispatch and combine"),
          config::integer<C>("timeout_ms", &C::timeout_ms, 60000, 100, 86400000,
                             "deadline of every blocking exchange; on expiry the job ends with "
                             "a diagnostic instead of hanging"),
      });
  return section;
}

}  // namespace moed::comm
