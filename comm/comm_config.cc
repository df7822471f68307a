#include "comm/comm_config.h"

namespace moed::comm {

const config::Section<CommConfig>& comm_config_section() {
  using C = CommConfig;
  static const config::Section<C> section(
      "comm", "token traffic between ranks",
      {
          config::choice<C>("backend", &C::backend, Backend::automatic, kBackendNames,
                            "Transport backend for dispatch and combine; auto: the first of "
                            "nccl, ucx, mpi that can start on every rank (nccl: rows in GPU memory, "
                            "refused with its reason where it cannot run: docs/gpu.md)"),
          config::choice<C>("control", &C::control, ControlMedium::mpi, kControlMediumNames,
                            "the coordinator's collectives after start-up (each step's command, figures, "
                            "outputs, statistics): over MPI, or over the transport's exchanges (then MPI "
                            "only starts the job)"),
          config::integer<C>("timeout_ms", &C::timeout_ms, 60000, 100, 86400000,
                             "deadline of every blocking exchange; on expiry the job ends with "
                             "a diagnostic instead of hanging"),
          config::integer<C>("nccl_lanes", &C::nccl_lanes, 8, 1, 64,
                             "backend nccl: communicators (each with its stream) that exchanges take in turn; "
                             "at least the exchanges a step has open at once (2 per micro-batch, 6 with "
                             "hierarchical dispatch), or later ones wait for earlier ones to launch"),
          config::flag<C>("hierarchical", &C::hierarchical, true,
                          "cross islands once per token (to a gateway that forwards inside its "
                          "island, and sums before the return); false: every rank sends directly"),
          config::flag<C>("narrow_answers", &C::narrow_answers, true,
                          "send each fixed-point answer row in the fewest bytes per sum that hold "
                          "it (the same integers, about 5/8 of the bytes); false: 8 bytes per sum"),
          config::flag<C>("detect_lost_peers", &C::detect_lost_peers, false,
                          "a second UCX endpoint per peer, in error handling mode PEER, reports a peer "
                          "whose process or link is gone instead of leaving it to a deadline (elastic serving)"),
          config::flag<C>("elastic", &C::elastic, false,
                          "survive a lost rank: the others agree on who is left and go on serving without "
                          "a restart (needs the front door, backend ucx, control transport; turns on "
                          "detect_lost_peers)"),
          config::integer<C>("spares", &C::spares, 0, 0, 1 << 20,
                             "the last N ranks of the job serve nothing at first: each waits, holding no "
                             "expert, until the survivors of a loss admit it and migrate experts to it "
                             "(needs elastic)"),
          config::integer<C>("lease_ms", &C::lease_ms, 0, 0, 86400000,
                             "elastic: a rank answers a step's outputs only within this long of the step's "
                             "start, so that one the others left out (stopped past timeout_ms) never does; "
                             "past it they wait for the next turn (0: half of timeout_ms)"),
          config::integer<C>("join_slots", &C::join_slots, 0, 0, 1 << 16,
                             "world ranks kept for processes started later with `moed --join`: each that "
                             "joins is admitted and takes its share of the experts by migration (needs "
                             "elastic and join_listen; each slot serves one joiner)"),
          config::text<C>("join_listen", &C::join_listen, "",
                          "HOST:PORT where world rank 0 (or the survivors' rank 0) hears `moed --join`; "
                          "a joiner proves it holds [ingress].key_file"),
          config::integer<C>("wait_spin_polls", &C::wait_spin_polls, 32, 0, 1 << 30,
                             "a wait polls this many times at full speed first (each wait anew)"),
          config::integer<C>("wait_yield_polls", &C::wait_yield_polls, 2048, 0, 1 << 30,
                             "then polls this many times yielding the core between polls"),
          config::integer<C>("wait_sleep_us", &C::wait_sleep_us, 20, 0, 1'000'000,
                             "then sleeps between polls, this long first (ranks that outnumber the "
                             "cores leave them to the rank being waited for)"),
          config::integer<C>("wait_sleep_max_us", &C::wait_sleep_max_us, 1000, 0, 1'000'000,
                             "each sleep of a wait doubles the last, up to this (not above "
                             "wait_sleep_us: no growth)"),
      });
  return section;
}

}  // namespace moed::comm
