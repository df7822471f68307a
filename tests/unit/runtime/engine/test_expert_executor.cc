// The expert side of a layer (runtime/engine/expert_executor.h) and the store it
// reads (runtime/weights/expert_store.h): a call's answers are each row's
// FFN output, copied as fp32 for a row of one pair and added gate-weighted in
// fixed point otherwise, whatever the block cut; and a store's slots survive
// the flat fp32 form that live migration moves, packed or not.
#include "runtime/engine/cpu_expert_executor.h"

#include <gtest/gtest.h>

#include <bit>
#include <cstring>
#include <vector>

#include "common/rng.h"
#include "kernels/cpu/fixed_combine.h"
#include "placement/placement.h"
#include "runtime/config/config.h"
#include "runtime/weights/expert_store.h"
#include "tests/unit/test_support.h"

namespace moed::runtime {
namespace {

constexpr int kHidden = 8, kFfn = 12, kExperts = 4;

Config small_config(Gemm gemm) {
  Config c = default_config();
  c.model.layers = 2;
  c.model.experts = kExperts;
  c.model.top_k = 2;
  c.model.hidden = kHidden;
  c.model.ffn = kFfn;
  c.experts.gemm = gemm;
  return c;
}

std::vector<float> rows_of(std::size_t n, std::uint64_t seed) {
  CounterRng rng(seed);
  std::vector<float> x(n * kHidden);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = rng.normalish(i);
  return x;
}

TEST(ExpertExecutor, AnswersAreEachRowsOutputWhateverTheBlockCut) {
  const Config c = small_config(Gemm::fixed_order);
  const ExpertStore store = ExpertStore::load(c, placement::contiguous(1, 2, kExperts), 0);
  const kernels::ExpertView expert = store.expert(1, 2);
  const std::size_t n = 11;
  const std::vector<float> x = rows_of(n, 5);

  // Each row alone, as the reference.
  std::vector<float> alone(n * kHidden), scratch(kernels::expert_ffn_scratch(expert, 1));
  for (std::size_t i = 0; i < n; ++i)
    kernels::expert_ffn(expert, x.data() + i * kHidden, 1, alone.data() + i * kHidden, scratch.data());

  for (std::size_t block : {std::size_t(1), std::size_t(3), std::size_t(64)}) {
    SCOPED_TRACE("blocks of " + std::to_string(block));
    // Even rows carried one pair (fp32 out), odd rows several (weighted fixed-point sums).
    std::vector<float> single(n * kHidden, -1.0f);
    std::vector<std::int64_t> sums(n * kHidden, 7);  // a partial sum already there
    std::vector<ExpertRow> rows;
    for (std::size_t i = 0; i < n; ++i) {
      const bool one = i % 2 == 0;
      std::byte* out = one ? reinterpret_cast<std::byte*>(single.data() + i * kHidden)
                           : reinterpret_cast<std::byte*>(sums.data() + i * kHidden);
      rows.push_back({x.data() + i * kHidden, out, 0.25f + 0.05f * float(i), one});
    }
    CpuExpertExecutor executor(block);
    int polls = 0;
    EXPECT_EQ(executor.run(expert, rows, [&] { ++polls; }).saturated, 0u);
    EXPECT_EQ(polls, int((n + block - 1) / block) - 1);  // between blocks, not after the last
    EXPECT_EQ(executor.calls().size(), (n + block - 1) / block);
    EXPECT_EQ(executor.bytes_copied(), (n + (n + 1) / 2) * kHidden * sizeof(float));  // gathered, then fp32 out

    for (std::size_t i = 0; i < n; ++i) {
      if (i % 2 == 0) {
        for (int h = 0; h < kHidden; ++h)
          ASSERT_EQ(std::bit_cast<std::uint32_t>(single[i * kHidden + h]),
                    std::bit_cast<std::uint32_t>(alone[i * kHidden + h]))
              << "row " << i;
      } else {
        std::vector<std::int64_t> want(kHidden, 7);
        kernels::add_weighted_fixed(want.data(), alone.data() + i * kHidden, rows[i].weight, kHidden);
        for (int h = 0; h < kHidden; ++h) ASSERT_EQ(sums[i * kHidden + h], want[h]) << "row " << i;
      }
    }
  }
}

TEST(ExpertExecutor, NoRowsNoCall) {
  const ExpertStore store =
      ExpertStore::load(small_config(Gemm::fixed_order), placement::contiguous(1, 2, kExperts), 0);
  CpuExpertExecutor executor;
  int polls = 0;
  EXPECT_EQ(executor.run(store.expert(0, 0), {}, [&] { ++polls; }).nonfinite, 0u);
  EXPECT_EQ(polls, 0);
  EXPECT_TRUE(executor.calls().empty());
}

// A slot copied out (the form migration sends), dropped and added back computes
// the same bits, packed for the fixed-order GEMM or row-major for OpenBLAS.
TEST(ExpertStore, SlotsSurviveTheFlatFormMigrationMoves) {
  for (const Gemm gemm : {Gemm::fixed_order, Gemm::openblas}) {
    SCOPED_TRACE(name_of(gemm));
    const Config c = small_config(gemm);
    const placement::Placement p = placement::contiguous(2, 2, kExperts);  // rank 0: experts 0, 1
    ExpertStore store = ExpertStore::load(c, p, 0);
    EXPECT_EQ(store.packed(), gemm == Gemm::fixed_order);
    EXPECT_EQ(store.slots(), 4);  // 2 layers x 2 experts
    EXPECT_TRUE(store.holds(1, 1));
    EXPECT_FALSE(store.holds(1, 2));
    EXPECT_EQ(store.expert_bytes(), 4 * store.slot_bytes());
    EXPECT_EQ(store.slot_bytes(), std::size_t(3 * kHidden * kFfn) * sizeof(float));
    test::expect_error([&] { store.expert(1, 2); }, ErrorKind::Internal, {"2"});

    const std::vector<float> x = rows_of(5, 9);
    const auto outputs = [&](const ExpertStore& s, int e) {
      const kernels::ExpertView v = s.expert(1, e);
      std::vector<float> y(5 * kHidden), scratch(kernels::expert_ffn_scratch(v, 5));
      kernels::expert_ffn(v, x.data(), 5, y.data(), scratch.data());
      return y;
    };
    const std::vector<float> before = outputs(store, 1);
    std::vector<std::uint8_t> flat(store.slot_bytes());
    store.copy_slot(1, 1, flat.data());
    store.drop_slot(1, 1);
    EXPECT_FALSE(store.holds(1, 1));
    store.add_slot(1, 1, flat.data());
    const std::vector<float> after = outputs(store, 1);
    EXPECT_EQ(std::memcmp(before.data(), after.data(), before.size() * sizeof(float)), 0);

    // A slot received from another rank: what that rank's store holds for expert 3.
    const ExpertStore other = ExpertStore::load(c, p, 1);
    other.copy_slot(1, 3, flat.data());
    store.add_slot(1, 3, flat.data());
    const std::vector<float> moved = outputs(store, 3), there = outputs(other, 3);
    EXPECT_EQ(std::memcmp(moved.data(), there.data(), moved.size() * sizeof(float)), 0);
  }
}

}  // namespace
}  // namespace moed::runtime
