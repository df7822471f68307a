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
#include <numeric>
#include <thread>

#include "common/clock.h"
#include "common/error.h"
#include "common/log.h"
#include "placement/memory_plan.h"
#include "placement/placement_file.h"
#include "placement/survivors.h"
#include "runtime/config/memory_estimate.h"
#include "runtime/daemon/daemon.h"
#include "runtime/daemon/stop_signal.h"

namespace moed::runtime {

namespace {

constexpr std::size_t kKeptLosses = 16;  // status shows the last ones; nothing grows with losses

}  // namespace

std::vector<int> Daemon::serving_ranks() const {
  std::vector<int> serving(static_cast<std::size_t>(serving_ranks_));
  std::iota(serving.begin(), serving.end(), 0);
  return serving;
}

void Daemon::watch_for_losses(const comm::View& view, bool spare) {
  comm::PeerMessenger* messenger = transport_->messenger();
  MOED_CHECK(messenger, "[comm].elastic over the {} transport, which carries no peer messages", transport_->name());
  placement_world_ = view.members;
  epoch_served_ = spare ? 0 : view.epoch;
  lease_.emplace(comm::FencingLease::length_for(std::chrono::milliseconds(config_.comm.lease_ms),
                                               std::chrono::milliseconds(config_.comm.timeout_ms)));
  agreement_ = std::make_unique<comm::SurvivorAgreement>(*messenger, view,
                                                         std::chrono::milliseconds(config_.comm.timeout_ms), spare);
  // A rank blocked in a step answers the agreement from there, and leaves
  // the step once one began: its silence would let the others decide without it.
  transport_->set_wait_hook([this] { throw_if_loss_under_way(); });
  // moectl admit, on whichever rank coordinates.
  if (serving_ranks_ < world_topology_->ranks())
    control_plane_->on_admit([this](int wanted) { return waiting_spares(std::size_t(wanted)); });
  if (config_.comm.join_slots > 0)
    control_plane_->on_joiners(
        [this] {
          std::vector<JoinerArrival> arrivals;
          if (join_listener_)
            for (join::JoinArrival& a : join_listener_->take_arrivals())
              arrivals.push_back({a.world_rank, std::move(a.host), std::move(a.address)});
          return arrivals;
        },
        [this](const JoinerArrival& arrival) { reach_joiner(arrival); });
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

bool Daemon::wait_to_join() {
  spdlog::info("rank {}: {}: holding no expert, it waits until the members admit it", rank_,
               config_.comm.join_slots > 0 ? "a joiner (moed --join)" : "a spare ([comm].spares)");
  for (;;) {
    agreement_->poll();
    if (!agreement_->spare()) break;
    if (const int signal = stop_signal()) {
      spdlog::info("rank {}: a spare stopped by {} before it joined", rank_, signal_name(signal));
      return false;
    }
    const std::vector<int>& members = agreement_->view().members;
    if (std::all_of(members.begin(), members.end(), [this](int r) { return agreement_->lost(r); })) {
      spdlog::info("rank {}: a spare: the job's serving ranks have all left; so does it", rank_);
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  const comm::View view = agreement_->view();
  spdlog::info("rank {}: admitted at epoch {} (world ranks {}): joining", rank_, view.epoch,
               fmt::join(view.members, " "));
  try {
    transport_->continue_with(view.members, view.epoch);
    go_on_as(view, 0, std::chrono::steady_clock::now());
  } catch (const comm::PeersUnreachable& e) {
    // It holds nothing yet, and the others go on without it (it stops answering).
    spdlog::error("rank {}: a rank was lost while this spare joined ({}); leaving, the others go on without it",
                  rank_, e.what());
    exit_now(3);
  }
  // Its door opens once it serves: a client's rows never wait at a spare.
  open_front_door(transport_->world_rank(transport_->rank()), world_topology_->ranks());
  return true;
}

void Daemon::go_on_after_losses(std::vector<int> suspects, std::uint64_t step,
                                std::chrono::steady_clock::time_point cut_short) {
  for (;;) {  // another loss while the survivors rebuild: agree again
    try {
      go_on_without(suspects, step, cut_short);
      return;
    } catch (const comm::PeersUnreachable& again) {
      spdlog::warn("step {}, going on without a lost rank: {}", step, again.what());
      suspects = again.ranks();
    }
  }
}

void Daemon::go_on_without(const std::vector<int>& suspects, std::uint64_t step,
                           std::chrono::steady_clock::time_point cut_short) {
  // The exchanges cut short are closed; their buffers stay until continue_with.
  if (engine_) engine_->abandon_step();
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
  go_on_as(view, step, cut_short);
}

void Daemon::share_state_with_joiners() {
  std::string text;
  if (transport_->rank() == 0) {
    const std::vector<double> biases = engine_ ? engine_->router_biases() : std::vector<double>{};
    text = nlohmann::json{{"placement", placement::format_placement(placement_, layer_numbers(config_.model))},
                          {"world", placement_world_},
                          {"biases", biases}}
               .dump();
  }
  control_.broadcast_text(text, "what the ranks that join take up");
  if (engine_) return;  // a member already: it holds all this
  const nlohmann::json state = nlohmann::json::parse(text);
  placement_ = placement::parse_placement(state.at("placement").get<std::string>(), "rank 0's placement",
                                          layer_numbers(config_.model));
  placement_world_ = state.at("world").get<std::vector<int>>();
  joined_biases_ = state.at("biases").get<std::vector<double>>();
}

void Daemon::go_on_as(const comm::View& view, std::uint64_t step, std::chrono::steady_clock::time_point cut_short) {
  epoch_served_ = view.epoch;
  epoch_settled_ = false;
  // Spares admitted: members the placement has no rank for. Spares are the
  // job's last world ranks, so they come after every other member.
  std::vector<int> joined_world;
  for (int r : view.members)
    if (!std::binary_search(placement_world_.begin(), placement_world_.end(), r)) joined_world.push_back(r);
  if (!joined_world.empty()) share_state_with_joiners();

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
  MOED_CHECK(plan.members.size() + joined_world.size() == view.members.size(),
             "{} ranks of the placement survive and {} join, the epoch has {} members", plan.members.size(),
             joined_world.size(), view.members.size());
  plan.placement = placement::with_newcomers(plan.placement, int(joined_world.size()));
  const int rank = transport_->rank(), ranks = transport_->size();
  const std::vector<std::pair<int, int>> mine =
      std::size_t(rank) < plan.to_load.size() ? plan.to_load[std::size_t(rank)] : std::vector<std::pair<int, int>>{};
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

  // The engine and the control plane over the members; the old engine's
  // buffers were kept until continue_with returned.
  std::unique_ptr<Engine> old = std::move(engine_);
  placement_ = std::move(plan.placement);
  placement_world_ = view.members;
  topology_.emplace(placement::topology_on_members(*world_topology_, view.members));
  rank_ = rank;
  engine_ = std::make_unique<Engine>(config_, *transport_, *topology_, placement_, *store_, workload_.get());
  if (stats_) engine_->record_stats_into(&*stats_, std::size_t(config_.stats.follow_tokens));
  std::vector<double> biases = old ? old->router_biases() : std::move(joined_biases_);
  if (!biases.empty()) engine_->set_router_biases(std::move(biases));
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
  if (rank == 0 && !join_listener_ && config_.comm.join_slots > 0) {  // so too the join listener
    try {
      open_join_listener();
    } catch (const Error& e) {
      spdlog::error("the survivors' rank 0 cannot take over the join listener: {}", e.describe());
    }
  }

  // The steps go on from one number on every member (some may have
  // finished the step the loss cut short; a rank that joins knows none).
  double next = double(step + 1);  // exact: steps stay far below 2^53
  control_.reduce_max(&next, 1, "the step the members go on from");
  control_.broadcast(&next, sizeof next, "the step the members go on from");
  resume_at_ = std::uint64_t(next);

  const double paused_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - cut_short).count();
  std::string alert;
  if (!lost_world.empty())
    alert = fmt::format("lost world rank(s) {} at step {}: epoch {} serves on world ranks {}; {} expert(s) of the "
                        "lost loaded from the checkpoint here; {}serving paused {:.0f} ms on this rank",
                        fmt::join(lost_world, " "), step, view.epoch, fmt::join(view.members, " "), mine.size(),
                        migration.empty() ? "" : migration + "; ", paused_ms);
  if (!joined_world.empty())
    alert += fmt::format("{}world rank(s) {} joined ({}) at step {}: epoch {} serves on world ranks {}; serving "
                         "paused {:.0f} ms on this rank",
                         alert.empty() ? "" : "; ", fmt::join(joined_world, " "),
                         config_.comm.join_slots > 0 ? "moed --join" : "spares", std::uint64_t(next) - 1, view.epoch,
                         fmt::join(view.members, " "), paused_ms);
  spdlog::warn("{}", alert);
  ranks_lost_ += int(lost_world.size());
  ranks_joined_ += int(joined_world.size());
  losses_.push_back({{"lost", lost_world},
                     {"joined", joined_world},
                     {"step", step},
                     {"epoch", view.epoch},
                     {"at", now_seconds()},
                     {"orphans_loaded_here", mine.size()},
                     {"migration", migration.empty() ? nlohmann::json(nullptr) : nlohmann::json(migration)},
                     {"paused_ms", paused_ms},
                     {"alert", alert}});
  if (losses_.size() > kKeptLosses) losses_.erase(losses_.begin());
  snapshot_->set_survivors({{"epoch", view.epoch},
                            {"members", view.members},
                            {"rank", rank},
                            {"ranks_lost", ranks_lost_},
                            {"ranks_joined", ranks_joined_},
                            {"losses", losses_}});

  if (rank != 0) return;
  if (!joined_world.empty()) {  // the newcomers take their share of the slots by the migration path
    std::vector<int> newcomers;
    for (int r : joined_world)
      newcomers.push_back(int(std::find(view.members.begin(), view.members.end(), r) - view.members.begin()));
    control_plane_->give_load_to(std::move(newcomers));
  }
  spares_for_lost_ += lost_world.size();  // admitted once every member has finished this rebuild
}

std::vector<int> Daemon::waiting_spares(std::size_t wanted) const {
  std::vector<int> spares;
  const std::vector<int>& members = agreement_->view().members;
  for (int r = serving_ranks_; r < world_topology_->ranks() && spares.size() < wanted; ++r)
    if (present_[std::size_t(r)] && !std::binary_search(members.begin(), members.end(), r) && !agreement_->lost(r))
      spares.push_back(r);
  return spares;
}

void Daemon::admit_at_boundary() {
  const bool takes_joiners = rank_ == 0 && config_.comm.join_slots > 0;
  if (takes_joiners) welcome_joiners();  // a joiner reached is answered
  // Until a turn's counts came from every member, one may still be in the
  // rebuild's last collective: an agreement begun now would cut that
  // short, and that member's record of the loss with it.
  if (!epoch_settled_) return;
  admit(control_plane_->take_admission(), "(moectl admit)");
  admit(waiting_spares(std::exchange(spares_for_lost_, 0)), "in place of the lost");
  if (takes_joiners) admit(waiting_spares(std::size_t(config_.comm.join_slots)), "as they joined (moed --join)");
}

void Daemon::admit(const std::vector<int>& spares, const char* why) {
  if (!spares.empty() && agreement_->admit(spares))
    spdlog::warn("rank 0: admitting spare world rank(s) {} {}", fmt::join(spares, " "), why);
}

void Daemon::meet_before_leaving() {
  if (!agreement_ || spare()) return;  // a spare never admitted is no member
  try {
    control_.all_max(0, "the members' last meeting before leaving");
  } catch (const std::exception& e) {
    spdlog::info("rank {}: the last meeting before leaving ended early: {}", rank_, e.what());
  }
}

std::uint64_t Daemon::next_step(std::uint64_t step) {
  if (!resume_at_) return step + 1;
  const std::uint64_t next = *resume_at_;
  resume_at_.reset();
  return next;
}

}  // namespace moed::runtime
