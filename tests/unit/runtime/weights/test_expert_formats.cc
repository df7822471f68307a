// [experts].dtype: experts held in bf16, fp8, mxfp4 or int8 compute, bit for
// bit, what fp32 experts holding their values compute; they load the same
// from memory and from a checkpoint written in the format; migration moves
// their own bytes; what a format cannot hold is refused naming why.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "kernels/cpu/amx_gemm.h"
#include "kernels/cpu/expert_ffn.h"
#include "kernels/cpu/int8_dot_gemm.h"
#include "placement/placement.h"
#include "runtime/config/config.h"
#include "runtime/weights/expert_store.h"
#include "runtime/weights/synthetic_model.h"
#include "tests/unit/test_support.h"

namespace moed::runtime {
namespace {

using kernels::WeightDtype;

// A small model of `family` whose experts are held in `dtype`: H 64 and F
// 256 fit every format's grain (fp8's 128, mxfp4's 32).
Config config_of(const std::string& family, const std::string& dtype, std::vector<std::string> more = {}) {
  std::vector<std::string> sets{"model.layers=2", "model.experts=8", "model.top_k=2", "model.hidden=64",
                                "model.ffn=256", "model.family=" + family, "experts.dtype=" + dtype};
  sets.insert(sets.end(), more.begin(), more.end());
  return load_config("", sets);
}

std::vector<float> outputs(const kernels::ExpertView& v, const std::vector<float>& x, std::size_t m) {
  std::vector<float> y(m * v.hidden), scratch(kernels::expert_ffn_scratch(v, m));
  kernels::expert_ffn(v, x.data(), m, y.data(), scratch.data());
  return y;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

struct Case {
  std::string family, dtype;
};

class ExpertFormats : public ::testing::TestWithParam<Case> {};

// The held expert against fp32 PackedWeights of its values, and its bytes.
TEST_P(ExpertFormats, ComputeWhatFp32ComputesOnTheirValues) {
  const Case k = GetParam();
  const Config c = config_of(k.family, k.dtype);
  const placement::Placement p = placement::contiguous(1, 2, 8);
  const ExpertStore store = ExpertStore::load(c, p, 0);
  WeightDtype held;
  ASSERT_TRUE(kernels::parse_weight_dtype(k.dtype, &held));
  EXPECT_EQ(store.dtype(), held);
  const std::size_t H = 64, F = 256;
  const std::size_t biases = k.family == "gpt_oss" ? (2 * F + H) * 4 : 0;
  const std::size_t bytes = kernels::EncodedMatrix::code_bytes(held, 2 * F, H) +
                            kernels::EncodedMatrix::scale_bytes(held, 2 * F, H) +
                            kernels::EncodedMatrix::code_bytes(held, H, F) +
                            kernels::EncodedMatrix::scale_bytes(held, H, F) + biases;
  EXPECT_EQ(store.slot_bytes(), bytes);
  EXPECT_EQ(store.expert_bytes(), 16 * bytes);
  std::vector<std::uint8_t> flat(store.slot_bytes());
  store.copy_slot(1, 2, flat.data());
  const kernels::EncodedMatrix w13 = kernels::EncodedMatrix::from_bytes(held, 2 * F, H, flat.data());
  const kernels::EncodedMatrix w2 = kernels::EncodedMatrix::from_bytes(held, H, F, flat.data() + w13.bytes());
  const std::vector<float> v13 = w13.values(), v2 = w2.values();
  const kernels::PackedWeights p13(v13.data(), 2 * F, H), p2(v2.data(), H, F);
  kernels::ExpertView fp32 = store.expert(1, 2);
  fp32.w13_quant = fp32.w2_quant = nullptr;
  fp32.w13_packed = &p13;
  fp32.w2_packed = &p2;
  const std::vector<float> x = test::random_floats(7 * H, 5);
  EXPECT_TRUE(same_bits(outputs(store.expert(1, 2), x, 7), outputs(fp32, x, 7)));
  // A row alone gives its bits in the batch.
  const std::vector<float> row(x.begin() + 3 * std::ptrdiff_t(H), x.begin() + 4 * std::ptrdiff_t(H));
  const std::vector<float> batch = outputs(store.expert(1, 2), x, 7), alone = outputs(store.expert(1, 2), row, 1);
  EXPECT_EQ(std::memcmp(batch.data() + 3 * H, alone.data(), H * sizeof(float)), 0);
}

// A slot copied out (what migration sends), dropped and added on another
// store, computes the same bits.
TEST_P(ExpertFormats, MigratedSlotsKeepTheirBits) {
  const Case k = GetParam();
  const Config c = config_of(k.family, k.dtype);
  const placement::Placement p = placement::contiguous(2, 2, 8);
  ExpertStore a = ExpertStore::load(c, p, 0);
  const ExpertStore b = ExpertStore::load(c, p, 1);
  std::vector<std::uint8_t> flat(b.slot_bytes());
  b.copy_slot(0, 5, flat.data());
  a.add_slot(0, 5, flat.data());
  const std::vector<float> x = test::random_floats(5 * 64, 9);
  EXPECT_TRUE(same_bits(outputs(a.expert(0, 5), x, 5), outputs(b.expert(0, 5), x, 5)));
}

// A shard cut from a whole copy (what a migration that splits the expert
// sends) has the bytes of that shard loaded from the model, and installed in
// place of the whole copy it serves as that shard.
TEST_P(ExpertFormats, ACutShardIsTheShardLoadedFromTheModel) {
  const Case k = GetParam();
  const Config c = config_of(k.family, k.dtype, {"experts.ffn_chunks=2"});
  const placement::Placement whole = placement::contiguous(2, 2, 8);  // expert 1 on rank 0
  placement::Placement split = whole;
  split.set_shards(0, 1, {0, 1});
  ExpertStore holder = ExpertStore::load(c, whole, 0);
  for (int shard : {0, 1}) {
    const ExpertStore loaded = ExpertStore::load(c, split, shard);
    std::vector<std::uint8_t> cut(holder.slot_bytes(2)), own(holder.slot_bytes(2));
    holder.copy_shard(0, 1, shard, 2, cut.data());
    loaded.copy_slot(0, 1, own.data());
    EXPECT_EQ(cut, own) << "shard " << shard;
    if (shard == 1) continue;
    ExpertStore replaced = ExpertStore::load(c, whole, 0);
    replaced.add_slot(0, 1, cut.data(), 0, 2, true);
    EXPECT_EQ(replaced.shard_of(0, 1), (std::pair{0, 2}));
    const std::vector<float> x = test::random_floats(5 * 64, 3);
    EXPECT_TRUE(same_bits(outputs(replaced.expert(0, 1), x, 5), outputs(loaded.expert(0, 1), x, 5)));
  }
  test::expect_error([&] { holder.add_slot(0, 1, std::vector<std::uint8_t>(holder.slot_bytes()).data()); },
                     ErrorKind::Internal, {"already held"});
}

// With bf16 dot products and AMX tiles too (and int8 ones for int8 and mxfp4), a
// row's bits are its own, and a migrated slot's are the source's.
TEST_P(ExpertFormats, DotProductsKeepARowsBitsAndAMigratedSlotsBits) {
  const Case k = GetParam();
  if (k.dtype == "f32") GTEST_SKIP() << "f32 experts multiply in f32";
  for (auto products : {kernels::CompactProducts::bf16, kernels::CompactProducts::int8, kernels::CompactProducts::amx}) {
    if (products == kernels::CompactProducts::int8 && k.dtype != "int8" && k.dtype != "mxfp4") continue;
    kernels::set_compact_products(products);
    const Config c = config_of(k.family, k.dtype);
    const placement::Placement p = placement::contiguous(2, 2, 8);
    ExpertStore a = ExpertStore::load(c, p, 0);
    const ExpertStore b = ExpertStore::load(c, p, 1);
    const std::vector<float> x = test::random_floats(7 * 64, 5);
    const std::vector<float> row(x.begin() + 3 * 64, x.begin() + 4 * 64);
    const std::vector<float> batch = outputs(b.expert(0, 5), x, 7), alone = outputs(b.expert(0, 5), row, 1);
    EXPECT_EQ(std::memcmp(batch.data() + 3 * 64, alone.data(), 64 * sizeof(float)), 0) << to_string(products);
    std::vector<std::uint8_t> flat(b.slot_bytes());
    b.copy_slot(0, 5, flat.data());
    a.add_slot(0, 5, flat.data());
    EXPECT_TRUE(same_bits(outputs(a.expert(0, 5), x, 7), batch)) << to_string(products);
  }
  kernels::set_compact_products(kernels::CompactProducts::f32);
}

// A checkpoint written with its experts in the format loads the values the
// in-memory synthetic model holds.
TEST_P(ExpertFormats, ACheckpointInTheFormatLoadsTheSameExperts) {
  const Case k = GetParam();
  const bool shipped = k.dtype == "fp8" || k.dtype == "mxfp4";
  if (shipped && (k.dtype == "mxfp4") != (k.family == "gpt_oss")) GTEST_SKIP() << "written in another family's layout";
  const Config memory = config_of(k.family, k.dtype);
  test::TempDir dir;
  const std::string path = (dir.path() / "ckpt").string();
  WeightDtype held;
  ASSERT_TRUE(kernels::parse_weight_dtype(k.dtype, &held));
  SyntheticModel(ModelShape::from(memory.model), std::uint64_t(memory.model.seed), weights::DType::F32)
      .write(path, memory.model.norm_eps, shipped ? held : WeightDtype::f32);
  // auto: the checkpoint's own format (fp8, mxfp4), else the format asked for.
  const Config file = load_config("", {"model.weights=" + path, "experts.dtype=" + (shipped ? "auto" : k.dtype)});
  EXPECT_EQ(experts_dtype(file), k.dtype);
  const placement::Placement p = placement::contiguous(1, 2, 8);
  const ExpertStore a = ExpertStore::load(memory, p, 0), b = ExpertStore::load(file, p, 0);
  std::vector<std::uint8_t> fa(a.slot_bytes()), fb(b.slot_bytes());
  a.copy_slot(1, 1, fa.data());
  b.copy_slot(1, 1, fb.data());
  EXPECT_EQ(fa, fb);
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (const char* family : {"mixtral", "deepseek_v3", "gpt_oss"})
    for (const char* dtype : {"f32", "bf16", "fp8", "mxfp4", "int8"}) out.push_back({family, dtype});
  return out;
}

INSTANTIATE_TEST_SUITE_P(FamiliesAndDtypes, ExpertFormats, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return info.param.family + "_" + info.param.dtype; });

TEST(ExpertFormatErrors, ShapesOffTheScaleGrainAreRefused) {
  const placement::Placement p = placement::contiguous(1, 2, 8);
  test::expect_error([&] { ExpertStore::load(config_of("mixtral", "fp8", {"model.ffn=96"}), p, 0); },
                     ErrorKind::Usage, {"[experts].dtype = fp8", "[model].ffn", "multiple of 128", "96"});
  test::expect_error([&] { ExpertStore::load(config_of("mixtral", "mxfp4", {"model.hidden=48"}), p, 0); },
                     ErrorKind::Usage, {"mxfp4", "multiples of 32", "48"});
  test::expect_error([&] { ExpertStore::load(config_of("mixtral", "int8", {"experts.gemm=openblas"}), p, 0); },
                     ErrorKind::Usage, {"[experts].dtype = int8", "fixed-order"});
  // Four shards of 64 columns cut fp8's tiles, not mxfp4's blocks.
  placement::Placement split = placement::contiguous(4, 2, 8);
  split.set_shards(0, 1, {0, 1, 2, 3});
  test::expect_error([&] { ExpertStore::load(config_of("mixtral", "fp8", {"experts.ffn_chunks=4"}), split, 0); },
                     ErrorKind::Usage, {"layer 0 expert 1 is split into 4 shards of 64 columns", "multiples of 128"});
  EXPECT_NO_THROW(ExpertStore::load(config_of("mixtral", "mxfp4", {"experts.ffn_chunks=4"}), split, 0));
}

TEST(ExpertProducts, AutoTakesAmxThenBf16WhereTheCpuHasThemAndTheOthersAreRefusedWhereTheyCannot) {
  EXPECT_EQ(local_products(config_of("mixtral", "f32")), kernels::CompactProducts::f32);
  EXPECT_EQ(local_products(config_of("mixtral", "fp8", {"experts.products=f32"})), kernels::CompactProducts::f32);
  const bool here = kernels::cpu_has_bf16_dot() && kernels::gemm_isa() == kernels::GemmIsa::avx512;
  EXPECT_EQ(local_products(config_of("mixtral", "fp8")), !here                   ? kernels::CompactProducts::f32
                                                         : kernels::cpu_has_amx() ? kernels::CompactProducts::amx
                                                                                  : kernels::CompactProducts::bf16);
  test::expect_error([] { (void)config_of("mixtral", "f32", {"experts.products=amx"}); }, ErrorKind::Usage,
                     {"[experts].products = \"amx\"", "f32"});
  if (kernels::cpu_has_amx())
    EXPECT_EQ(local_products(config_of("mixtral", "mxfp4", {"experts.products=amx"})), kernels::CompactProducts::amx);
  else
    test::expect_error([] { (void)local_products(config_of("mixtral", "fp8", {"experts.products=amx"})); },
                       ErrorKind::Usage, {"[experts].products = amx", "AMX-BF16"});
  test::expect_error([] { (void)config_of("mixtral", "f32", {"experts.products=bf16"}); }, ErrorKind::Usage,
                     {"[experts].products = \"bf16\"", "f32"});
  test::expect_error([] { (void)config_of("mixtral", "int8", {"experts.products=bf16", "experts.gemm=openblas"}); },
                     ErrorKind::Usage, {"[experts].products = \"bf16\"", "openblas"});
  test::expect_error([] { (void)config_of("mixtral", "fp8", {"experts.products=int8"}); }, ErrorKind::Usage,
                     {"[experts].products = \"int8\"", "int8 and mxfp4 experts", "fp8"});
  if (kernels::cpu_has_int8_dot())
    EXPECT_EQ(local_products(config_of("mixtral", "int8", {"experts.products=int8"})), kernels::CompactProducts::int8);
  else
    test::expect_error([] { (void)local_products(config_of("mixtral", "int8", {"experts.products=int8"})); },
                       ErrorKind::Usage, {"[experts].products = int8", "VNNI"});
  if (!kernels::cpu_has_bf16_dot()) {
    test::expect_error([] { (void)local_products(config_of("mixtral", "fp8", {"experts.products=bf16"})); },
                       ErrorKind::Usage, {"[experts].products = bf16", "AVX-512 BF16"});
    return;
  }
  EXPECT_EQ(local_products(config_of("mixtral", "fp8", {"experts.products=bf16"})), kernels::CompactProducts::bf16);
  kernels::set_gemm_isa(kernels::GemmIsa::avx2);  // as [experts].isa = avx2 sets it
  test::expect_error([] { (void)local_products(config_of("mixtral", "fp8", {"experts.products=bf16", "experts.isa=avx2"})); },
                     ErrorKind::Usage, {"[experts].products = bf16", "avx512 GEMM kernel", "avx2"});
  if (kernels::cpu_has_amx())
    test::expect_error([] { (void)local_products(config_of("mixtral", "fp8", {"experts.products=amx", "experts.isa=avx2"})); },
                       ErrorKind::Usage, {"[experts].products = amx", "avx512 GEMM kernel", "avx2"});
  EXPECT_EQ(local_products(config_of("mixtral", "fp8", {"experts.isa=avx2"})), kernels::CompactProducts::f32);
  kernels::set_gemm_isa(kernels::best_gemm_isa());
}

// Under auto the ranks take the least able rank's products: amx falls to
// bf16 or f32, bf16 to f32; a rank never rises, and f32 and int8 stay.
TEST(ExpertProducts, RanksAgreeOnTheLeastAbleRanksProducts) {
  using P = kernels::CompactProducts;
  EXPECT_EQ(products_ability(P::amx), 2);
  EXPECT_EQ(products_ability(P::bf16), 1);
  EXPECT_EQ(products_ability(P::f32), 0);
  EXPECT_EQ(products_ability(P::int8), 0);
  EXPECT_EQ(agreed_products(P::amx, 2), P::amx);
  EXPECT_EQ(agreed_products(P::amx, 1), P::bf16);
  EXPECT_EQ(agreed_products(P::amx, 0), P::f32);
  EXPECT_EQ(agreed_products(P::bf16, 2), P::bf16);
  EXPECT_EQ(agreed_products(P::bf16, 1), P::bf16);
  EXPECT_EQ(agreed_products(P::bf16, 0), P::f32);
  EXPECT_EQ(agreed_products(P::f32, 2), P::f32);
  EXPECT_EQ(agreed_products(P::int8, 0), P::int8);
}

TEST(ExpertFormatErrors, ACheckpointThatCannotBecomeTheFormatNamesTheTensor) {
  test::TempDir dir;
  const std::string path = (dir.path() / "bf16").string();
  const Config memory = config_of("mixtral", "bf16", {"model.dtype=bf16"});
  SyntheticModel(ModelShape::from(memory.model), 42, weights::DType::BF16).write(path, 1e-5);
  const placement::Placement p = placement::contiguous(1, 2, 8);
  for (const char* dtype : {"fp8", "mxfp4"})
    test::expect_error(
        [&] { ExpertStore::load(load_config("", {"model.weights=" + path, std::string("experts.dtype=") + dtype}), p, 0); },
        ErrorKind::Input, {"holds tensor 'model.layers.0.block_sparse_moe.experts.0.w1.weight' in bf16",
                           std::string("cannot become ") + dtype});
  // bf16 becomes int8 (quantized at load) or f32.
  EXPECT_NO_THROW(ExpertStore::load(load_config("", {"model.weights=" + path, "experts.dtype=int8"}), p, 0));
  // An fp8 checkpoint serves as fp8 or f32, not int8.
  const std::string fp8 = (dir.path() / "fp8").string();
  const Config deepseek = config_of("deepseek_v3", "fp8");
  SyntheticModel(ModelShape::from(deepseek.model), 42, weights::DType::F32).write(fp8, 1e-6, WeightDtype::fp8);
  EXPECT_NO_THROW(ExpertStore::load(load_config("", {"model.weights=" + fp8, "experts.dtype=f32"}), p, 0));
  test::expect_error([&] { ExpertStore::load(load_config("", {"model.weights=" + fp8, "experts.dtype=int8"}), p, 0); },
                     ErrorKind::Input, {"in fp8, which cannot become int8"});
}

}  // namespace
}  // namespace moed::runtime
