// Safetensors reader: round trips through the writer (fp32 and bf16 converted, the
// quantized dtypes copied raw), sharded checkpoints, and every malformed-file case
// giving a clear Input error. Files are written byte by byte into a
// fresh temp dir. The writer's own tests are in test_safetensors_writer.cc, the dtypes'
// in test_safetensors_format.cc.
#include "runtime/weights/safetensors.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <source_location>
#include <string>
#include <vector>

#include "common/error.h"
#include "runtime/weights/safetensors_writer.h"
#include "tests/unit/test_support.h"

namespace moed::weights {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// A temp directory per test, removed afterwards.
class SafetensorsTest : public ::testing::Test {
 protected:
  std::string file(const std::string& name) const { return tmp_.file(name); }

  static std::string read_bytes(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  }

  static std::string le64(std::uint64_t v) {
    std::string s(8, '\0');
    for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((v >> (8 * i)) & 0xFF);
    return s;
  }

  // A safetensors file from a raw header text and data region.
  std::string write_raw(const std::string& name, const std::string& header,
                        const std::string& data) {
    return tmp_.write(name, le64(header.size()) + header + data);
  }

  // A file with a valid length prefix whose data region has `data_size` zero bytes.
  std::string write_header(const std::string& name, const json& header, std::size_t data_size) {
    return write_raw(name, header.dump(), std::string(data_size, '\0'));
  }

  test::TempDir tmp_{"moed_st"};
};

using test::expect_error;

// Opening `path` must fail with an Input error whose message holds every one of `parts`.
void expect_open_error(const std::string& path, const std::vector<std::string>& parts,
                       std::source_location at = std::source_location::current()) {
  expect_error([&] { SafetensorsFile f(path); }, ErrorKind::Input, parts, at);
}

std::vector<float> iota(std::size_t n, float start, float step) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = start + step * static_cast<float>(i);
  return v;
}

json entry(const std::string& dtype, std::vector<std::int64_t> shape, std::uint64_t begin,
           std::uint64_t end) {
  return {{"dtype", dtype}, {"shape", shape}, {"data_offsets", {begin, end}}};
}

// ---- round trips --------------------------------------------------------------------------

TEST_F(SafetensorsTest, RoundTripF32AndBf16) {
  const auto w1 = iota(6, -1.25f, 0.5f);
  const auto w2 = iota(12, 0.1f, 0.37f);  // not bf16-representable: rounds
  const auto bias = iota(3, 7.0f, 1.0f);
  SafetensorsWriter writer;
  writer.set_metadata("format", "pt");
  writer.set_metadata("moed.seed", "42");
  writer.add("layer.w1", DType::F32, {2, 3}, w1.data());
  writer.add("layer.w2", DType::BF16, {3, 4}, w2.data());
  writer.add("bias", DType::BF16, {3}, bias.data());  // odd size: misaligns what follows
  writer.add("empty", DType::F32, {0, 4}, nullptr);
  writer.add("scalar", DType::F32, {}, w1.data());
  const std::string path = file("model.safetensors");
  writer.write(path);

  SafetensorsFile f(path);
  EXPECT_EQ(f.path(), path);
  EXPECT_EQ(f.names(), (std::vector<std::string>{"bias", "empty", "layer.w1", "layer.w2", "scalar"}));
  EXPECT_EQ(f.metadata(), (std::map<std::string, std::string>{{"format", "pt"}, {"moed.seed", "42"}}));
  ASSERT_NE(f.find("layer.w2"), nullptr);
  EXPECT_EQ(f.find("layer.w2")->dtype, "BF16");
  EXPECT_EQ(f.find("layer.w2")->shape, (std::vector<std::int64_t>{3, 4}));
  EXPECT_EQ(f.find("layer.w2")->end - f.find("layer.w2")->begin, 24u);
  EXPECT_EQ(f.find("nope"), nullptr);

  std::vector<float> out(12, -99.0f);
  f.read_f32("layer.w1", DType::F32, {2, 3}, out.data());
  for (int i = 0; i < 6; ++i) EXPECT_EQ(out[i], w1[i]);
  EXPECT_EQ(out[6], -99.0f) << "wrote past numel";
  f.read_f32("layer.w2", DType::BF16, {3, 4}, out.data());
  for (int i = 0; i < 12; ++i) {
    EXPECT_EQ(out[i], bf16_to_f32(f32_to_bf16(w2[i])));
    EXPECT_NEAR(out[i], w2[i], std::abs(w2[i]) / 128);
  }
  f.read_f32("bias", DType::BF16, {3}, out.data());
  EXPECT_EQ(std::vector<float>(out.begin(), out.begin() + 3), bias);  // integers: exact in bf16
  f.read_f32("empty", DType::F32, {0, 4}, out.data());
  f.read_f32("scalar", DType::F32, {}, out.data());
  EXPECT_EQ(out[0], w1[0]);

  // Same through Checkpoint, by file and by directory.
  for (const std::string& p : {path, tmp_.path().string()}) {
    Checkpoint ckpt(p);
    EXPECT_EQ(ckpt.path(), p);
    EXPECT_TRUE(ckpt.contains("layer.w1"));
    EXPECT_FALSE(ckpt.contains("layer.w3"));
    ckpt.read_f32("layer.w1", DType::F32, {2, 3}, out.data());
    for (int i = 0; i < 6; ++i) EXPECT_EQ(out[i], w1[i]);
  }
}

TEST_F(SafetensorsTest, ReadsHandWrittenFileWithGapsAndOtherDtypes) {
  // Unknown dtypes and gaps are allowed in the header; only loading them fails.
  json header = {{"a", entry("F32", {2}, 0, 8)},
                 {"half", entry("F16", {2}, 16, 20)},
                 {"q", entry("Q4_K", {7}, 20, 23)},
                 {"__metadata__", {{"k", "v"}}}};
  std::string data(23, '\0');
  float v[2] = {1.5f, -2.0f};
  std::memcpy(data.data(), v, 8);
  std::string text = header.dump() + "   ";  // trailing spaces are valid padding
  const std::string path = write_raw("hand.safetensors", text, data);

  SafetensorsFile f(path);
  EXPECT_EQ(f.names(), (std::vector<std::string>{"a", "half", "q"}));
  EXPECT_EQ(f.metadata().at("k"), "v");
  EXPECT_EQ(f.find("a")->begin, 8 + text.size());
  EXPECT_EQ(f.find("half")->end, 8 + text.size() + 20);
  float out[2];
  f.read_f32("a", DType::F32, {2}, out);
  EXPECT_EQ(out[0], 1.5f);
  EXPECT_EQ(out[1], -2.0f);
}

// ---- malformed files ----------------------------------------------------------------------

TEST_F(SafetensorsTest, BadFileTooShort) {
  // Exactly 8 bytes: a zero-length header, which is not JSON.
  expect_open_error(write_raw("empty.safetensors", "", ""), {"empty.safetensors", "not valid JSON"});
  tmp_.write("short.safetensors", "abc");
  expect_open_error(file("short.safetensors"), {"short.safetensors", "3 bytes", "too short"});
  tmp_.write("zero.safetensors", "");
  expect_open_error(file("zero.safetensors"), {"zero.safetensors", "0 bytes"});
}

TEST_F(SafetensorsTest, BadFileMissing) {
  expect_open_error(file("absent.safetensors"), {"absent.safetensors"});
}

TEST_F(SafetensorsTest, BadHeaderLength) {
  const std::string path = tmp_.write("len.safetensors", le64(1000) + "{}");
  expect_open_error(path, {"len.safetensors", "header length 1000", "2 bytes"});
  tmp_.write("len.safetensors", le64(~0ull) + "{}");  // would overflow 8 + N
  expect_open_error(path, {"len.safetensors", "header length"});
}

TEST_F(SafetensorsTest, BadHeaderNotJson) {
  expect_open_error(write_raw("json.safetensors", "{\"a\": ", ""),
                    {"json.safetensors", "not valid JSON"});
  expect_open_error(write_raw("utf8.safetensors", "{\"\xff\": 1}", ""),
                    {"utf8.safetensors", "not valid JSON"});
}

TEST_F(SafetensorsTest, BadHeaderNotObject) {
  expect_open_error(write_raw("arr.safetensors", "[1, 2]", ""),
                    {"arr.safetensors", "array", "expected an object"});
}

TEST_F(SafetensorsTest, BadEntryNotObject) {
  expect_open_error(write_header("e.safetensors", {{"w", 5}}, 0),
                    {"e.safetensors", "'w'", "expected an object"});
}

TEST_F(SafetensorsTest, BadEntryDtype) {
  expect_open_error(write_header("d1.safetensors", {{"w", {{"shape", {1}}, {"data_offsets", {0, 4}}}}}, 4),
                    {"d1.safetensors", "'w'", "\"dtype\""});
  json e = entry("F32", {1}, 0, 4);
  e["dtype"] = 32;
  expect_open_error(write_header("d2.safetensors", {{"w", e}}, 4),
                    {"d2.safetensors", "'w'", "dtype is 32", "expected a string"});
}

TEST_F(SafetensorsTest, BadEntryShape) {
  expect_open_error(
      write_header("s1.safetensors", {{"w", {{"dtype", "F32"}, {"data_offsets", {0, 4}}}}}, 4),
      {"s1.safetensors", "'w'", "\"shape\""});
  json e = entry("F32", {1}, 0, 4);
  e["shape"] = "1";
  expect_open_error(write_header("s2.safetensors", {{"w", e}}, 4),
                    {"s2.safetensors", "'w'", "shape is \"1\"", "expected an array"});
  e["shape"] = {1.5};
  expect_open_error(write_header("s3.safetensors", {{"w", e}}, 4),
                    {"s3.safetensors", "'w'", "shape[0]", "non-negative integer"});
  e["shape"] = {"2"};
  expect_open_error(write_header("s4.safetensors", {{"w", e}}, 4),
                    {"s4.safetensors", "'w'", "shape[0]"});
}

TEST_F(SafetensorsTest, BadEntryNegativeDim) {
  expect_open_error(write_header("neg.safetensors", {{"w", entry("F32", {2, -2}, 0, 16)}}, 16),
                    {"neg.safetensors", "'w'", "shape[1] is -2", "non-negative"});
}

TEST_F(SafetensorsTest, BadEntryNumelOverflow) {
  const std::int64_t big = std::int64_t{1} << 40;
  expect_open_error(write_header("big.safetensors", {{"w", entry("F32", {big, big}, 0, 4)}}, 4),
                    {"big.safetensors", "'w'", "64 bits"});
  // numel fits, bytes do not.
  expect_open_error(
      write_header("big2.safetensors", {{"w", entry("F64", {std::int64_t{1} << 62}, 0, 8)}}, 8),
      {"big2.safetensors", "'w'", "64 bits"});
  // Unknown dtype: still caught on the element count.
  expect_open_error(write_header("big3.safetensors", {{"w", entry("Q4", {big, big}, 0, 4)}}, 4),
                    {"big3.safetensors", "'w'", "64 bits"});
  // A dim beyond int64.
  expect_open_error(
      write_raw("big4.safetensors",
                R"({"w": {"dtype": "F32", "shape": [18446744073709551615], "data_offsets": [0, 4]}})",
                std::string(4, '\0')),
      {"big4.safetensors", "'w'", "shape[0]"});
}

TEST_F(SafetensorsTest, BadEntryDataOffsets) {
  json e = entry("F32", {1}, 0, 4);
  e.erase("data_offsets");
  expect_open_error(write_header("o1.safetensors", {{"w", e}}, 4),
                    {"o1.safetensors", "'w'", "\"data_offsets\""});
  e["data_offsets"] = {0};
  expect_open_error(write_header("o2.safetensors", {{"w", e}}, 4),
                    {"o2.safetensors", "'w'", "expected [begin, end]"});
  e["data_offsets"] = {0, "4"};
  expect_open_error(write_header("o3.safetensors", {{"w", e}}, 4),
                    {"o3.safetensors", "'w'", "data_offsets[1]"});
  e["data_offsets"] = {-4, 0};
  expect_open_error(write_header("o4.safetensors", {{"w", e}}, 4),
                    {"o4.safetensors", "'w'", "data_offsets[0] is -4"});
}

TEST_F(SafetensorsTest, BadEntryBeginAfterEnd) {
  expect_open_error(write_header("be.safetensors", {{"w", entry("F32", {1}, 8, 4)}}, 8),
                    {"be.safetensors", "'w'", "[8, 4]", "begin <= end"});
}

TEST_F(SafetensorsTest, BadEntryEndBeyondData) {
  expect_open_error(write_header("end.safetensors", {{"w", entry("F32", {4}, 0, 16)}}, 12),
                    {"end.safetensors", "'w'", "[0, 16]", "12 bytes"});
}

TEST_F(SafetensorsTest, BadEntryByteSize) {
  expect_open_error(write_header("size.safetensors", {{"w", entry("BF16", {3, 2}, 0, 24)}}, 24),
                    {"size.safetensors", "'w'", "24 bytes", "expected 12"});
  expect_open_error(write_header("size2.safetensors", {{"w", entry("I8", {3}, 0, 4)}}, 4),
                    {"size2.safetensors", "'w'", "expected 3"});
  // The quantized experts' dtypes are one byte an element too.
  expect_open_error(write_header("size3.safetensors", {{"w", entry("F8_E4M3", {2, 3}, 0, 12)}}, 12),
                    {"size3.safetensors", "'w'", "12 bytes", "expected 6", "F8_E4M3"});
  expect_open_error(write_header("size4.safetensors", {{"w", entry("U8", {2, 16}, 0, 16)}}, 16),
                    {"size4.safetensors", "'w'", "expected 32"});
}

TEST_F(SafetensorsTest, BadOverlappingTensors) {
  json header = {{"a", entry("F32", {4}, 0, 16)}, {"b", entry("F32", {2}, 12, 20)}};
  expect_open_error(write_header("ov.safetensors", header, 20),
                    {"ov.safetensors", "'a'", "'b'", "overlap"});
  // A tensor nested inside a bigger one, behind a third.
  header = {{"big", entry("F32", {8}, 0, 32)},
            {"mid", entry("F32", {1}, 4, 8)},
            {"inner", entry("F32", {1}, 20, 24)}};
  expect_open_error(write_header("ov2.safetensors", header, 32), {"ov2.safetensors", "overlap"});
  // Same range twice.
  header = {{"x", entry("F32", {1}, 0, 4)}, {"y", entry("F32", {1}, 0, 4)}};
  expect_open_error(write_header("ov3.safetensors", header, 4),
                    {"ov3.safetensors", "'x'", "'y'", "overlap"});
  // Empty tensors occupy nothing.
  header = {{"x", entry("F32", {1}, 0, 4)}, {"e", entry("F32", {0}, 2, 2)}};
  EXPECT_NO_THROW(SafetensorsFile(write_header("ok.safetensors", header, 4)));
}

TEST_F(SafetensorsTest, BadTruncatedFile) {
  const auto v = iota(64, 0.0f, 1.0f);
  SafetensorsWriter writer;
  writer.add("first", DType::F32, {32}, v.data());
  writer.add("model.layers.0.last", DType::F32, {32}, v.data() + 32);
  const std::string path = file("trunc.safetensors");
  writer.write(path);
  fs::resize_file(path, fs::file_size(path) - 10);
  expect_open_error(path, {"trunc.safetensors", "'model.layers.0.last'", "truncated"});
}

TEST_F(SafetensorsTest, BadMetadata) {
  expect_open_error(write_header("m1.safetensors", {{"__metadata__", {1, 2}}}, 0),
                    {"m1.safetensors", "__metadata__", "expected an object"});
  expect_open_error(write_header("m2.safetensors", {{"__metadata__", {{"k", 3}}}}, 0),
                    {"m2.safetensors", "__metadata__", "'k'", "expected a string"});
}

// JSON keeps the last of two equal keys: a tensor named twice must not load quietly.
TEST_F(SafetensorsTest, BadDuplicateTensorName) {
  const std::string a = entry("F32", {1}, 0, 4).dump(), b = entry("F32", {1}, 4, 8).dump();
  expect_open_error(write_raw("dup.safetensors", "{\"w\":" + a + ",\"v\":" + a + ",\"w\":" + b + "}",
                              std::string(8, '\0')),
                    {"dup.safetensors", "tensor 'w' appears twice in the header"});
  // A repeated field inside one entry is refused the same way.
  expect_open_error(write_raw("dupfield.safetensors",
                              R"({"w":{"dtype":"F32","dtype":"BF16","shape":[1],"data_offsets":[0,4]}})",
                              std::string(4, '\0')),
                    {"dupfield.safetensors", "'dtype' twice in 'w'"});
  // Equal names in different objects are fine.
  SafetensorsFile ok(write_raw("ok.safetensors", "{\"w\":" + a + ",\"__metadata__\":{\"w\":\"x\"}}",
                               std::string(4, '\0')));
  EXPECT_NE(ok.find("w"), nullptr);
}

// ---- read_f32 checks ----------------------------------------------------------------------

class SafetensorsReadTest : public SafetensorsTest {
 protected:
  void SetUp() override {
    SafetensorsTest::SetUp();
    const auto v = iota(512 * 256, 0.0f, 0.001f);
    SafetensorsWriter writer;
    writer.add(kName, DType::F32, {512, 256}, v.data());
    writer.add("bf", DType::BF16, {4}, v.data());
    writer.write(file("model.safetensors"));
    // A file with an F16 and an unknown dtype, which are fine until read.
    json header = {{"half", entry("F16", {2}, 0, 4)}, {"quant", entry("Q8_0", {5}, 4, 9)}};
    write_header("other.safetensors", header, 9);
  }
  static constexpr const char* kName = "model.layers.0.block_sparse_moe.experts.3.w1.weight";
  std::vector<float> out_ = std::vector<float>(512 * 256);
};

TEST_F(SafetensorsReadTest, MissingTensor) {
  SafetensorsFile f(file("model.safetensors"));
  expect_error([&] { f.read_f32("no.such.tensor", DType::F32, {1}, out_.data()); },
               ErrorKind::Input, {"model.safetensors", "'no.such.tensor'"});
  Checkpoint c(file("model.safetensors"));
  expect_error([&] { c.read_f32("no.such.tensor", DType::F32, {1}, out_.data()); },
               ErrorKind::Input, {"model.safetensors", "'no.such.tensor'"});
}

TEST_F(SafetensorsReadTest, WrongDtype) {
  SafetensorsFile f(file("model.safetensors"));
  expect_error([&] { f.read_f32(kName, DType::BF16, {512, 256}, out_.data()); },
               ErrorKind::Input, {"model.safetensors", kName, "dtype F32", "expected BF16"});
  expect_error([&] { f.read_f32("bf", DType::F32, {4}, out_.data()); }, ErrorKind::Input,
               {"model.safetensors", "'bf'", "dtype BF16", "expected F32"});
}

TEST_F(SafetensorsReadTest, UnsupportedDtype) {
  SafetensorsFile f(file("other.safetensors"));
  expect_error([&] { f.read_f32("half", DType::BF16, {2}, out_.data()); }, ErrorKind::Input,
               {"other.safetensors", "'half'", "F16", "supported dtypes: F32, BF16"});
  expect_error([&] { f.read_f32("quant", DType::F32, {5}, out_.data()); }, ErrorKind::Input,
               {"other.safetensors", "'quant'", "Q8_0", "F32, BF16"});
}

TEST_F(SafetensorsReadTest, WrongShape) {
  SafetensorsFile f(file("model.safetensors"));
  expect_error([&] { f.read_f32(kName, DType::F32, {512, 128}, out_.data()); }, ErrorKind::Input,
               {std::string("model.safetensors: tensor '") + kName +
                "' has shape [512, 256], expected [512, 128]"});
  expect_error([&] { f.read_f32(kName, DType::F32, {512, 256, 1}, out_.data()); },
               ErrorKind::Input, {"model.safetensors", kName, "[512, 256, 1]"});
}

// ---- read_raw: the quantized dtypes, bytes as stored ---------------------------------------

// A file of fp8 and MXFP4 expert tensors, written with add_raw, and a bf16 and an fp32
// one written with add.
class SafetensorsRawTest : public SafetensorsTest {
 protected:
  void SetUp() override {
    SafetensorsTest::SetUp();
    for (std::size_t i = 0; i < fp8_.size(); ++i) fp8_[i] = std::byte(0x80 + 7 * i);  // sign bits set too
    for (std::size_t i = 0; i < blocks_.size(); ++i) blocks_[i] = std::byte(i * 37 % 256);
    for (std::size_t i = 0; i < scales_.size(); ++i) scales_[i] = std::byte(120 + i);
    for (std::size_t i = 0; i < int8_.size(); ++i) int8_[i] = std::byte(256 - 3 * (i + 1));  // negative
    SafetensorsWriter writer;
    writer.add_raw(kFp8, "F8_E4M3", {4, 3}, fp8_.data(), fp8_.size());
    writer.add(kScale, DType::F32, {1, 1}, &scale_);
    writer.add_raw(kBlocks, "U8", {3, 2, 1, 16}, blocks_.data(), blocks_.size());
    writer.add_raw(kScales, "U8", {3, 2, 1}, scales_.data(), scales_.size());
    writer.add_raw("i8", "I8", {5}, int8_.data(), int8_.size());
    writer.add("bias", DType::BF16, {2}, bias_);
    writer.write(file("model.safetensors"));
  }
  // `n` bytes of `from`, from byte `first`.
  static std::vector<std::byte> part(const std::vector<std::byte>& from, std::size_t first, std::size_t n) {
    return {from.begin() + std::ptrdiff_t(first), from.begin() + std::ptrdiff_t(first + n)};
  }

  static constexpr const char* kFp8 = "model.layers.3.mlp.experts.0.gate_proj.weight";
  static constexpr const char* kScale = "model.layers.3.mlp.experts.0.gate_proj.weight_scale_inv";
  static constexpr const char* kBlocks = "model.layers.0.mlp.experts.gate_up_proj_blocks";
  static constexpr const char* kScales = "model.layers.0.mlp.experts.gate_up_proj_scales";
  std::vector<std::byte> fp8_ = std::vector<std::byte>(12), blocks_ = std::vector<std::byte>(96),
                         scales_ = std::vector<std::byte>(6), int8_ = std::vector<std::byte>(5);
  float scale_ = 0.0123f;
  float bias_[2] = {1.5f, -2.0f};
};

TEST_F(SafetensorsRawTest, RoundTripsEachDtypeByteForByte) {
  SafetensorsFile f(file("model.safetensors"));
  EXPECT_EQ(f.dtype_of(kFp8), "F8_E4M3");
  EXPECT_EQ(f.dtype_of(kScale), "F32");
  EXPECT_EQ(f.dtype_of(kBlocks), "U8");
  EXPECT_EQ(f.dtype_of("i8"), "I8");
  EXPECT_EQ(f.dtype_of("bias"), "BF16");
  EXPECT_EQ(f.dtype_of("absent"), std::nullopt);

  std::vector<std::byte> out(100, std::byte{0xEE});
  f.read_raw(kFp8, "F8_E4M3", {4, 3}, out.data());
  EXPECT_EQ(part(out, 0, 12), fp8_);
  EXPECT_EQ(out[12], std::byte{0xEE}) << "wrote past numel";
  f.read_raw(kBlocks, "U8", {3, 2, 1, 16}, out.data());
  EXPECT_EQ(part(out, 0, 96), blocks_);
  f.read_raw(kScales, "U8", {3, 2, 1}, out.data());
  EXPECT_EQ(part(out, 0, 6), scales_);
  f.read_raw("i8", "I8", {5}, out.data());
  EXPECT_EQ(part(out, 0, 5), int8_);
  // The dtypes read_f32 converts are copied unconverted too: the scales' fp32 as is,
  // bf16 as its 16 bits.
  f.read_raw(kScale, "F32", {1, 1}, out.data());
  float scale = 0;
  std::memcpy(&scale, out.data(), 4);
  EXPECT_EQ(scale, scale_);
  f.read_raw("bias", "BF16", {2}, out.data());
  std::uint16_t bits[2];
  std::memcpy(bits, out.data(), 4);
  EXPECT_EQ(bits[0], f32_to_bf16(bias_[0]));
  EXPECT_EQ(bits[1], f32_to_bf16(bias_[1]));

  // And through a Checkpoint.
  Checkpoint c(tmp_.path().string());
  EXPECT_EQ(c.dtype_of(kFp8), "F8_E4M3");
  EXPECT_EQ(c.dtype_of("absent"), std::nullopt);
  std::fill(out.begin(), out.end(), std::byte{0});
  c.read_raw(kBlocks, "U8", {3, 2, 1, 16}, out.data());
  EXPECT_EQ(part(out, 0, 96), blocks_);
}

TEST_F(SafetensorsRawTest, SlicesTheLeadingDimension) {
  // One expert of the fused MXFP4 tensors, rows [1, 3) of the fp8 weight.
  SafetensorsFile f(file("model.safetensors"));
  std::vector<std::byte> out(40, std::byte{0xEE});
  f.read_raw(kBlocks, "U8", {3, 2, 1, 16}, out.data(), 1, 1);
  EXPECT_EQ(part(out, 0, 32), part(blocks_, 32, 32));
  EXPECT_EQ(out[32], std::byte{0xEE});
  f.read_raw(kScales, "U8", {3, 2, 1}, out.data(), 2, 1);
  EXPECT_EQ(part(out, 0, 2), part(scales_, 4, 2));
  Checkpoint c(file("model.safetensors"));
  c.read_raw(kFp8, "F8_E4M3", {4, 3}, out.data(), 1, 2);
  EXPECT_EQ(part(out, 0, 6), part(fp8_, 3, 6));
  c.read_raw(kFp8, "F8_E4M3", {4, 3}, out.data(), 4, 0);  // none, at the end: nothing copied
  EXPECT_EQ(part(out, 0, 6), part(fp8_, 3, 6));
}

TEST_F(SafetensorsRawTest, WrongDtypeShapeOrNameIsAnInputErrorNamingTheTensor) {
  SafetensorsFile f(file("model.safetensors"));
  Checkpoint c(file("model.safetensors"));
  std::vector<std::byte> out(100);
  // A bf16 checkpoint's weight where fp8 is expected, and the other way round.
  expect_error([&] { f.read_raw("bias", "F8_E4M3", {2}, out.data()); }, ErrorKind::Input,
               {"model.safetensors: tensor 'bias' has dtype BF16, expected F8_E4M3"});
  expect_error(
      [&] {
        c.read_raw(kFp8, "BF16", {4, 3}, out.data());
      },
      ErrorKind::Input, {"model.safetensors", kFp8, "has dtype F8_E4M3, expected BF16"});
  expect_error([&] { f.read_raw("i8", "U8", {5}, out.data()); }, ErrorKind::Input,
               {"model.safetensors", "'i8'", "dtype I8, expected U8"});
  expect_error(
      [&] {
        c.read_raw(kBlocks, "U8", {3, 2, 16}, out.data());
      },
      ErrorKind::Input,
      {std::string("model.safetensors: tensor '") + kBlocks + "' has shape [3, 2, 1, 16], expected [3, 2, 16]"});
  expect_error(
      [&] {
        f.read_raw(kFp8, "F8_E4M3", {3, 4}, out.data());
      },
      ErrorKind::Input, {"model.safetensors", kFp8, "[4, 3]", "expected [3, 4]"});
  expect_error(
      [&] {
        f.read_raw(kScale, "F8_E4M3", {1, 1}, out.data());
      },
      ErrorKind::Input, {"model.safetensors", kScale, "dtype F32, expected F8_E4M3"});
  expect_error([&] { f.read_raw("experts.9.w1", "U8", {1}, out.data()); }, ErrorKind::Input,
               {"model.safetensors", "no tensor named 'experts.9.w1'"});
  expect_error([&] { c.read_raw("experts.9.w1", "U8", {1}, out.data()); }, ErrorKind::Input,
               {"model.safetensors", "no tensor named 'experts.9.w1'"});
  // A dtype of unknown size is the caller's bug.
  expect_error([&] { f.read_raw("i8", "Q4_K", {5}, out.data()); }, ErrorKind::Internal, {"Q4_K"});
}

TEST_F(SafetensorsRawTest, ReadF32StillRefusesTheQuantizedDtypes) {
  SafetensorsFile f(file("model.safetensors"));
  std::vector<float> out(100);
  expect_error(
      [&] {
        f.read_f32(kFp8, DType::BF16, {4, 3}, out.data());
      },
      ErrorKind::Input, {"model.safetensors", kFp8, "dtype F8_E4M3", "supported dtypes: F32, BF16", "expected BF16"});
  expect_error(
      [&] {
        f.read_f32(kBlocks, DType::F32, {3, 2, 1, 16}, out.data());
      },
      ErrorKind::Input, {"model.safetensors", kBlocks, "dtype U8", "supported dtypes: F32, BF16"});
  expect_error([&] { f.read_f32("i8", DType::F32, {5}, out.data()); }, ErrorKind::Input,
               {"model.safetensors", "'i8'", "dtype I8", "supported dtypes: F32, BF16"});
}

// ---- sharded checkpoints ------------------------------------------------------------------

class CheckpointTest : public SafetensorsTest {
 protected:
  // Two shards: "a.*" tensors in shard 1, "b.*" in shard 2, plus an index.
  void write_sharded(const std::string& index_name = "model.safetensors.index.json") {
    SafetensorsWriter s1, s2;
    s1.add("a.w", DType::F32, {2, 2}, a_.data());
    s1.add("a.bias", DType::BF16, {2}, a_.data());
    s2.add("b.w", DType::BF16, {4}, b_.data());
    s1.write(file("model-00001-of-00002.safetensors"));
    s2.write(file("model-00002-of-00002.safetensors"));
    json index = {{"metadata", {{"total_size", 28}}},
                  {"weight_map",
                   {{"a.w", "model-00001-of-00002.safetensors"},
                    {"a.bias", "model-00001-of-00002.safetensors"},
                    {"b.w", "model-00002-of-00002.safetensors"}}}};
    tmp_.write(index_name, index.dump(2));
  }
  std::vector<float> a_ = {1, 2, 3, 4};
  std::vector<float> b_ = {-1, -0.5f, 0.25f, 8};
};

TEST_F(CheckpointTest, ShardedViaIndex) {
  write_sharded();
  Checkpoint c(file("model.safetensors.index.json"));
  EXPECT_TRUE(c.contains("a.w"));
  EXPECT_TRUE(c.contains("b.w"));
  EXPECT_FALSE(c.contains("c.w"));
  std::vector<float> out(4);
  c.read_f32("a.w", DType::F32, {2, 2}, out.data());
  EXPECT_EQ(out, a_);
  c.read_f32("b.w", DType::BF16, {4}, out.data());
  EXPECT_EQ(out, b_);
  c.read_f32("a.bias", DType::BF16, {2}, out.data());
  EXPECT_EQ(out[1], 2.0f);
  expect_error([&] { c.read_f32("c.w", DType::F32, {1}, out.data()); }, ErrorKind::Input,
               {"model.safetensors.index.json", "'c.w'"});
  expect_error([&] { c.read_f32("b.w", DType::BF16, {2, 2}, out.data()); }, ErrorKind::Input,
               {"model-00002-of-00002.safetensors", "'b.w'", "[4]", "expected [2, 2]"});
}

TEST_F(CheckpointTest, DirectoryPath) {
  write_sharded();
  Checkpoint c(tmp_.path().string());
  EXPECT_EQ(c.path(), tmp_.path().string());
  std::vector<float> out(4);
  c.read_f32("b.w", DType::BF16, {4}, out.data());
  EXPECT_EQ(out, b_);
}

TEST_F(CheckpointTest, DirectoryWithOtherIndexName) {
  write_sharded("weights.safetensors.index.json");
  Checkpoint c(tmp_.path().string());
  EXPECT_TRUE(c.contains("a.w"));
}

TEST_F(CheckpointTest, ShardsOpenLazily) {
  write_sharded();
  // Corrupt shard 2: a Checkpoint must not notice until one of its tensors is read.
  tmp_.write("model-00002-of-00002.safetensors", le64(5) + "{oops");
  Checkpoint c(file("model.safetensors.index.json"));
  EXPECT_TRUE(c.contains("b.w"));
  std::vector<float> out(4);
  c.read_f32("a.w", DType::F32, {2, 2}, out.data());
  EXPECT_EQ(out, a_);
  expect_error([&] { c.read_f32("b.w", DType::BF16, {4}, out.data()); }, ErrorKind::Input,
               {"model-00002-of-00002.safetensors", "not valid JSON"});
  // The failure is not cached as an open shard; shard 1 still works.
  expect_error([&] { c.read_f32("b.w", DType::BF16, {4}, out.data()); }, ErrorKind::Input,
               {"model-00002-of-00002.safetensors"});
  c.read_f32("a.bias", DType::BF16, {2}, out.data());
  EXPECT_EQ(out[0], 1.0f);
}

TEST_F(CheckpointTest, IndexNamesTensorMissingFromShard) {
  write_sharded();
  json index = json::parse(read_bytes(file("model.safetensors.index.json")));
  index["weight_map"]["ghost"] = "model-00001-of-00002.safetensors";
  tmp_.write("model.safetensors.index.json", index.dump());
  Checkpoint c(file("model.safetensors.index.json"));
  std::vector<float> out(4);
  expect_error([&] { c.read_f32("ghost", DType::F32, {1}, out.data()); }, ErrorKind::Input,
               {"model-00001-of-00002.safetensors", "'ghost'", "index"});
  // Not an absent tensor: the checkpoint contradicts itself.
  expect_error([&] { c.dtype_of("ghost"); }, ErrorKind::Input,
               {"model-00001-of-00002.safetensors", "'ghost'", "index"});
  std::vector<std::byte> raw(4);
  expect_error([&] { c.read_raw("ghost", "F32", {1}, raw.data()); }, ErrorKind::Input,
               {"model-00001-of-00002.safetensors", "'ghost'", "index"});
}

TEST_F(CheckpointTest, DtypeOfOpensOnlyTheShardHoldingTheTensor) {
  write_sharded();
  tmp_.write("model-00002-of-00002.safetensors", le64(5) + "{oops");  // never opened below
  Checkpoint c(file("model.safetensors.index.json"));
  EXPECT_EQ(c.dtype_of("a.w"), "F32");
  EXPECT_EQ(c.dtype_of("a.bias"), "BF16");
  EXPECT_EQ(c.dtype_of("c.w"), std::nullopt);
  expect_error([&] { c.dtype_of("b.w"); }, ErrorKind::Input, {"model-00002-of-00002.safetensors", "not valid JSON"});
}

TEST_F(CheckpointTest, BadIndexNotJson) {
  tmp_.write("bad.safetensors.index.json", "{\"weight_map\": ");
  expect_error([&] { Checkpoint c(file("bad.safetensors.index.json")); }, ErrorKind::Input,
               {"bad.safetensors.index.json", "not valid JSON"});
  tmp_.write("bad.safetensors.index.json", "[]");
  expect_error([&] { Checkpoint c(file("bad.safetensors.index.json")); }, ErrorKind::Input,
               {"bad.safetensors.index.json", "expected an object"});
}

TEST_F(CheckpointTest, BadIndexNoWeightMap) {
  tmp_.write("x.safetensors.index.json", R"({"metadata": {}})");
  expect_error([&] { Checkpoint c(file("x.safetensors.index.json")); }, ErrorKind::Input,
               {"x.safetensors.index.json", "weight_map"});
  tmp_.write("x.safetensors.index.json", R"({"weight_map": ["a"]})");
  expect_error([&] { Checkpoint c(file("x.safetensors.index.json")); }, ErrorKind::Input,
               {"x.safetensors.index.json", "weight_map"});
  tmp_.write("x.safetensors.index.json", R"({"weight_map": {"t": 3}})");
  expect_error([&] { Checkpoint c(file("x.safetensors.index.json")); }, ErrorKind::Input,
               {"x.safetensors.index.json", "'t'"});
}

TEST_F(CheckpointTest, BadIndexDuplicateTensor) {
  tmp_.write("d.safetensors.index.json", R"({"weight_map": {"t": "a.safetensors", "t": "b.safetensors"}})");
  expect_error([&] { Checkpoint c(file("d.safetensors.index.json")); }, ErrorKind::Input,
               {"d.safetensors.index.json", "'t' twice in 'weight_map'"});
}

TEST_F(CheckpointTest, BadIndexMissingShard) {
  write_sharded();
  fs::remove(file("model-00002-of-00002.safetensors"));
  expect_error([&] { Checkpoint c(file("model.safetensors.index.json")); }, ErrorKind::Input,
               {"model.safetensors.index.json", "'b.w'", "model-00002-of-00002.safetensors",
                "does not exist"});
}

TEST_F(CheckpointTest, BadDirectory) {
  fs::create_directories(tmp_.path() / "empty");
  tmp_.write("empty/readme.txt", "hi");
  expect_error([&] { Checkpoint c(file("empty")); }, ErrorKind::Input, {"empty", "no checkpoint"});

  fs::create_directories(tmp_.path() / "two");
  float x = 1;
  SafetensorsWriter w;
  w.add("t", DType::F32, {1}, &x);
  w.write(file("two/a.safetensors"));
  w.write(file("two/b.safetensors"));
  expect_error([&] { Checkpoint c(file("two")); }, ErrorKind::Input,
               {"two", "a.safetensors", "b.safetensors", "index"});

  expect_error([&] { Checkpoint c(file("nowhere")); }, ErrorKind::Input,
               {"nowhere", "does not exist"});
}

TEST_F(CheckpointTest, BadSingleFileFailsAtConstruction) {
  tmp_.write("model.safetensors", "short");
  expect_error([&] { Checkpoint c(file("model.safetensors")); }, ErrorKind::Input,
               {"model.safetensors"});
}

}  // namespace
}  // namespace moed::weights
