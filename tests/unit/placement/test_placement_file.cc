// Placement files: round trip, every refusal naming the file and the fault,
// the shape check, and writing/reading through a temp folder.
#include "placement/placement_file.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <iterator>
#include <tuple>
#include <string>
#include <vector>

#include "common/error.h"
#include "tests/unit/test_support.h"

namespace moed::placement {
namespace {

namespace fs = std::filesystem;

using test::expect_error;

// The example from placement_file.h, written by hand.
const std::string kExample = R"(format = "moed-placement-v1"
epoch = 3
ranks = 4
layers = 2
experts = 8
[[layer]]
slots = [[0], [0], [1], [1], [2], [2], [3], [3]]
[[layer]]
slots = [[0], [0], [1], [1], [2], [2], [3], [3, 1]]
)";

TEST(PlacementFile, ParsesTheDocumentedExample) {
  Placement p = parse_placement(kExample, "example.toml");
  EXPECT_EQ(p.ranks(), 4);
  EXPECT_EQ(p.layers(), 2);
  EXPECT_EQ(p.experts(), 8);
  EXPECT_EQ(p.epoch(), 3u);
  Placement want = contiguous(4, 2, 8);
  want.set_epoch(3);
  want.set_replicas(1, 7, {3, 1});
  EXPECT_EQ(p, want);
}

TEST(PlacementFile, FormatParseRoundTrip) {
  Placement p = add_random_replicas(shuffled(4, 3, 8, 1), 6, 2);
  p.set_epoch(42);
  p.set_replicas(2, 5, {3, 0, 2});  // replica order is not sorted and must stay so
  Placement back = parse_placement(format_placement(p), "round.toml");
  EXPECT_EQ(back, p);
  EXPECT_EQ(back.replicas(2, 5), (std::vector<int>{3, 0, 2}));
  EXPECT_EQ(back.epoch(), 42u);
  // A large epoch survives too.
  p.set_epoch(std::uint64_t(1) << 40);
  EXPECT_EQ(parse_placement(format_placement(p), "round.toml").epoch(), std::uint64_t(1) << 40);
}

// A model with dense layers: each [[layer]] names its model layer, checked on read.
TEST(PlacementFile, ModelLayerNumbersAreWrittenAndChecked) {
  const Placement p = contiguous(2, 3, 4);
  const LayerNumbers deepseek({3, 4, 5});
  const std::string text = format_placement(p, deepseek);
  EXPECT_NE(text.find("model_layer = 3\n"), std::string::npos) << text;
  EXPECT_NE(text.find("model_layer = 5\n"), std::string::npos) << text;
  EXPECT_EQ(format_placement(p).find("model_layer"), std::string::npos);  // no dense layers: the file as before
  EXPECT_EQ(parse_placement(text, "ds.toml", deepseek), p);
  EXPECT_EQ(parse_placement(text, "ds.toml"), p);  // without the model's numbers (moe-place), not checked
  expect_error([&] { parse_placement(text, "ds.toml", LayerNumbers({2, 4, 5})); }, ErrorKind::Input,
               {"ds.toml", "[[layer]] 0 is for model layer 3", "no MoE layer"});
  expect_error([&] { parse_placement(text, "ds.toml", LayerNumbers({1, 2, 3})); }, ErrorKind::Input,
               {"[[layer]] 0 is for model layer 3", "MoE layer 2"});
}

struct BadFile {
  std::string label;
  std::string text;
  std::vector<std::string> parts;  // besides the origin
};

void PrintTo(const BadFile& c, std::ostream* os) { *os << c.label; }

// A valid 4-rank, 2-layer, 4-expert file is kHeader + kLayers; each refusal
// case below changes one thing in it.
const std::string kHeader =
    "format = \"moed-placement-v1\"\nepoch = 1\nranks = 4\nlayers = 2\nexperts = 4\n";
const std::string kLayers =
    "[[layer]]\nslots = [[0], [1], [2], [3]]\n[[layer]]\nslots = [[3], [2], [1], [0]]\n";

// kHeader with the line of `key` replaced by `line` ("" drops the key).
std::string header_with(const std::string& key, const std::string& line) {
  std::string out;
  for (const std::string k : {"format", "epoch", "ranks", "layers", "experts"}) {
    if (k == key) {
      out += line;
      continue;
    }
    const auto at = kHeader.find(k + " =");
    out += kHeader.substr(at, kHeader.find('\n', at) + 1 - at);
  }
  return out;
}

// kLayers with layer 1's slots replaced.
std::string layer1(const std::string& slots) {
  return "[[layer]]\nslots = [[0], [1], [2], [3]]\n[[layer]]\nslots = " + slots + "\n";
}

class PlacementFileRefuses : public ::testing::TestWithParam<BadFile> {};

TEST_P(PlacementFileRefuses, WithAnInputErrorNamingOriginAndFault) {
  const auto& c = GetParam();
  std::vector<std::string> parts = c.parts;
  parts.emplace_back("plan.toml");
  expect_error([&] { parse_placement(c.text, "plan.toml"); }, ErrorKind::Input, parts);
}

INSTANTIATE_TEST_SUITE_P(
    Header, PlacementFileRefuses,
    ::testing::Values(
        BadFile{"no_format", header_with("format", "") + kLayers, {"moed-placement-v1"}},
        BadFile{"wrong_format", header_with("format", "format = \"moed-placement-v0\"\n") + kLayers,
                {"not a placement file", "moed-placement-v1"}},
        BadFile{"format_not_string", header_with("format", "format = 1\n") + kLayers,
                {"moed-placement-v1"}},
        BadFile{"no_ranks", header_with("ranks", "") + kLayers, {"'ranks'"}},
        BadFile{"no_layers", header_with("layers", "") + kLayers, {"'layers'"}},
        BadFile{"no_experts", header_with("experts", "") + kLayers, {"'experts'"}},
        BadFile{"no_epoch", header_with("epoch", "") + kLayers, {"'epoch'"}},
        BadFile{"ranks_string", header_with("ranks", "ranks = \"4\"\n") + kLayers, {"'ranks'"}},
        BadFile{"ranks_zero", header_with("ranks", "ranks = 0\n") + kLayers,
                {"'ranks' = 0", "out of range [1, "}},
        BadFile{"layers_negative", header_with("layers", "layers = -2\n") + kLayers,
                {"'layers' = -2", "out of range [1, "}},
        BadFile{"experts_negative", header_with("experts", "experts = -1\n") + kLayers,
                {"'experts' = -1"}},
        BadFile{"epoch_negative", header_with("epoch", "epoch = -1\n") + kLayers,
                {"'epoch' = -1", "out of range [0, "}},
        // Counts beyond int must not wrap around to a small valid number (2^32 + 4 -> 4).
        BadFile{"experts_beyond_int", header_with("experts", "experts = 4294967300\n") + kLayers,
                {"'experts'"}},
        // 2^31 becomes a negative int: must be an Input error, not a failed allocation.
        BadFile{"experts_int_min", header_with("experts", "experts = 2147483648\n") + kLayers,
                {"'experts'"}},
        BadFile{"ranks_boolean", header_with("ranks", "ranks = true\n") + kLayers, {"'ranks'"}}),
    [](const auto& info) { return info.param.label; });

INSTANTIATE_TEST_SUITE_P(
    Layers, PlacementFileRefuses,
    ::testing::Values(
        BadFile{"too_few_layers", kHeader + "[[layer]]\nslots = [[0], [1], [2], [3]]\n",
                {"expected 2 [[layer]] tables, found 1"}},
        BadFile{"too_many_layers", kHeader + kLayers + "[[layer]]\nslots = [[0], [1], [2], [3]]\n",
                {"expected 2 [[layer]] tables, found 3"}},
        BadFile{"no_layer_tables", kHeader, {"expected 2 [[layer]] tables, found 0"}},
        BadFile{"no_slots", kHeader + "[[layer]]\nslots = [[0], [1], [2], [3]]\n[[layer]]\nx = 1\n",
                {"layer 1", "'slots'"}},
        BadFile{"too_few_experts", kHeader + layer1("[[0], [1], [2]]"),
                {"layer 1 lists 3 experts, expected 4"}},
        BadFile{"too_many_experts", kHeader + layer1("[[0], [1], [2], [3], [0]]"),
                {"layer 1 lists 5 experts, expected 4"}},
        BadFile{"entry_not_array", kHeader + layer1("[[0], 1, [2], [3]]"),
                {"layer 1 expert 1", "array of ranks"}},
        BadFile{"rank_string", kHeader + layer1("[[0], [\"1\"], [2], [3]]"),
                {"layer 1 expert 1", "integers"}},
        BadFile{"rank_fraction", kHeader + layer1("[[0], [1.5], [2], [3]]"),
                {"layer 1 expert 1", "integers"}},
        BadFile{"rank_boolean", kHeader + layer1("[[0], [true], [2], [3]]"),
                {"layer 1 expert 1", "integers"}},
        BadFile{"rank_out_of_range", kHeader + layer1("[[0], [1], [2], [4]]"),
                {"layer 1 expert 3", "rank 4", "0..3"}},
        BadFile{"rank_negative", kHeader + layer1("[[0], [1], [-1], [3]]"),
                {"layer 1 expert 2", "rank -1"}},
        // 2^32 + 1 must not wrap around to rank 1.
        BadFile{"rank_beyond_int", kHeader + layer1("[[0], [4294967297], [2], [3]]"),
                {"layer 1 expert 1", "4294967297"}},
        BadFile{"rank_twice", kHeader + layer1("[[0], [1, 2, 1], [2], [3]]"),
                {"layer 1 expert 1", "rank 1 twice"}},
        BadFile{"unplaced", kHeader + layer1("[[0], [1], [], [3]]"),
                {"layer 1 expert 2", "no slot"}}),
    [](const auto& info) { return info.param.label; });

INSTANTIATE_TEST_SUITE_P(
    Syntax, PlacementFileRefuses,
    // Line 3, column 9: the second '=' of "ranks = = 4".
    ::testing::Values(BadFile{"syntax", "format = \"moed-placement-v1\"\nepoch = 1\nranks = = 4\n",
                              {"plan.toml:3:9"}}),
    [](const auto& info) { return info.param.label; });

TEST(PlacementFile, ValidFileFromTheHelpersParses) {
  // The refusal cases above differ from this file in one place only.
  Placement p = parse_placement(kHeader + kLayers, "plan.toml");
  EXPECT_EQ(p.replicas(1, 0), (std::vector<int>{3}));
  EXPECT_EQ(parse_placement(header_with("epoch", "epoch = 9\n") + kLayers, "x").epoch(), 9u);
}

TEST(PlacementFile, ShapeCheckNamesBothShapes) {
  Placement p = contiguous(4, 2, 8);
  EXPECT_NO_THROW(check_placement_shape(p, 4, 2, 8, "plan.toml"));
  for (auto [r, l, e] : {std::tuple{8, 2, 8}, std::tuple{4, 3, 8}, std::tuple{4, 2, 16}}) {
    const std::string run =
        std::to_string(r) + " ranks, " + std::to_string(l) + " layers, " + std::to_string(e) + " experts";
    expect_error([&, r = r, l = l, e = e] { check_placement_shape(p, r, l, e, "plan.toml"); }, ErrorKind::Input,
                 {"plan.toml", "4 ranks, 2 layers, 8 experts", run});
  }
}

class PlacementFileIo : public ::testing::Test {
 protected:
  test::TempDir tmp_{"moed_placement"};
};

TEST_F(PlacementFileIo, WriteThenRead) {
  Placement p = add_random_replicas(round_robin(3, 2, 6), 2, 4);
  p.set_epoch(7);
  const std::string path = tmp_.file("placement.toml");
  write_placement_file(p, path);
  EXPECT_EQ(read_placement_file(path), p);
  // Overwrite with a newer epoch.
  p.set_epoch(8);
  write_placement_file(p, path);
  EXPECT_EQ(read_placement_file(path).epoch(), 8u);
  EXPECT_EQ(std::distance(fs::directory_iterator(tmp_.path()), fs::directory_iterator()), 1);
}

TEST_F(PlacementFileIo, MissingFileNamesThePath) {
  const std::string path = tmp_.file("nope.toml");
  expect_error([&] { read_placement_file(path); }, ErrorKind::Input, {path});
}

TEST_F(PlacementFileIo, ErrorsFromAFileNameTheFile) {
  // A valid file spoiled in one place: expert 1 on rank 5 of 2.
  std::string text = format_placement(contiguous(2, 1, 2));
  text.replace(text.rfind("[1]"), 3, "[5]");
  const std::string path = tmp_.write("bad.toml", text);
  expect_error([&] { read_placement_file(path); }, ErrorKind::Input,
               {path + ": ", "layer 0 expert 1", "rank 5"});
}

}  // namespace
}  // namespace moed::placement
