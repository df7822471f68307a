// Stats files: the exact bytes and a round trip (the Mixtral statistics
// too), and every kind of bad file refused with an Input error naming it.
#include "routing/stats_file.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <source_location>
#include <sstream>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "common/error.h"
#include "routing/routing_stats.h"
#include "routing/routing_trace.h"
#include "tests/unit/routing/stats_checks.h"
#include "tests/unit/test_support.h"

namespace moed::routing {
namespace {

using checks::expect_close;
using checks::expect_identical;
using checks::feed;
using test::expect_error;

const std::string kDataDir = MOED_TEST_DATA_DIR;

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// The file format's checksum, written out again here (64-bit FNV-1a).
std::uint64_t fnv1a(std::string_view bytes) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : bytes) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

void put_le(std::string& bytes, std::size_t offset, std::uint64_t value, int width) {
  for (int i = 0; i < width; ++i)
    bytes[offset + static_cast<std::size_t>(i)] = static_cast<char>((value >> (8 * i)) & 0xff);
}

void reseal(std::string& bytes) { put_le(bytes, bytes.size() - 8, fnv1a(bytes.substr(0, bytes.size() - 8)), 8); }

// Header offsets.
constexpr std::size_t kVersionAt = 8, kLayersAt = 12, kExpertsAt = 16, kMaxKAt = 20,
                      kSampleCountAt = 40, kValuesAt = 48;

// 2 layers x 3 experts, max_k 2, half-life 2, a sample of 2 (of 3 tokens), 5 steps.
RoutingStats small_stats() {
  RoutingStats stats(2, 3, 2.0, 2, 2);
  feed(stats, {{0, 1}, {2}});
  stats.end_step();
  feed(stats, {{2}, {1, 0}});
  stats.end_step();
  stats.end_step();
  feed(stats, {{1, 2}, {0, 2}});
  stats.end_step();
  stats.end_step();
  return stats;
}
// 48 header + 8 x (6 + 6 + 9 + 2) values + 4 x 2 x 2 x 3 sample + 8 checksum.
constexpr std::size_t kSmallFileBytes = 48 + 8 * 23 + 4 * 12 + 8;

TEST(RoutingStatsFile, RoundTripsExactly) {
  test::TempDir dir;
  const std::string path = dir.file("stats.bin");
  RoutingStats stats = small_stats();
  write_stats_file(stats, path);
  EXPECT_EQ(std::filesystem::file_size(path), kSmallFileBytes);
  const std::string bytes = slurp(path);
  EXPECT_EQ(bytes.substr(0, 8), "MOEDSTAT");
  EXPECT_EQ(bytes[kVersionAt], 1);
  EXPECT_EQ(bytes[kLayersAt], 2);

  RoutingStats back = read_stats_file(path);
  EXPECT_EQ(back.layers(), 2);
  EXPECT_EQ(back.experts(), 3);
  EXPECT_EQ(back.half_life_steps(), 2.0);
  EXPECT_EQ(back.steps(), 5u);
  expect_identical(back, stats);
  EXPECT_EQ(back.sample_size(), 2u);
  EXPECT_EQ(back.sample_cells(), stats.sample_cells());
  // Written again, the same bytes.
  write_stats_file(back, dir.file("again.bin"));
  EXPECT_EQ(slurp(dir.file("again.bin")), bytes);

  // Decay continues where it was (the copy starts at weight 1, the original not).
  for (RoutingStats* s : {&stats, &back}) {
    s->end_step();
    feed(*s, {{0, 2}, {1}});
    s->end_step();
  }
  expect_close(back, stats, 1e-12);
  EXPECT_EQ(back.steps(), 7u);
  EXPECT_EQ(back.sample_trace().at(1, 0)[1].expert, 2u);
}

void expect_refused(const test::TempDir& dir, const std::string& bytes, std::vector<std::string> parts,
                    std::source_location where = std::source_location::current());

TEST(RoutingStatsFile, KeepsTheRouterBiasesAsVersion2) {
  test::TempDir dir;
  RoutingStats stats = small_stats();
  const std::vector<double> bias{0.5, -0.25, 0, 1e-3, -1e-3, 2};
  stats.set_router_bias(bias);
  write_stats_file(stats, dir.file("bias.stats"));
  const std::string bytes = slurp(dir.file("bias.stats"));
  EXPECT_EQ(bytes[kVersionAt], 2);
  EXPECT_EQ(bytes.size(), kSmallFileBytes + 4 + 8 * 6);
  RoutingStats back = read_stats_file(dir.file("bias.stats"));
  EXPECT_EQ(back.router_bias(), bias);
  expect_identical(back, stats);
  EXPECT_TRUE(read_stats_file((write_stats_file(small_stats(), dir.file("none.stats")), dir.file("none.stats")))
                  .router_bias()
                  .empty());

  const std::size_t count_at = kSmallFileBytes - 8;  // where version 1 had its checksum
  std::string b = bytes;
  put_le(b, count_at, 5, 4);
  reseal(b);
  expect_refused(dir, b, {"5 router biases", "layers x experts = 6"});
  b = bytes;
  put_le(b, count_at + 4 + 8 * 2, std::bit_cast<std::uint64_t>(std::nan("")), 8);
  reseal(b);
  expect_refused(dir, b, {"router bias 2", "layer 0 expert 2", "nan"});
  expect_refused(dir, bytes.substr(0, bytes.size() - 9), {"truncated"});
}

TEST(RoutingStatsFile, RoundTripsTheMixtralStatistics) {
  test::TempDir dir;
  const RoutingTrace trace = read_trace(kDataDir + "/mixtral-humaneval.trace");
  const RoutingStats stats = RoutingStats::from_trace(trace, 0, trace.tokens());
  write_stats_file(stats, dir.file("mixtral.stats"));
  const RoutingStats back = read_stats_file(dir.file("mixtral.stats"));
  expect_identical(back, stats);
  EXPECT_EQ(back.raw(), stats.raw());
  EXPECT_EQ(back.sample_cells(), stats.sample_cells());
}

// Writes `bytes` as a file and expects read_stats_file to refuse it with an
// Input error naming the file and containing `parts`.
void expect_refused(const test::TempDir& dir, const std::string& bytes,
                    std::vector<std::string> parts,
                    std::source_location where) {
  const std::string path = dir.write("bad.stats", bytes);
  parts.push_back(path);
  expect_error([&] { read_stats_file(path); }, ErrorKind::Input, parts, where);
}

TEST(RoutingStatsFile, RefusesEveryKindOfBadFile) {
  test::TempDir dir;
  write_stats_file(small_stats(), dir.file("good.stats"));
  const std::string good = slurp(dir.file("good.stats"));
  ASSERT_EQ(good.size(), kSmallFileBytes);

  expect_error([&] { read_stats_file(dir.file("missing.stats")); }, ErrorKind::Input,
               {dir.file("missing.stats"), "cannot open"});
  expect_refused(dir, "", {"too short", "0 bytes"});
  expect_refused(dir, good.substr(0, 30), {"too short", "30 bytes"});
  expect_refused(dir, "MOED", {"too short"});
  expect_refused(dir, "layers = 2\nexperts = 8\n", {"not a moed stats file"});
  expect_refused(dir, "MOEDSTAX" + good.substr(8), {"not a moed stats file"});

  std::string b = good;
  put_le(b, kVersionAt, 3, 4);
  expect_refused(dir, b, {"unsupported", "version 3", "supported: 1, 2"});

  for (auto [at, value, what] : {std::tuple{kLayersAt, 0u, "layers = 0"},
                                 std::tuple{kLayersAt, 4097u, "layers = 4097"},
                                 std::tuple{kExpertsAt, 0u, "experts = 0"},
                                 std::tuple{kExpertsAt, 65537u, "experts = 65537"},
                                 std::tuple{kMaxKAt, 0u, "max_k = 0"},
                                 std::tuple{kMaxKAt, 1025u, "max_k = 1025"}}) {
    b = good;
    put_le(b, at, value, 4);
    expect_refused(dir, b, {"absurd shape", what});
  }

  const std::string expected = "expected " + std::to_string(kSmallFileBytes) + " bytes";
  expect_refused(dir, good.substr(0, good.size() - 1),
                 {expected, "got " + std::to_string(kSmallFileBytes - 1), "truncated"});
  expect_refused(dir, good + '\0', {expected, "trailing bytes"});
  b = good;
  put_le(b, kSampleCountAt, 3, 8);  // one more path than the file holds
  expect_refused(dir, b, {"truncated", "3 sampled tokens"});
  b = good;
  put_le(b, kSampleCountAt, ~std::uint64_t{0}, 8);  // would overflow any size computation
  expect_refused(dir, b, {"truncated"});
  b = good;
  put_le(b, kLayersAt, 4096, 4);
  put_le(b, kExpertsAt, 65536, 4);  // terabytes of values: refused before any allocation
  expect_refused(dir, b, {"size does not match"});

  b = good;
  b[kValuesAt + 3] ^= 0x10;
  expect_refused(dir, b, {"corrupt", "checksum"});
  b = good;
  b.back() ^= 0x01;
  expect_refused(dir, b, {"corrupt"});

  // Values that a valid checksum cannot excuse.
  b = good;
  put_le(b, kValuesAt + 8 * 1, std::bit_cast<std::uint64_t>(-1.0), 8);
  reseal(b);
  expect_refused(dir, b, {"value 1", "load of layer 0 expert 1", "-1"});
  b = good;
  put_le(b, kValuesAt + 8 * 22, std::bit_cast<std::uint64_t>(std::nan("")), 8);
  reseal(b);
  expect_refused(dir, b, {"value 22", "tokens of layer 1", "nan"});
  b = good;
  put_le(b, kValuesAt + 8 * 13, std::bit_cast<std::uint64_t>(std::numeric_limits<double>::infinity()), 8);
  reseal(b);
  expect_refused(dir, b, {"affinity of layer 0 (expert 0 to 1)", "inf"});
  b = good;
  put_le(b, 24, std::bit_cast<std::uint64_t>(-2.0), 8);  // half-life
  reseal(b);
  expect_refused(dir, b, {"half-life"});

  // Sample cells: token 1 layer 1 starts 9 u32 after the first cell.
  const std::size_t cells_at = kValuesAt + 8 * 23;
  b = good;
  put_le(b, cells_at + 4 * 9, 3, 4);
  reseal(b);
  expect_refused(dir, b, {"sample token 1 layer 1", "3 experts, more than max_k 2"});
  b = good;
  put_le(b, cells_at + 4 * 1, 3, 4);
  reseal(b);
  expect_refused(dir, b, {"sample token 0 layer 0", "expert 3 out of range"});
  b = good;
  put_le(b, cells_at + 4 * 8, 1, 4);  // token 1 layer 0 is {1, 2}: now {1, 1}
  reseal(b);
  expect_refused(dir, b, {"sample token 1 layer 0", "expert 1 twice"});
}

TEST(RoutingStatsFile, RefusesEveryCorruptedByte) {
  test::TempDir dir;
  write_stats_file(small_stats(), dir.file("good.stats"));
  const std::string good = slurp(dir.file("good.stats"));
  for (std::size_t i = 0; i < good.size(); ++i)
    for (unsigned char flip : {0x01, 0x80}) {  // the lowest and the highest bit
      std::string b = good;
      b[i] = static_cast<char>(static_cast<unsigned char>(b[i]) ^ flip);
      SCOPED_TRACE("byte " + std::to_string(i) + " ^ " + std::to_string(flip));
      expect_refused(dir, b, {});
    }
  // And every truncation.
  for (std::size_t n = 0; n < good.size(); ++n) {
    SCOPED_TRACE("first " + std::to_string(n) + " bytes");
    expect_refused(dir, good.substr(0, n), {});
  }
}

}  // namespace
}  // namespace moed::routing
