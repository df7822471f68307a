// Join slots in the daemon ([comm].join_slots, docs/elastic.md): a process
// started after the job (`moed --join`) reaches the members' rank 0 over
// TCP (runtime/join/join_listener.h); at the next step boundary every member
// reaches its UCX worker; rank 0 answers it with the job as it stands and
// admits it, as it admits a spare (elastic.cc), and a migration gives it
// its share of the experts. The joiner's own start is in start_up.cc.
#include <fmt/ranges.h>

#include <atomic>

#include "common/error.h"
#include "common/log.h"
#include "kernels/cpu/bf16_dot_gemm.h"
#include "placement/survivors.h"
#include "runtime/daemon/daemon.h"

namespace moed::runtime {

void Daemon::open_join_listener() {
  wire::Key key = cluster_key();
  const int world = world_topology_->ranks(), slots = int(config_.comm.join_slots);
  // Slots are handed in order, each once; a new rank 0 goes on after the
  // last that joined (one handed out by a lost rank 0 and never come is lost).
  int next = world - slots;
  for (int r = next; r < world; ++r)
    if (present_[std::size_t(r)]) next = r + 1;
  auto next_slot = std::make_shared<std::atomic<int>>(next);
  const kernels::CompactProducts job = kernels::compact_products();
  join::JoinListener::SlotFor offer = [command = command_, job, next_slot, world,
                                     slots](const join::Hello& hello) -> std::variant<int, std::string> {
    if (hello.command != command)
      return fmt::format("it runs \"{}\" and the job \"{}\": start it with the job's config and flags", hello.command,
                         command);
    if (hello.products_ability < products_ability(job))
      return fmt::format("its CPU cannot multiply compact experts with {} products, as the job does",
                         kernels::to_string(job));
    const int slot = next_slot->fetch_add(1);
    if (slot >= world)
      return fmt::format("every join slot is taken ([comm].join_slots = {}; each serves one joiner)", slots);
    return slot;
  };
  join_listener_ = std::make_unique<join::JoinListener>(
      parse_listen_address(config_.comm.join_listen, "[comm].join_listen"), std::move(key), world - slots, world,
      std::move(offer), std::chrono::milliseconds(config_.comm.timeout_ms));
  spdlog::info("join listener {} ({} join slot(s) left of {})", join_listener_->address().describe(),
               std::max(0, world - next), slots);
}

void Daemon::reach_joiner(const JoinerArrival& arrival) {
  const int r = arrival.world_rank;
  std::string error;
  try {
    if (r < 0 || r >= world_topology_->ranks() || present_[std::size_t(r)])
      MOED_THROW(Runtime, "world rank {} is no free join slot", r);
    transport_->connect_joiner(r, arrival.address);
  } catch (const Error& e) {
    error = e.what();
    spdlog::error("cannot reach the joiner at world rank {} (host {}): {}", r, arrival.host, error);
  }
  const bool everywhere = control_.all_max(error.empty() ? 0 : 1, fmt::format("whether every member reached world rank {}", r)) == 0;
  if (everywhere) {
    present_[std::size_t(r)] = 1;
    world_hosts_[std::size_t(r)] = arrival.host;
    world_topology_.emplace(placement::with_joiner(*world_topology_, world_hosts_, present_, r, arrival.host));
  }
  if (rank_ == 0) reached_.emplace_back(r, everywhere);
}

void Daemon::welcome_joiners() {
  for (auto [r, everywhere] : std::exchange(reached_, {})) {
    if (!join_listener_) continue;
    if (!everywhere) {
      join_listener_->answer(r, std::string("a member of the job could not reach it (see that member's log)"));
      continue;
    }
    join::Welcome w;
    w.addresses = transport_->world_addresses();
    for (std::size_t i = 0; i < w.addresses.size(); ++i)
      if (!present_[i] || agreement_->lost(int(i))) w.addresses[i].clear();
    w.hosts = world_hosts_;
    w.islands = world_topology_->island_of_ranks();
    w.serving_ranks = serving_ranks_;
    w.view = agreement_->view();
    w.products = kernels::to_string(kernels::compact_products());
    join_listener_->answer(r, std::move(w));
  }
}

}  // namespace moed::runtime
