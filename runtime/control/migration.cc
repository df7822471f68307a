#include "runtime/control/migration.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <cstring>

#include "common/error.h"
#include "runtime/control/fault_injection.h"

namespace moed::runtime {

std::uint64_t weights_checksum(const void* data, std::size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  std::uint64_t h = 0xCBF29CE484222325ull;
  std::size_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    std::uint64_t w;
    std::memcpy(&w, p + i, 8);
    h = (h ^ w) * 0x100000001B3ull;
  }
  for (; i < bytes; ++i) h = (h ^ p[i]) * 0x100000001B3ull;
  return h ^ bytes;
}

AfterLoss after_loss(bool part_in_migration, bool switched_here, bool verified_here, std::uint64_t epoch_here,
                     std::uint64_t newest) {
  MOED_CHECK(newest >= epoch_here, "the survivors' newest placement epoch {} is older than this rank's {}", newest,
             epoch_here);
  if (!part_in_migration) {
    if (newest == epoch_here) return AfterLoss::nothing;
    MOED_THROW(Runtime, "a survivor switched to placement epoch {} while this rank, at epoch {}, had no part in a "
               "migration: the survivors cannot agree on a placement (the restart path takes over)", newest, epoch_here);
  }
  if (switched_here) return AfterLoss::finish;
  if (newest == epoch_here) return AfterLoss::roll_back;
  if (verified_here) return AfterLoss::roll_forward;
  MOED_THROW(Runtime, "a survivor switched to placement epoch {} before this rank verified what landed of the "
             "migration: the survivors cannot agree on a placement (the restart path takes over)", newest);
}

std::vector<std::size_t> window_offsets(const std::vector<placement::Move>& moves, const SlotBytes& slot_bytes,
                                        int ranks, std::vector<std::size_t>* bytes_per_rank) {
  std::vector<std::size_t> next(ranks, 0), offsets(moves.size(), 0);
  for (std::size_t i = 0; i < moves.size(); ++i) {
    if (moves[i].to < 0) continue;
    offsets[i] = next[moves[i].to];
    next[moves[i].to] += slot_bytes(moves[i].shards);
  }
  if (bytes_per_rank) *bytes_per_rank = next;
  return offsets;
}

MigrationFaults MigrationFaults::from_env() {
  MigrationFaults f;
  const std::optional<Fault> fault = fault_from_env();
  if (!fault) return f;
  if (fault->kind == Fault::Kind::MigrateFail) f.fail_source = fault->rank;
  if (fault->kind == Fault::Kind::MigrateCorrupt) f.corrupt_destination = fault->rank;
  if (fault->kind == Fault::Kind::MigrateKill) f.killed_source = fault->rank;
  if (fault->kind == Fault::Kind::MigrateHold) f.held_source = fault->rank;
  if (fault->kind == Fault::Kind::MigrateCommitKill) f.killed_at_commit = fault->rank;
  return f;
}

comm::WeightMover& MigrationWindows::get(const std::vector<std::size_t>& need, std::size_t mine,
                                       const std::string& what) {
  bool fits = window_ && sizes_.size() == need.size();
  for (std::size_t r = 0; fits && r < need.size(); ++r) fits = need[r] <= sizes_[r];
  if (!fits) {
    // Grown to cover both the old and the new needs, so that migrations that
    // go back and forth between ranks settle on one window.
    std::vector<std::size_t> sizes = need;
    for (std::size_t r = 0; r < sizes.size() && r < sizes_.size(); ++r) sizes[r] = std::max(sizes[r], sizes_[r]);
    const auto me = std::size_t(rank_);
    if (mine < need[me]) sizes[me] = mine;  // a refusing rank takes nothing
    window_.reset();  // collective, before the new one takes its memory
    window_ = make_(sizes[me], what);
    sizes_ = std::move(sizes);
  }
  return *window_;
}

MigrationTransfer::MigrationTransfer(std::uint64_t id, std::vector<placement::Move> moves, int rank, int ranks,
                                     ExpertStore& store, MigrationWindows& windows, MigrationFaults faults)
    : id_(id),
      moves_(std::move(moves)),
      rank_(rank),
      ranks_(ranks),
      store_(store),
      faults_(faults),
      slot_bytes_([&store](int shards) { return store.slot_bytes(shards); }),
      windows_(windows) {}

MigrationTransfer::~MigrationTransfer() {
  // An abort may come with copies in flight: they land before the window
  // can be reused or freed.
  if (issued_ > sent_ && window_) {
    try {
      window_->wait(fmt::format("puts of migration {} at its end", id_));
    } catch (const std::exception& e) {
      spdlog::warn("migration {}: {}", id_, e.what());
    }
  }
}

std::optional<std::string> MigrationTransfer::prepare(std::size_t memory_budget_bytes) {
  std::vector<std::size_t> incoming;
  offsets_ = window_offsets(moves_, slot_bytes_, ranks_, &incoming);
  // Every rank takes part in the window's creation, refusing or not.
  std::optional<std::string> refusal;
  std::size_t want = incoming[rank_];
  // What every rank holds whole (shared experts, dense layers) counts against the budget too.
  const std::size_t held = store_.expert_bytes() + store_.shared_bytes();
  if (memory_budget_bytes > 0 && held + want > memory_budget_bytes) {
    // In MB with enough digits that the sum visibly exceeds the budget.
    refusal = fmt::format("rank {} has {:.6g} MB of experts; {:.6g} MB more exceed its budget of {:.6g} MB "
                          "([migration].memory_mb)",
                          rank_, double(held) / 1e6, double(want) / 1e6, double(memory_budget_bytes) / 1e6);
    want = 0;
  }
  // Each rank's part of the window: the slots it receives, then its own
  // outgoing slots, staged there because registered memory is what UCX puts
  // from fastest (zero-copy where the transport has it).
  std::vector<std::size_t> need = incoming;
  for (const auto& m : moves_)
    if (m.from >= 0 && m.to >= 0 && m.from != m.to) need[std::size_t(m.from)] += move_bytes(m);
  const std::size_t staging = incoming[rank_];
  incoming_bytes_ = refusal ? 0 : staging;
  window_ = &windows_.get(need, want + need[rank_] - incoming[rank_], fmt::format("window of migration {}", id_));
  std::size_t at = refusal ? 0 : staging;
  for (std::size_t i = 0; i < moves_.size(); ++i) {
    const placement::Move& m = moves_[i];
    if (m.from != rank_ || m.to < 0) continue;
    const std::pair<int, int> held = m.cut ? std::pair(0, 1) : std::pair(m.shard, m.shards);
    MOED_CHECK(store_.shard_of(m.layer, m.expert) == held,
               "migration {}: rank {} is to send shard {} of {} of layer {} expert {}, which it does not hold{}", id_,
               rank_, m.shard, m.shards, m.layer, m.expert, m.cut ? " whole" : "");
    // Cut moves send one shard of the whole copy; a holder keeping a shard cuts it in place.
    const auto copy = [&](std::size_t offset) {
      auto* out = reinterpret_cast<std::uint8_t*>(window_->local().data() + offset);
      if (m.cut)
        store_.copy_shard(m.layer, m.expert, m.shard, m.shards, out);
      else
        store_.copy_slot(m.layer, m.expert, out);
    };
    if (m.to == rank_) {
      if (!refusal) copy(offsets_[i]), to_self_.push_back(i);
      continue;
    }
    copy(at);
    outgoing_.emplace_back(i, at);
    at += move_bytes(m);
    to_send_ += move_bytes(m);
  }
  return refusal;
}

void MigrationTransfer::send(std::size_t budget) {
  if (faults_.killed_source == rank_ && !outgoing_.empty()) {
    spdlog::warn("MOED_FAULT: rank {} dies during migration {}", rank_, id_);
    std::raise(SIGKILL);
  }
  if (faults_.held_source == rank_) return;  // nothing sent: the migration stays in transfer
  // The copies of the last boundary have had a whole step to land (an RDMA
  // NIC, or UCX progress in the step's own waits, moves them meanwhile).
  if (issued_ > sent_) {
    window_->wait(fmt::format("transfer of migration {}", id_));
    sent_ = issued_;
    if (faults_.fail_source == rank_)
      MOED_THROW(Runtime, "MOED_FAULT: rank {} fails its transfer after {} of {} bytes", rank_, sent_, to_send_);
  }
  std::size_t left = budget;
  std::size_t position = 0;  // byte position over all outgoing slots
  for (const auto& [i, staged] : outgoing_) {
    const std::size_t bytes = move_bytes(moves_[i]), end = position + bytes;
    if (issued_ < end && left > 0) {
      const std::size_t within = issued_ - position;
      const std::size_t n = std::min(left, bytes - within);
      window_->start_copy(moves_[i].to, offsets_[i] + within, window_->local().subspan(staged + within, n));
      issued_ += n;
      left -= n;
    }
    position = end;
  }
}

std::vector<std::pair<std::size_t, std::uint64_t>> MigrationTransfer::source_checksums() const {
  std::vector<std::pair<std::size_t, std::uint64_t>> sums;
  for (const auto& [i, staged] : outgoing_)
    sums.emplace_back(i, weights_checksum(window_->local().data() + staged, move_bytes(moves_[i])));
  for (std::size_t i : to_self_)
    sums.emplace_back(i, weights_checksum(window_->local().data() + offsets_[i], move_bytes(moves_[i])));
  return sums;
}

std::vector<std::size_t> MigrationTransfer::verify(const std::vector<std::uint64_t>& expected) {
  std::vector<std::size_t> bad;
  for (std::size_t i = 0; i < moves_.size(); ++i) {
    if (moves_[i].to != rank_) continue;
    std::byte* landed = window_->local().data() + offsets_[i];
    const std::size_t bytes = move_bytes(moves_[i]);
    if (faults_.corrupt_destination == rank_) landed[bytes / 2] ^= std::byte{0x40};
    if (weights_checksum(landed, bytes) != expected.at(i)) bad.push_back(i);
  }
  return bad;
}

void MigrationTransfer::install() {
  for (std::size_t i = 0; i < moves_.size(); ++i)
    if (const placement::Move& m = moves_[i]; m.to == rank_)
      store_.add_slot(m.layer, m.expert, reinterpret_cast<const std::uint8_t*>(landed() + offsets_[i]), m.shard,
                      m.shards, m.cut && store_.holds(m.layer, m.expert));
}

void MigrationTransfer::keep_landed() {
  if (!window_) return;  // kept already (a second loss during the survivors' rebuild)
  landed_.assign(window_->local().begin(), window_->local().begin() + std::ptrdiff_t(incoming_bytes_));
  window_ = nullptr;
}

void MigrationTransfer::release() {
  for (const auto& m : moves_)
    if (m.drop == rank_) store_.drop_slot(m.layer, m.expert);
}

}  // namespace moed::runtime
