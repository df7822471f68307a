// Elastic serving in the daemon ([comm].elastic, docs/elastic.md): a lost
// rank costs the survivors an agreement and a rebuild, not a restart.
//
// A rank notices a loss in one of two ways: an exchange or a control
// collective of a step throws PeersUnreachable (its watch endpoint reported
// the peer, or the deadline passed), or the survivors' agreement, polled at
// each turn and from every wait of the transport, says another rank began
// one. Either way the rank leaves the step, agrees on the survivors, and
// goes on over the same transport with them (Transport::continue_with): a
// migration under way finished or undone alike on every survivor, the
// placement without the lost slots, the orphans loaded from the
// checkpoint by the survivors that adopt them, the engine rebuilt. What the
// process holds stays: its store, its front door, its admin socket. The
// rows the loss cut short are served first on the new epoch.
#include <fmt/ranges.h>

#include <algorithm>

#include "common/clock.h"
#include "common/error.h"
#include "common/log.h"
#include "placement/memory_plan.h"
#include "placement/survivors.h"
#include "runtime/config/memory_estimate.h"
#include "runtime/daemon/daemon.h"

namespace moed::runtime {

namespace {

constexpr std::size_t kKeptLosses = 16;  // status shows the last ones; nothing grows with losses

}  // namespace

void Daemon::watch_for_losses() {
  comm::PeerMessenger* messenger = transport_->messenger();
  MOED_CHECK(messenger, "[comm].elastic over the {} transport, which carries no peer messages", transport_->name());
  comm::View world;
  for (int r = 0; r < transport_->size(); ++r) world.members.push_back(r);
  placement_world_ = world.members;
  agreement_ = std::make_unique<comm::SurvivorAgreement>(*messenger, world,
                                                         std::chrono::milliseconds(config_.comm.timeout_ms));
  // A rank blocked in a step answers the agreement from there, and leaves
  // the step once one began: its silence would let the others decide without it.
  transport_->set_wait_hook([this] { throw_if_loss_under_way(); });
}

void Daemon::throw_if_loss_under_way() {
  agreement_->poll();
  if (agreement_->agreeing() || agreement_->fenced() || agreement_->view().epoch != epoch_served_)
    throw comm::PeersUnreachable({}, "the survivors' agreement began", __FILE__, __LINE__);
}

void Daemon::leave_if_fenced() {
  agreement_->poll();
  if (!agreement_->fenced()) return;
  // Nothing this rank holds may reach a client: its peers may have reused
  // the blocks it read, and its clients submit again elsewhere.
  spdlog::error("rank {}: the other ranks went on without this one at epoch {} (it was stopped or cut off past "
                "[comm].timeout_ms); leaving without answering",
                transport_->world_rank(transport_->rank()), agreement_->view().epoch);
  exit_now(3);
}

void Daemon::go_on_without(const std::vector<int>& suspects, std::uint64_t step,
                           std::chrono::steady_clock::time_point cut_short) {
  // The exchanges cut short are closed; their buffers stay until continue_with.
  engine_->abandon_step();
  control_plane_->abandon_for_loss();
  for (int rank : suspects) agreement_->suspect(rank);
  const std::chrono::milliseconds limit(4 * config_.comm.timeout_ms);
  comm::View view;
  for (;;) {
    view = agreement_->agree(limit);
    leave_if_fenced();
    try {
      transport_->continue_with(view.members, view.epoch);
      break;
    } catch (const comm::PeersUnreachable& e) {  // a member never took the blocks sent it: lost too
      spdlog::warn("{}", e.what());
      for (int rank : e.ranks()) agreement_->suspect(rank);
    }
  }
  epoch_served_ = view.epoch;

  // The placement's ranks are those it was last renumbered over (a loss
  // during an earlier try may have cut that short): those whose world rank
  // is gone are lost.
  std::vector<int> lost, lost_world;
  for (std::size_t r = 0; r < placement_world_.size(); ++r)
    if (!std::binary_search(view.members.begin(), view.members.end(), placement_world_[r]))
      lost.push_back(int(r)), lost_world.push_back(placement_world_[r]);
  // A migration the loss cut short ends alike everywhere before the lost slots go.
  const std::string migration = control_plane_->settle_after_loss(lost_world);
  placement::SurvivorsPlan plan = placement::plan_for_survivors(placement_, lost);
  MOED_CHECK(plan.members.size() == view.members.size(), "{} ranks of the placement survive, the epoch has {} members",
             plan.members.size(), view.members.size());
  const int rank = transport_->rank(), ranks = transport_->size();
  const std::vector<std::pair<int, int>>& mine = plan.to_load[std::size_t(rank)];
  // Orphans this rank adopts: within its memory, loaded before any rank serves again.
  int code = 0;
  try {
    refuse_if_too_large(estimate_rank_memory(config_, placement::slot_groups(plan.placement, rank), ranks, rank),
                        local_ranks_, fmt::format("rank {} adopting {} experts of the lost", rank, mine.size()));
    store_->load_experts(config_, mine);
  } catch (const Error& e) {
    spdlog::error("after losing world rank(s) {}: {}", fmt::join(lost_world, " "), e.describe());
    code = e.exit_code();
  }
  if (control_.all_max(code, "the survivors' loads of orphaned experts") != 0)
    MOED_THROW(Runtime, "a survivor could not take the lost ranks' experts (see its log): the restart path takes over");

  // The engine and the control plane over the survivors; the old engine's
  // buffers were kept until continue_with returned.
  std::unique_ptr<Engine> old = std::move(engine_);
  placement_ = std::move(plan.placement);
  placement_world_ = view.members;
  topology_.emplace(placement::topology_on_members(*topology_, plan.members));
  rank_ = rank;
  engine_ = std::make_unique<Engine>(config_, *transport_, *topology_, placement_, *store_, workload_.get());
  if (stats_) engine_->record_stats_into(&*stats_, std::size_t(config_.stats.follow_tokens));
  if (std::vector<double> biases = old->router_biases(); !biases.empty()) engine_->set_router_biases(std::move(biases));
  engine_->trace_with(&*trace_selector_);
  old.reset();
  control_plane_->placement_renumbered();
  report_->continue_with_ranks(ranks, topology_->describe());
  if (admin_) admin_->set_coordinator(transport_->world_rank(0));
  if (rank == 0 && !http_ && !config_.metrics.listen.empty()) {
    // The lost coordinator's endpoint went with it: this rank serves the
    // job's figures now (from here on; the load heatmap starts empty).
    snapshot_->keep_heatmap(config_);
    try {
      open_metrics_endpoint();
    } catch (const Error& e) {  // serving goes on without it; the operator learns why
      spdlog::error("the survivors' rank 0 cannot take over the metrics endpoint: {}", e.describe());
    }
  }

  // The steps go on from one number on every survivor (some may have
  // finished the step the loss cut short).
  double next = double(step + 1);  // exact: steps stay far below 2^53
  control_.reduce_max(&next, 1, "the step the survivors go on from");
  control_.broadcast(&next, sizeof next, "the step the survivors go on from");
  resume_at_ = std::uint64_t(next);

  const double paused_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - cut_short).count();
  const std::string alert =
      fmt::format("lost world rank(s) {} at step {}: epoch {} serves on world ranks {}; {} expert(s) of the lost "
                  "loaded from the checkpoint here; {}serving paused {:.0f} ms on this rank",
                  fmt::join(lost_world, " "), step, view.epoch, fmt::join(view.members, " "), mine.size(),
                  migration.empty() ? "" : migration + "; ", paused_ms);
  spdlog::warn("{}", alert);
  losses_.push_back({{"lost", lost_world},
                     {"step", step},
                     {"epoch", view.epoch},
                     {"at", now_seconds()},
                     {"orphans_loaded_here", mine.size()},
                     {"migration", migration.empty() ? nlohmann::json(nullptr) : nlohmann::json(migration)},
                     {"paused_ms", paused_ms},
                     {"alert", alert}});
  if (losses_.size() > kKeptLosses) losses_.erase(losses_.begin());
  snapshot_->set_survivors({{"epoch", view.epoch}, {"members", view.members}, {"rank", rank}, {"losses", losses_}});
}

std::uint64_t Daemon::next_step(std::uint64_t step) {
  if (!resume_at_) return step + 1;
  const std::uint64_t next = *resume_at_;
  resume_at_.reset();
  return next;
}

}  // namespace moed::runtime
