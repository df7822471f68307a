// Live migration's transfer, checked in one process: a FakeWorld plays every
// rank of a small job (windows are per-rank buffers, copies are memcpy), and
// the test drives each rank's MigrationTransfer through the stages in the
// order the control plane does, rank after rank within a stage.
#include "runtime/control/migration.h"

#include <cstring>
#include <memory>
#include <span>
#include <vector>

#include "placement/placement.h"
#include "placement/placement_diff.h"
#include "runtime/config/config.h"
#include "tests/unit/test_support.h"

namespace moed::runtime {
namespace {

// Every rank's windows, by creation order: the k-th window each rank makes
// is one collective window.
struct FakeWorld {
  explicit FakeWorld(int n) : ranks(n) {}
  int ranks;
  std::vector<std::vector<std::vector<std::byte>*>> generations;  // [k][rank]
  int windows_created = 0;                                         // counted on rank 0
};

// A window of per-rank buffers: a copy lands at once, a wait has nothing to do.
class FakeMover final : public comm::WeightMover {
 public:
  FakeMover(FakeWorld& world, std::size_t generation, std::size_t bytes)
      : world_(world), generation_(generation), memory_(bytes) {}
  std::span<std::byte> local() override { return memory_; }
  void start_copy(int to, std::size_t offset, std::span<const std::byte> from) override {
    std::vector<std::byte>& block = *world_.generations.at(generation_).at(std::size_t(to));
    ASSERT_LE(offset + from.size(), block.size()) << "copy past the end of rank " << to << "'s window";
    std::memcpy(block.data() + offset, from.data(), from.size());
  }
  void wait(const std::string&) override {}
  std::vector<std::byte>& memory() { return memory_; }

 private:
  FakeWorld& world_;
  std::size_t generation_;
  std::vector<std::byte> memory_;
};

// Rank `rank`'s maker of windows in `world`.
comm::WeightMoverMaker fake_movers(FakeWorld& world, int rank) {
  return [&world, rank, created = std::size_t{0}](std::size_t bytes, const std::string&) mutable {
    const std::size_t k = created++;
    if (world.generations.size() <= k)
      world.generations.resize(k + 1, std::vector<std::vector<std::byte>*>(world.ranks));
    auto mover = std::make_unique<FakeMover>(world, k, bytes);
    world.generations[k][std::size_t(rank)] = &mover->memory();
    if (rank == 0) ++world.windows_created;
    return std::unique_ptr<comm::WeightMover>(std::move(mover));
  };
}

Config small_config() {
  return load_config("", {"model.layers=2", "model.experts=4", "model.top_k=1", "model.hidden=8", "model.ffn=4"});
}

// One rank of the job: its store (synthetic weights) and windows.
struct Rank {
  Rank(FakeWorld& world, const Config& c, const placement::Placement& p, int r)
      : rank(r), ranks(world.ranks), store(ExpertStore::load(c, p, r)), windows(fake_movers(world, r), r) {}
  int rank, ranks;
  ExpertStore store;
  MigrationWindows windows;
  std::unique_ptr<MigrationTransfer> transfer;
};

class Migration : public ::testing::Test {
 protected:
  static constexpr int kRanks = 2;
  Migration() : config(small_config()), placement(placement::contiguous(kRanks, 2, 4)), world(kRanks) {
    for (int r = 0; r < kRanks; ++r) ranks.push_back(std::make_unique<Rank>(world, config, placement, r));
  }
  std::size_t slot_bytes() const { return ranks[0]->store.slot_bytes(); }
  std::vector<std::uint8_t> weights_of(int rank, int layer, int expert) const {
    std::vector<std::uint8_t> w(ranks[std::size_t(rank)]->store.slot_bytes());
    ranks[std::size_t(rank)]->store.copy_slot(layer, expert, w.data());
    return w;
  }
  // prepare on every rank; the refusals, by rank.
  std::vector<std::optional<std::string>> prepare(const std::vector<placement::Move>& moves, std::uint64_t id,
                                                  std::size_t budget = 0, MigrationFaults faults = {}) {
    std::vector<std::optional<std::string>> refusals;
    for (auto& r : ranks) {
      r->transfer = std::make_unique<MigrationTransfer>(id, moves, r->rank, r->ranks, r->store, r->windows, faults);
      refusals.push_back(r->transfer->prepare(budget));
    }
    return refusals;
  }
  // transfer in chunks of `chunk` bytes until every source has sent all,
  // then the sources' checksums by move index.
  std::vector<std::uint64_t> transfer(std::size_t chunk, std::size_t moves) {
    bool more = true;
    for (int rounds = 0; more; ++rounds) {
      EXPECT_LT(rounds, 1000) << "the transfer does not end";
      if (rounds >= 1000) break;
      more = false;
      for (auto& r : ranks) {
        r->transfer->send(chunk);
        more = more || r->transfer->sent_bytes() < r->transfer->bytes_to_send();
      }
    }
    std::vector<std::uint64_t> expected(moves, 0);
    for (auto& r : ranks)
      for (const auto& [i, sum] : r->transfer->source_checksums()) expected.at(i) = sum;
    return expected;
  }

  Config config;
  placement::Placement placement;
  FakeWorld world;
  std::vector<std::unique_ptr<Rank>> ranks;
};

TEST_F(Migration, MovesASlotInChunksAndTheWeightsArriveIntact) {
  // Layer 1 expert 3 lives on rank 1 (contiguous: experts 2-3); it moves to rank 0.
  const std::vector<placement::Move> moves{{1, 3, 1, 0, 1}};
  const std::vector<std::uint8_t> original = weights_of(1, 1, 3);
  for (const auto& refusal : prepare(moves, 1)) EXPECT_FALSE(refusal.has_value());
  const std::vector<std::uint64_t> expected = transfer(slot_bytes() / 3 + 1, moves.size());
  EXPECT_EQ(expected[0], weights_checksum(original.data(), slot_bytes()));
  for (auto& r : ranks) EXPECT_TRUE(r->transfer->verify(expected).empty());
  for (auto& r : ranks) r->transfer->install();
  EXPECT_EQ(weights_of(0, 1, 3), original);  // bit for bit
  EXPECT_EQ(ranks[0]->store.slots(), 5);
  for (auto& r : ranks) r->transfer->release();
  EXPECT_EQ(ranks[1]->store.slots(), 3);
}

// Elastic serving: a rank lost after verify, before this one switched. What
// landed is kept out of the window, which goes (the window's bytes are
// overwritten here to prove install() no longer reads it).
TEST_F(Migration, WhatLandedIsKeptWhenTheWindowGoesAndInstallsBitForBit) {
  const std::vector<placement::Move> moves{{1, 3, 1, 0, 1}};
  const std::vector<std::uint8_t> original = weights_of(1, 1, 3);
  prepare(moves, 1);
  const auto expected = transfer(1 << 20, moves.size());
  for (auto& r : ranks) ASSERT_TRUE(r->transfer->verify(expected).empty());
  ranks[0]->transfer->keep_landed();
  ranks[0]->transfer->keep_landed();  // a second loss during the rebuild: nothing more to keep
  for (std::vector<std::byte>* block : world.generations.back()) std::fill(block->begin(), block->end(), std::byte{0xA5});
  ranks[0]->transfer->install();
  EXPECT_EQ(weights_of(0, 1, 3), original);
}

// after_loss: what a survivor does with its part of a migration, by what it
// did before the loss and the newest epoch any survivor holds.
struct AfterLossCase {
  const char* name;
  bool part, switched, verified;
  std::uint64_t here, newest;
  AfterLoss expected;
};
class AfterLosses : public ::testing::TestWithParam<AfterLossCase> {};
TEST_P(AfterLosses, FinishOrUndoAlike) {
  const AfterLossCase& c = GetParam();
  EXPECT_EQ(after_loss(c.part, c.switched, c.verified, c.here, c.newest), c.expected);
}
INSTANTIATE_TEST_SUITE_P(
    Cases, AfterLosses,
    ::testing::Values(AfterLossCase{"NoMigration", false, false, false, 3, 3, AfterLoss::nothing},
                      AfterLossCase{"NobodySwitched", true, false, true, 3, 3, AfterLoss::roll_back},
                      AfterLossCase{"NotYetVerifiedNobodySwitched", true, false, false, 3, 3, AfterLoss::roll_back},
                      AfterLossCase{"SwitchedHere", true, true, true, 4, 4, AfterLoss::finish},
                      AfterLossCase{"AnotherSwitched", true, false, true, 3, 4, AfterLoss::roll_forward}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(AfterLoss, StatesNoLossCanProduceAreErrorsNamingTheEpochs) {
  test::expect_error([] { after_loss(false, false, false, 3, 4); }, ErrorKind::Runtime, {"epoch 4", "no part"});
  test::expect_error([] { after_loss(true, false, false, 3, 4); }, ErrorKind::Runtime, {"epoch 4", "verified"});
  // An all_max below this rank's own epoch is a bug, not a loss.
  test::expect_error([] { after_loss(true, false, true, 5, 4); }, ErrorKind::Internal, {"epoch 4", "5"});
}

TEST_F(Migration, ACopyWithoutDropKeepsTheSourceSlot) {
  const std::vector<placement::Move> moves{{0, 0, 0, 1, -1}};
  prepare(moves, 1);
  const auto expected = transfer(1 << 20, moves.size());
  for (auto& r : ranks) r->transfer->install();
  for (auto& r : ranks) r->transfer->release();
  EXPECT_EQ(weights_of(1, 0, 0), weights_of(0, 0, 0));
  EXPECT_EQ(ranks[0]->store.slots(), 4);
  EXPECT_EQ(ranks[1]->store.slots(), 5);
}

TEST_F(Migration, ADestinationOverItsMemoryBudgetRefuses) {
  const std::size_t held = ranks[0]->store.expert_bytes();
  const auto refusals = prepare({{1, 3, 1, 0, 1}}, 1, held + slot_bytes() - 1);
  ASSERT_TRUE(refusals[0].has_value());
  EXPECT_NE(refusals[0]->find("[migration].memory_mb"), std::string::npos) << *refusals[0];
  EXPECT_FALSE(refusals[1].has_value()) << "the source has room: it gives a slot away";
}

TEST_F(Migration, CorruptedBytesFailVerification) {
  MigrationFaults faults;
  faults.corrupt_destination = 0;
  const std::vector<placement::Move> moves{{1, 2, 1, 0, 1}};
  prepare(moves, 1, 0, faults);
  const auto expected = transfer(1 << 20, moves.size());
  EXPECT_EQ(ranks[0]->transfer->verify(expected), std::vector<std::size_t>{0});
}

TEST_F(Migration, AFailingSourceThrowsWhenItsFirstChunkHasLanded) {
  MigrationFaults faults;
  faults.fail_source = 1;
  prepare({{1, 2, 1, 0, 1}}, 1, 0, faults);
  ranks[1]->transfer->send(16);  // starts the first chunk
  EXPECT_EQ(ranks[1]->transfer->sent_bytes(), 0u) << "nothing has landed before the next boundary";
  test::expect_error([&] { ranks[1]->transfer->send(16); }, ErrorKind::Runtime, {"MOED_FAULT", "rank 1"});
}

TEST_F(Migration, AHeldSourceSendsNothingWhateverItsBudget) {
  MigrationFaults faults;
  faults.held_source = 1;
  prepare({{1, 2, 1, 0, 1}}, 1, 0, faults);
  for (int boundary = 0; boundary < 3; ++boundary) ranks[1]->transfer->send(1 << 20);
  EXPECT_EQ(ranks[1]->transfer->bytes_to_send(), slot_bytes());
  EXPECT_EQ(ranks[1]->transfer->sent_bytes(), 0u) << "the migration must stay in transfer";
}

TEST_F(Migration, WindowsAreKeptAndGrownNotRemadeEachTime) {
  auto run = [&](const std::vector<placement::Move>& moves, std::uint64_t id) {
    prepare(moves, id);
    const auto expected = transfer(1 << 20, moves.size());
    for (auto& r : ranks) ASSERT_TRUE(r->transfer->verify(expected).empty());
    for (auto& r : ranks) r->transfer->install();
    for (auto& r : ranks) r->transfer->release();
  };
  const std::vector<std::uint8_t> original = weights_of(0, 0, 0);
  run({{0, 0, 0, 1, 0}}, 1);  // rank 0 -> 1: a first window, one slot on each rank
  EXPECT_EQ(world.windows_created, 1);
  run({{0, 0, 1, 0, 1}}, 2);  // and back: a source stages its slot in its own part, so it fits
  EXPECT_EQ(world.windows_created, 1);
  run({{0, 0, 0, 1, 0}, {0, 1, 0, 1, 0}}, 3);  // two slots each: the window grows
  EXPECT_EQ(world.windows_created, 2);
  run({{0, 0, 1, 0, 1}, {0, 1, 1, 0, 1}}, 4);
  EXPECT_EQ(world.windows_created, 2);
  EXPECT_EQ(weights_of(0, 0, 0), original) << "three trips through kept windows";
  for (auto& r : ranks) r->windows.drop();
  run({{0, 1, 0, 1, 0}}, 5);  // after a drop (an abort), a new one
  EXPECT_EQ(world.windows_created, 3);
}

// A split expert's shard moves whole, at 1/S of a slot's bytes, and the
// destination serves it as that shard (F/S, its share of the chunks).
TEST(MigrationOfAShard, MovesTheShardsOwnWeights) {
  const Config c = load_config("", {"model.layers=2", "model.experts=4", "model.top_k=1", "model.hidden=8",
                                    "model.ffn=8", "experts.ffn_chunks=4"});
  placement::Placement p = placement::contiguous(3, 2, 4);
  p.set_shards(1, 2, {0, 1});
  FakeWorld world(3);
  std::vector<std::unique_ptr<Rank>> ranks;
  for (int r = 0; r < 3; ++r) ranks.push_back(std::make_unique<Rank>(world, c, p, r));
  const std::size_t shard_bytes = ranks[1]->store.slot_bytes(2);
  ASSERT_EQ(shard_bytes * 2, ranks[1]->store.slot_bytes());
  std::vector<std::uint8_t> original(shard_bytes);
  ranks[1]->store.copy_slot(1, 2, original.data());
  const std::vector<placement::Move> moves{{1, 2, 1, 2, 1, 1, 2}};
  for (auto& r : ranks) {
    r->transfer = std::make_unique<MigrationTransfer>(1, moves, r->rank, r->ranks, r->store, r->windows,
                                                      MigrationFaults{});
    EXPECT_FALSE(r->transfer->prepare(0).has_value());
  }
  EXPECT_EQ(ranks[1]->transfer->bytes_to_send(), shard_bytes);
  for (auto& r : ranks) r->transfer->send(1 << 20);
  for (auto& r : ranks) r->transfer->send(0);  // flushes
  std::vector<std::uint64_t> expected(1, 0);
  for (auto& r : ranks)
    for (const auto& [i, sum] : r->transfer->source_checksums()) expected.at(i) = sum;
  EXPECT_EQ(expected[0], weights_checksum(original.data(), shard_bytes));
  for (auto& r : ranks) EXPECT_TRUE(r->transfer->verify(expected).empty());
  for (auto& r : ranks) r->transfer->install();
  for (auto& r : ranks) r->transfer->release();
  EXPECT_FALSE(ranks[1]->store.holds(1, 2));
  EXPECT_EQ(ranks[2]->store.shard_of(1, 2), (std::pair{1, 2}));
  const kernels::ExpertView view = ranks[2]->store.expert(1, 2);
  EXPECT_EQ(view.ffn, 4u);
  EXPECT_EQ(view.chunks, 2u);
  std::vector<std::uint8_t> landed(shard_bytes);
  ranks[2]->store.copy_slot(1, 2, landed.data());
  EXPECT_EQ(landed, original);
  // A rank asked to send a shard it does not hold says so.
  const std::vector<placement::Move> wrong{{1, 2, 0, 1, 0, 1, 2}};
  FakeWorld other(3);
  Rank r0(other, c, p, 0);
  MigrationTransfer t(2, wrong, 0, 3, r0.store, r0.windows, MigrationFaults{});
  test::expect_error([&] { t.prepare(0); }, ErrorKind::Internal, {"shard 1 of 2", "does not hold"});
}

// A whole expert split by a migration: rank 1 keeps shard 1 cut from its own
// copy (never sent), shard 0 is cut and sent to rank 2, and both then hold
// the shards a start from the split placement loads.
TEST(MigrationThatSplits, CutsTheShardsFromTheWholeCopy) {
  const Config c = load_config("", {"model.layers=2", "model.experts=4", "model.top_k=1", "model.hidden=8",
                                    "model.ffn=8", "experts.ffn_chunks=4"});
  const placement::Placement whole = placement::contiguous(3, 2, 4);  // layer 1 expert 2 on rank 1
  placement::Placement split = whole;
  split.set_shards(1, 2, {2, 1});
  const std::vector<placement::Move> moves = placement::moves(whole, split);
  ASSERT_EQ(moves.size(), 2u);
  FakeWorld world(3);
  std::vector<std::unique_ptr<Rank>> ranks;
  for (int r = 0; r < 3; ++r) ranks.push_back(std::make_unique<Rank>(world, c, whole, r));
  const std::size_t shard_bytes = ranks[1]->store.slot_bytes(2);
  for (auto& r : ranks) {
    r->transfer = std::make_unique<MigrationTransfer>(1, moves, r->rank, r->ranks, r->store, r->windows,
                                                      MigrationFaults{});
    EXPECT_FALSE(r->transfer->prepare(0).has_value());
  }
  EXPECT_EQ(ranks[1]->transfer->bytes_to_send(), shard_bytes);  // shard 1 stays on rank 1
  for (auto& r : ranks) r->transfer->send(1 << 20);
  for (auto& r : ranks) r->transfer->send(0);
  std::vector<std::uint64_t> expected(moves.size(), 0);
  for (auto& r : ranks)
    for (const auto& [i, sum] : r->transfer->source_checksums()) expected.at(i) = sum;
  for (auto& r : ranks) EXPECT_TRUE(r->transfer->verify(expected).empty());
  for (auto& r : ranks) r->transfer->install();
  for (auto& r : ranks) r->transfer->release();
  EXPECT_EQ(placement::apply_moves(whole, moves), split);
  for (int r : {2, 1}) {
    const ExpertStore loaded = ExpertStore::load(c, split, r);
    std::vector<std::uint8_t> got(shard_bytes), want(shard_bytes);
    ranks[std::size_t(r)]->store.copy_slot(1, 2, got.data());
    loaded.copy_slot(1, 2, want.data());
    EXPECT_EQ(ranks[std::size_t(r)]->store.shard_of(1, 2), loaded.shard_of(1, 2)) << "rank " << r;
    EXPECT_EQ(got, want) << "rank " << r;
  }
  EXPECT_FALSE(ranks[0]->store.holds(1, 2));
}

TEST(WindowOffsets, PackEachDestinationsSlotsInMoveOrder) {
  const std::vector<placement::Move> moves{{0, 0, 0, 2, 0}, {0, 1, 1, 2, -1}, {1, 0, 2, 0, 2}, {1, 1, 0, -1, 0}};
  std::vector<std::size_t> per_rank;
  const auto offsets = window_offsets(moves, [](int shards) { return std::size_t(100 / shards); }, 3, &per_rank);
  EXPECT_EQ(offsets, (std::vector<std::size_t>{0, 100, 0, 0}));
  EXPECT_EQ(per_rank, (std::vector<std::size_t>{100, 0, 200}));
}

TEST(WeightsChecksum, SeesOneFlippedBitAnywhere) {
  std::vector<std::byte> bytes(203);
  for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = std::byte(i * 7);
  const std::uint64_t sum = weights_checksum(bytes.data(), bytes.size());
  EXPECT_EQ(sum, weights_checksum(bytes.data(), bytes.size()));
  for (std::size_t i : {std::size_t{0}, std::size_t{100}, std::size_t{202}}) {  // words and the tail
    bytes[i] ^= std::byte{1};
    EXPECT_NE(weights_checksum(bytes.data(), bytes.size()), sum) << "byte " << i;
    bytes[i] ^= std::byte{1};
  }
}

}  // namespace
}  // namespace moed::runtime
