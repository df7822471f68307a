// Live migration of expert weights, one rank's side of it.
//
// A migration is a list of slot moves (placement/placement_diff.h: a copy of
// (layer, expert) from rank `from` to rank `to`, releasing `drop`). Every rank
// runs the same stages at the same step boundaries, told by the coordinator
// (runtime/control/control_plane.h):
//   prepare   each destination reserves room (its block of one window, a
//             comm::WeightMover made collectively) or refuses (over
//             [migration].memory_mb);
//   transfer  each source copies its slots into the destinations' blocks, at
//             most [migration].chunk_mb per boundary, and waits for them;
//   verify    each destination checksums what landed against the source's sum;
//   commit    every rank switches to the new placement at one boundary (the
//             destinations install the slots first, so old and new are valid);
//   release   the sources free the slots they gave up.
// Any failure before commit aborts: the window goes, nothing else changed.
// Outputs do not depend on where experts sit, so serving goes on throughout.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/weight_mover.h"
#include "placement/placement_diff.h"
#include "runtime/weights/expert_store.h"

namespace moed::runtime {

using placement::SlotBytes;

// 64-bit checksum of a byte range (FNV-1a over 8-byte words, then the tail).
std::uint64_t weights_checksum(const void* data, std::size_t bytes);

// Where each destination's incoming slots sit in its window: for move i,
// the byte offset in window of moves[i].to (0 for moves without a destination).
// slot_bytes(S) is what a move of one shard of S carries (S = 1: a whole
// expert; ExpertStore::slot_bytes).
std::vector<std::size_t> window_offsets(const std::vector<placement::Move>& moves, const SlotBytes& slot_bytes,
                                        int ranks, std::vector<std::size_t>* bytes_per_rank = nullptr);

// Test hooks (runtime/control/fault_injection.h): the ranks that fail as a source,
// corrupt what lands as a destination, die when they first send, send
// nothing, or die at the boundary that commits.
struct MigrationFaults {
  int fail_source = -1;
  int corrupt_destination = -1;
  int killed_source = -1;
  int held_source = -1;
  int killed_at_commit = -1;
  static MigrationFaults from_env();
};

// Elastic serving: what a survivor does with its part of the migration that
// a lost rank cut short, once the survivors have agreed and know the newest
// placement epoch any of them holds (`newest`). Before the loss every rank
// held the same epoch, but for the switch of that one migration: the
// commit's broadcast may have reached some ranks and not others. A newer
// epoch somewhere means the commit was decided, which rank 0 does only
// after every rank verified what landed, so each survivor can finish it
// from what it kept (MigrationTransfer::keep_landed); otherwise no rank
// switched, and the migration is undone. A Runtime error for a state that
// no loss can produce (the restart path takes over).
enum class AfterLoss {
  nothing,       // no part in a migration
  roll_back,     // nobody switched: drop what was staged and landed
  finish,        // this rank switched: free the slots it gave up
  roll_forward,  // another survivor switched: install what landed here, switch, free
};
AfterLoss after_loss(bool part_in_migration, bool switched_here, bool verified_here, std::uint64_t epoch_here,
                     std::uint64_t newest);

// The windows migrations land in (weight movers: RMA windows over the
// transport), kept from one migration to the next. A fresh window is fresh
// registered memory on every rank, and the first puts into it pay for
// mapping it on the source (a cold 34.6 MB put runs at a fraction of a warm
// one's bandwidth). A window is reused when every rank's part is large
// enough; a new one covers the old parts too. Collective: every rank calls
// get() and drop() at the same boundary with the same arguments.
class MigrationWindows {
 public:
  MigrationWindows(comm::WeightMoverMaker make, int rank) : make_(std::move(make)), rank_(rank) {}
  // A window with at least need[r] bytes on rank r; this rank's part is
  // `mine` bytes when one must be created (0 for a rank that refuses).
  comm::WeightMover& get(const std::vector<std::size_t>& need, std::size_t mine, const std::string& what);
  void drop() { window_.reset(), sizes_.clear(); }

 private:
  comm::WeightMoverMaker make_;
  int rank_;
  std::unique_ptr<comm::WeightMover> window_;
  std::vector<std::size_t> sizes_;  // every rank's part of window_, as asked for
};

class MigrationTransfer {
 public:
  MigrationTransfer(std::uint64_t id, std::vector<placement::Move> moves, int rank, int ranks, ExpertStore& store,
                    MigrationWindows& windows, MigrationFaults faults);
  ~MigrationTransfer();

  std::uint64_t id() const { return id_; }
  const std::vector<placement::Move>& moves() const { return moves_; }

  // Collective. Returns why this rank refuses, if it does.
  std::optional<std::string> prepare(std::size_t memory_budget_bytes);
  // Source side, once per boundary: completes (waits for) the copies the
  // last call started, then starts up to `budget` more bytes, which land
  // while the next step runs. Throws a Runtime error on failure (the caller
  // reports it and the migration aborts).
  void send(std::size_t budget);
  std::size_t sent_bytes() const { return sent_; }  // landed (waited for)
  std::size_t bytes_to_send() const { return to_send_; }
  // Checksums of this rank's outgoing slots, by move index (the sources').
  std::vector<std::pair<std::size_t, std::uint64_t>> source_checksums() const;
  // Destination side: moves whose landed bytes do not match `expected` (by move index).
  std::vector<std::size_t> verify(const std::vector<std::uint64_t>& expected);
  // Destination side: the slots become servable (before the placement switches).
  void install();
  // Source side, after commit: frees the slots given up.
  void release();
  // Elastic serving, when a rank is lost after this rank verified what
  // landed: copies it out of the window, which goes before the survivors
  // renumber; install() reads the copy. Whether some survivor committed is
  // known only once they have agreed (ControlPlane::settle_after_loss).
  void keep_landed();

 private:
  std::uint64_t id_;
  std::vector<placement::Move> moves_;
  int rank_, ranks_;
  ExpertStore& store_;
  MigrationFaults faults_;
  std::size_t move_bytes(const placement::Move& m) const { return slot_bytes_(m.shards); }

  SlotBytes slot_bytes_;
  std::vector<std::size_t> offsets_;
  MigrationWindows& windows_;
  comm::WeightMover* window_ = nullptr;  // from windows_
  std::size_t incoming_bytes_ = 0;       // the head of this rank's block: the slots landing here
  std::vector<std::byte> landed_;        // keep_landed()'s copy of that head, once the window is gone
  const std::byte* landed() const { return window_ ? window_->local().data() : landed_.data(); }
  // This rank's outgoing slots, staged once in its window: (move index, byte offset).
  std::vector<std::pair<std::size_t, std::size_t>> outgoing_;
  // Moves this rank makes to itself (a holder keeping a shard of the expert
  // it splits): cut straight into where they land, never sent.
  std::vector<std::size_t> to_self_;
  std::size_t to_send_ = 0, sent_ = 0, issued_ = 0;
};

}  // namespace moed::runtime
