#include "comm/comm_config.h"

#include "comm/transport.h"

namespace moed::comm {

namespace {
std::vector<std::string> backend_choices() {
  std::vector<std::string> choices{"auto"};
  for (auto& name : transport_backend_names()) choices.push_back(name);
  return choices;
}
}  // namespace

const config::Section<CommConfig>& comm_config_section() {
  using C = CommConfig;
  static const config::Section<C> section(
      "comm", "token traffic between ranks",
      {
          config::choice<C>("backend", &C::backend, "auto", backend_choices(),
                            "Transport backend for dispatch and combine; auto: the first of "
                            "ucx, mpi that can start on every rank"),
          config::integer<C>("timeout_ms", &C::timeout_ms, 60000, 100, 86400000,
                             "deadline of every blocking exchange; on expiry the job ends with "
                             "a diagnostic instead of hanging"),
          config::flag<C>("hierarchical", &C::hierarchical, true,
                          "cross islands once per token (to a gateway that forwards inside its "
                          "island, and sums before the return); false: every rank sends directly"),
          config::integer<C>("wait_spin_polls", &C::wait_spin_polls, 32, 0, 1 << 30,
                             "a wait polls this many times at full speed first (each wait anew)"),
          config::integer<C>("wait_yield_polls", &C::wait_yield_polls, 2048, 0, 1 << 30,
                             "then polls this many times yielding the core between polls"),
          config::integer<C>("wait_sleep_us", &C::wait_sleep_us, 20, 0, 1'000'000,
                             "then sleeps this long between polls (ranks that outnumber the cores "
                             "leave them to the rank being waited for)"),
      });
  return section;
}

}  // namespace moed::comm
