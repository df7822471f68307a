// SafetensorsWriter (runtime/weights/safetensors_writer.h): the exact bytes it writes,
// converted (add) or as given (add_raw), the standard layout (aligned data region,
// tensors in add() order), atomic replacement with no temp file left, and its errors.
#include "runtime/weights/safetensors_writer.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/error.h"
#include "tests/unit/test_support.h"

namespace moed::weights {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using test::expect_error;

class SafetensorsWriterTest : public ::testing::Test {
 protected:
  std::string file(const std::string& name) const { return tmp_.file(name); }
  static std::string read_bytes(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  }
  // The raw little-endian bytes of `n` values.
  template <class T>
  static std::string raw(const T* values, std::size_t n) {
    return std::string(reinterpret_cast<const char*>(values), n * sizeof(T));
  }

  test::TempDir tmp_{"moed_stw"};
};

std::vector<float> iota(std::size_t n, float start, float step) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = start + step * static_cast<float>(i);
  return v;
}

TEST_F(SafetensorsWriterTest, WritesExactlyTheseBytes) {
  // Pinned byte for byte (taken from the writer before it moved to its own file): the
  // length, the compact header with metadata first and sorted, tensors in add() order,
  // two spaces of padding, then the data.
  SafetensorsWriter writer;
  writer.set_metadata("moed.seed", "42");
  writer.set_metadata("format", "pt");
  const float z[5] = {1.0f, 2.5f, -3.75f, 0.1f, 1e30f};
  const float a[4] = {0.5f, -0.0f, 3.0f, 1e-3f};
  writer.add("z.first", DType::BF16, {5}, z);
  writer.add("a.second", DType::F32, {2, 2}, a);
  writer.add("empty", DType::F32, {0, 3}, nullptr);
  writer.add("scalar", DType::F32, {}, a + 2);
  const std::string path = file("exact.safetensors");
  writer.write(path);

  const std::string header =
      R"({"__metadata__":{"format":"pt","moed.seed":"42"},)"
      R"("z.first":{"dtype":"BF16","shape":[5],"data_offsets":[0,10]},)"
      R"("a.second":{"dtype":"F32","shape":[2,2],"data_offsets":[10,26]},)"
      R"("empty":{"dtype":"F32","shape":[0,3],"data_offsets":[26,26]},)"
      R"("scalar":{"dtype":"F32","shape":[],"data_offsets":[26,30]}})"
      "  ";
  const std::uint64_t header_len = header.size();
  ASSERT_EQ(header_len, 0x128u);
  const std::uint16_t z_bf16[5] = {0x3F80, 0x4020, 0xC070, 0x3DCD, 0x714A};
  const std::string want = raw(&header_len, 1) + header + raw(z_bf16, 5) + raw(a, 4) + raw(a + 2, 1);
  EXPECT_EQ(read_bytes(path), want);
}

TEST_F(SafetensorsWriterTest, LayoutIsStandard) {
  const auto a = iota(5, 1.0f, 1.0f);
  SafetensorsWriter writer;
  writer.add("z.first", DType::BF16, {5}, a.data());
  writer.add("a.second", DType::F32, {5}, a.data());
  const std::string path = file("layout.safetensors");
  writer.write(path);
  writer.write(path);  // overwriting an existing file works

  const std::string bytes = read_bytes(path);
  std::uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ((8 + n) % 8, 0u) << "data region 8-byte aligned";
  EXPECT_EQ(bytes.size(), 8 + n + 10 + 20);
  json header = json::parse(bytes.substr(8, n));
  EXPECT_FALSE(header.contains("__metadata__"));
  // Data in add() order, contiguous from 0.
  EXPECT_EQ(header["z.first"]["data_offsets"], json({0, 10}));
  EXPECT_EQ(header["a.second"]["data_offsets"], json({10, 30}));
  EXPECT_EQ(header["a.second"]["dtype"], "F32");
  EXPECT_EQ(header["z.first"]["shape"], json({5}));
  float x = 0;
  std::memcpy(&x, bytes.data() + 8 + n + 10 + 4, 4);
  EXPECT_EQ(x, 2.0f);

  // No temp file left behind.
  for (const auto& e : fs::directory_iterator(tmp_.path()))
    EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << e.path();
}

TEST_F(SafetensorsWriterTest, WritesRawBytesUnderTheirDtype) {
  // Raw and converted tensors side by side, in add order, the raw bytes untouched.
  SafetensorsWriter writer;
  const unsigned char fp8[6] = {0x00, 0x38, 0x7E, 0x80, 0xB8, 0xFE};
  const unsigned char blocks[2 * 16] = {0x12, 0x34, 0xFF, 0x00, 0x99};
  const signed char int8[3] = {-128, -1, 127};
  const float one = 1.0f;
  writer.add_raw("w", "F8_E4M3", {2, 3}, fp8, sizeof fp8);
  writer.add("w_scale_inv", DType::F32, {1, 1}, &one);
  writer.add_raw("blocks", "U8", {1, 2, 16}, blocks, sizeof blocks);
  writer.add_raw("i", "I8", {3}, int8, sizeof int8);
  writer.add_raw("none", "U8", {0, 16}, nullptr, 0);
  const std::string path = file("raw.safetensors");
  writer.write(path);

  const std::string bytes = read_bytes(path);
  std::uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  const json header = json::parse(bytes.substr(8, n));
  EXPECT_EQ(header["w"], json::parse(R"({"dtype":"F8_E4M3","shape":[2,3],"data_offsets":[0,6]})"));
  EXPECT_EQ(header["w_scale_inv"]["data_offsets"], json({6, 10}));
  EXPECT_EQ(header["blocks"], json::parse(R"({"dtype":"U8","shape":[1,2,16],"data_offsets":[10,42]})"));
  EXPECT_EQ(header["i"], json::parse(R"({"dtype":"I8","shape":[3],"data_offsets":[42,45]})"));
  EXPECT_EQ(header["none"]["data_offsets"], json({45, 45}));
  EXPECT_EQ(bytes.substr(8 + n), raw(fp8, 6) + raw(&one, 1) + raw(blocks, 32) + raw(int8, 3));
}

TEST_F(SafetensorsWriterTest, RawErrors) {
  SafetensorsWriter writer;
  const unsigned char bytes[8] = {};
  // The size must be the shape's: 2 x 3 one-byte elements are 6 bytes.
  expect_error(
      [&] {
        writer.add_raw("w", "F8_E4M3", {2, 3}, bytes, 8);
      },
      ErrorKind::Internal, {"'w'", "8 bytes", "[2, 3]", "F8_E4M3", "expected 6"});
  expect_error([&] { writer.add_raw("w", "F32", {3}, bytes, 8); }, ErrorKind::Internal, {"'w'", "expected 12"});
  // Only a dtype whose size the reader knows, spelled as the header spells it.
  expect_error([&] { writer.add_raw("w", "Q4_K", {8}, bytes, 8); }, ErrorKind::Internal, {"'w'", "Q4_K"});
  expect_error([&] { writer.add_raw("w", "u8", {8}, bytes, 8); }, ErrorKind::Internal, {"'w'", "u8"});
  expect_error([&] { writer.add_raw("w", "U8", {8}, nullptr, 8); }, ErrorKind::Internal, {"'w'", "no data"});
  expect_error([&] { writer.add_raw("w", "U8", {-8}, bytes, 8); }, ErrorKind::Internal, {"'w'", "negative"});
  // None of those took the name.
  writer.add_raw("w", "U8", {8}, bytes, 8);
  expect_error([&] { writer.add_raw("w", "I8", {8}, bytes, 8); }, ErrorKind::Internal, {"'w'", "twice"});
  const float x = 1.0f;
  expect_error([&] { writer.add("w", DType::F32, {1}, &x); }, ErrorKind::Internal, {"'w'", "twice"});
  expect_error([&] { writer.add_raw("__metadata__", "U8", {8}, bytes, 8); }, ErrorKind::Internal, {"__metadata__"});
}

TEST_F(SafetensorsWriterTest, Errors) {
  SafetensorsWriter writer;
  float x = 1.0f;
  writer.add("t", DType::F32, {1}, &x);
  EXPECT_THROW(writer.add("t", DType::F32, {1}, &x), moed::Error);  // duplicate
  EXPECT_THROW(writer.add("n", DType::F32, {-1}, &x), moed::Error);
  EXPECT_THROW(writer.add("__metadata__", DType::F32, {1}, &x), moed::Error);
  expect_error([&] { writer.write(file("no/such/dir/x.safetensors")); }, ErrorKind::Input,
               {"no/such/dir/x.safetensors"});
}

}  // namespace
}  // namespace moed::weights
