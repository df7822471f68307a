// Config tables: defaults, TOML loading, --set overrides, every refusal (kind,
// key, what is allowed, where in the file) and the printed config round trip.
#include "common/config_table.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "common/error.h"
#include "tests/unit/test_support.h"

namespace moed::config {
namespace {

// A two-section config with every kind of key.
struct Model {
  std::int64_t layers = 0;
  double temperature = 0;
  bool hierarchical = false;
  std::string name;
  std::string dtype;
  bool operator==(const Model&) const = default;
};
struct Router {
  std::int64_t top_k = 0;
  double top_p = 0;
  double eps = 0;
  std::string note;
  bool operator==(const Router&) const = default;
};
struct Root {
  Model model;
  Router router;
  bool operator==(const Root&) const = default;
};

// Schema keeps references to its sections: they must outlive it.
const Section<Model> kModel{
    "model",
    "the model served",
    {
        integer("layers", &Model::layers, 4, 1, 1024, "MoE layers served"),
        real("temperature", &Model::temperature, 1.0, 0.01, 100, "softmax temperature"),
        flag("hierarchical", &Model::hierarchical, true, "hierarchical dispatch"),
        text("name", &Model::name, "demo", "model name"),
        choice("dtype", &Model::dtype, "fp32", {"fp32", "bf16", "fp8"}, "weight type"),
    }};
const Section<Router> kRouter{
    "router",
    "routing",
    {
        integer("top_k", &Router::top_k, 2, 1, 8, "experts per token"),
        real("top_p", &Router::top_p, 0.7, 0, 1, "nucleus mass"),
        real("eps", &Router::eps, 1e-5, 0, 1, "smoothing"),
        text("note", &Router::note, "", "free text"),
    }};

Schema<Root> make_schema() {
  Schema<Root> s;
  s.add(kModel, &Root::model);
  s.add(kRouter, &Root::router);
  return s;
}

Root expected_defaults() {
  Root r;
  r.model = {4, 1.0, true, "demo", "fp32"};
  r.router = {2, 0.7, 1e-5, ""};
  return r;
}

Root load_text(const std::string& text) {
  auto schema = make_schema();
  Root r = schema.defaults();
  schema.load(detail::parse_toml(text, "test.toml"), r, "test.toml");
  return r;
}

using test::expect_error;

TEST(ConfigTable, DefaultsAreApplied) {
  EXPECT_EQ(make_schema().defaults(), expected_defaults());
  EXPECT_EQ(kModel.defaults(), expected_defaults().model);
  EXPECT_EQ(make_schema().section_names(), (std::vector<std::string>{"model", "router"}));
}

TEST(ConfigTable, LoadsTomlOverDefaults) {
  Root r = load_text(R"(
[model]
layers = 8
temperature = 0.5
hierarchical = false
name = "mixtral"
dtype = "bf16"
[router]
top_k = 3
)");
  Root want = expected_defaults();
  want.model = {8, 0.5, false, "mixtral", "bf16"};
  want.router.top_k = 3;  // the other router keys keep their defaults
  EXPECT_EQ(r, want);
}

TEST(ConfigTable, RealKeyAcceptsAnInteger) {
  Root r = load_text("[model]\ntemperature = 2\n");
  EXPECT_EQ(r.model.temperature, 2.0);
}

TEST(ConfigTable, UnknownKeyNamesItAndSuggestsTheClosest) {
  expect_error([] { load_text("[model]\nlayer = 8\n"); }, ErrorKind::Usage,
               {"[model].layer", "did you mean 'layers'"});
  // Nothing close: no suggestion, but the known keys are listed.
  try {
    load_text("[router]\nzzzzzzzz = 1\n");
    ADD_FAILURE() << "no error thrown";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_EQ(e.kind(), ErrorKind::Usage);
    EXPECT_NE(msg.find("[router].zzzzzzzz"), std::string::npos) << msg;
    EXPECT_EQ(msg.find("did you mean"), std::string::npos) << msg;
    EXPECT_NE(msg.find("top_k, top_p, eps, note"), std::string::npos) << msg;
  }
}

// Every other refusal of a value read from a file says where it was; an
// unknown key should too (the operator has to find the line).
TEST(ConfigTable, UnknownKeyFromFileNamesItsLine) {
  expect_error([] { load_text("[model]\nlayers = 2\nlayer = 8\n"); }, ErrorKind::Usage,
               {"[model].layer", "(at test.toml:3)"});
}

TEST(ConfigTable, UnknownSectionNamesIt) {
  expect_error([] { load_text("[modle]\nlayers = 1\n"); }, ErrorKind::Usage,
               {"[modle]", "test.toml", "did you mean 'model'"});
}

// User input in messages is quoted, escaped and cut (hostile testing found a
// NUL byte cutting a message, a 50 MB value printed whole, and int64 max
// shown as 9.223372036854776e+18).
TEST(ConfigTable, UserInputInMessagesIsEscapedAndCut) {
  expect_error([] { load_text(std::string("[model]\n\"lay\\u0000ers\" = 2\n")); }, ErrorKind::Usage,
               {"unknown key [model].lay\\x00ers"});
  expect_error([] { load_text("[model]\nlayers = 9223372036854775807\n"); }, ErrorKind::Usage,
               {"[model].layers = 9223372036854775807 is out of range"});
  const std::string huge(1 << 20, 'q');
  try {
    load_text("[model]\ndtype = \"" + huge + "\"\n");
    ADD_FAILURE() << "a 1 MB dtype was accepted";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_LT(message.size(), 600u);
    EXPECT_NE(message.find("...\" (1048576 bytes) is not allowed"), std::string::npos) << message;
  }
  expect_error([] { load_text("[model]\nlayers = \"\\u001b[2J\"\n"); }, ErrorKind::Usage,
               {"got string \"\\x1B[2J\""});
}

TEST(ConfigTable, KeyOutsideASectionIsRefused) {
  // A top-level key that shares a section's name.
  expect_error([] { load_text("model = 3\n"); }, ErrorKind::Usage,
               {"'model'", "test.toml", "not a section"});
  // Any other top-level key: also "not a section", not "unknown section".
  expect_error([] { load_text("layers = 4\n[model]\nlayers = 2\n"); }, ErrorKind::Usage,
               {"'layers'", "test.toml", "not a section"});
}

struct BadValue {
  std::string label;
  std::string toml;                // the whole document
  std::vector<std::string> parts;  // expected in the message
};

void PrintTo(const BadValue& c, std::ostream* os) { *os << c.label; }

class ConfigTableBadValue : public ::testing::TestWithParam<BadValue> {};

TEST_P(ConfigTableBadValue, IsAUsageErrorNamingKeyAllowedAndLine) {
  expect_error([&] { load_text(GetParam().toml); }, ErrorKind::Usage, GetParam().parts);
}

INSTANTIATE_TEST_SUITE_P(
    WrongType, ConfigTableBadValue,
    ::testing::Values(
        BadValue{"string_for_integer", "[model]\n\nlayers = \"eight\"\n",
                 {"[model].layers", "must be an integer", "string \"eight\"", "(at test.toml:3)"}},
        BadValue{"float_for_integer", "[model]\nlayers = 2.5\n",
                 {"[model].layers", "must be an integer", "(at test.toml:2)"}},
        BadValue{"string_for_real", "[model]\ntemperature = \"hot\"\n",
                 {"[model].temperature", "must be a number", "(at test.toml:2)"}},
        BadValue{"integer_for_bool", "[model]\nhierarchical = 1\n",
                 {"[model].hierarchical", "must be true or false", "(at test.toml:2)"}},
        BadValue{"integer_for_string", "[router]\nnote = 3\n",
                 {"[router].note", "must be a string", "integer 3", "(at test.toml:2)"}}),
    [](const auto& info) { return info.param.label; });

INSTANTIATE_TEST_SUITE_P(
    OutOfRange, ConfigTableBadValue,
    ::testing::Values(
        BadValue{"integer_below_min", "[model]\nlayers = 0\n",
                 {"[model].layers = 0", "out of range", "integer from 1 to 1024",
                  "(at test.toml:2)"}},
        BadValue{"integer_above_max", "[model]\nlayers = 1025\n",
                 {"[model].layers = 1025", "out of range", "integer from 1 to 1024"}},
        BadValue{"real_below_min", "[model]\ntemperature = 0.001\n",
                 {"[model].temperature = 0.001", "out of range", "number from 0.01 to 100"}},
        BadValue{"real_above_max", "[model]\n# comment\ntemperature = 1e3\n",
                 {"[model].temperature = 1000", "out of range", "number from 0.01 to 100",
                  "(at test.toml:3)"}},
        BadValue{"nan", "[router]\ntop_p = nan\n", {"[router].top_p", "out of range"}}),
    [](const auto& info) { return info.param.label; });

INSTANTIATE_TEST_SUITE_P(
    Choice, ConfigTableBadValue,
    ::testing::Values(BadValue{"not_in_list", "[model]\ndtype = \"fp16\"\n",
                               {"[model].dtype = \"fp16\"", "not allowed",
                                "one of \"fp32\", \"bf16\", \"fp8\"", "(at test.toml:2)"}}),
    [](const auto& info) { return info.param.label; });

struct SetCase {
  std::string label;
  std::string assignment;
  std::function<void(Root&)> change;  // what the assignment should do to the defaults
};

void PrintTo(const SetCase& c, std::ostream* os) { *os << c.assignment; }

class ConfigTableSet : public ::testing::TestWithParam<SetCase> {};

TEST_P(ConfigTableSet, ChangesExactlyTheNamedKey) {
  auto schema = make_schema();
  Root r = schema.defaults();
  schema.set(r, GetParam().assignment);
  Root want = expected_defaults();
  GetParam().change(want);
  EXPECT_EQ(r, want);
}

INSTANTIATE_TEST_SUITE_P(
    EachType, ConfigTableSet,
    ::testing::Values(
        SetCase{"integer", "model.layers=16", [](Root& r) { r.model.layers = 16; }},
        SetCase{"real", "model.temperature=0.25", [](Root& r) { r.model.temperature = 0.25; }},
        SetCase{"real_from_integer", "model.temperature=3",
                [](Root& r) { r.model.temperature = 3.0; }},
        SetCase{"real_exponent", "router.eps=1e-3", [](Root& r) { r.router.eps = 1e-3; }},
        SetCase{"bool", "model.hierarchical=false",
                [](Root& r) { r.model.hierarchical = false; }},
        SetCase{"bare_word", "model.name=hello", [](Root& r) { r.model.name = "hello"; }},
        SetCase{"quoted", "model.name=\"hello world\"",
                [](Root& r) { r.model.name = "hello world"; }},
        SetCase{"choice_bare", "model.dtype=fp8", [](Root& r) { r.model.dtype = "fp8"; }}),
    [](const auto& info) { return info.param.label; });

class ConfigTableBadSet : public ::testing::TestWithParam<std::pair<std::string, std::string>> {};

// Each bad assignment is a Usage error; the message contains the given part.
TEST_P(ConfigTableBadSet, IsAUsageError) {
  auto schema = make_schema();
  Root r = schema.defaults();
  const auto& [assignment, part] = GetParam();
  expect_error([&] { schema.set(r, assignment); }, ErrorKind::Usage, {part});
  EXPECT_EQ(r, expected_defaults());
}

INSTANTIATE_TEST_SUITE_P(
    Malformed, ConfigTableBadSet,
    ::testing::Values(std::pair{"nokey", "section.key=value, got \"nokey\""},
                      std::pair{"=3", "got \"=3\""}, std::pair{"model.=3", "got \"model.=3\""},
                      std::pair{".layers=3", "got \".layers=3\""},
                      std::pair{"model.layers", "got \"model.layers\""},
                      // Well formed, but refused by the schema.
                      std::pair{"model.layers=many", "[model].layers"},
                      std::pair{"model.layers=0", "out of range"},
                      std::pair{"nosuch.layers=1", "[nosuch]"},
                      std::pair{"model.nosuch=1", "[model].nosuch"}));

TEST(ConfigTable, SyntaxErrorNamesFileLineAndColumn) {
  // Line 3, column 10: the second '=' of "layers = = 3".
  expect_error([] { detail::parse_toml("# c\n[model]\nlayers = = 3\n", "test.toml"); },
               ErrorKind::Usage, {"test.toml:3:10"});
  // An unterminated string on line 2.
  expect_error([] { detail::parse_toml("[model]\nname = \"abc\n", "test.toml"); },
               ErrorKind::Usage, {"test.toml:2:"});
}

TEST(ConfigTable, PrintReloadsToTheSameValues) {
  auto schema = make_schema();
  Root r = schema.defaults();
  r.model = {1024, 0.7, false, "say \"hi\" \\ back\\slash", "fp8"};
  r.router = {8, 1.0 / 3.0, 1e-5, "tab\there\nnewline"};
  std::ostringstream out;
  schema.print(out, r);
  Root back = schema.defaults();
  back.model.layers = 1;  // ensure the print overwrites every key, not just matches defaults
  schema.load(detail::parse_toml(out.str(), "printed.toml"), back, "printed.toml");
  EXPECT_EQ(back, r) << out.str();
}

TEST(ConfigTable, PrintPutsADocCommentBeforeEachKey) {
  auto schema = make_schema();
  std::ostringstream out;
  schema.print(out, schema.defaults());
  std::vector<std::string> lines;
  std::istringstream in(out.str());
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) lines.push_back(line);
  // Written out by hand: "# doc (allowed; default X)" then "key = value".
  std::vector<std::string> want = {
      "[model]  # the model served",
      "# MoE layers served (integer from 1 to 1024; default 4)",
      "layers = 4",
      "# softmax temperature (number from 0.01 to 100; default 1.0)",
      "temperature = 1.0",
      "# hierarchical dispatch (true or false; default true)",
      "hierarchical = true",
      "# model name (string; default \"demo\")",
      "name = \"demo\"",
      "# weight type (one of \"fp32\", \"bf16\", \"fp8\"; default \"fp32\")",
      "dtype = \"fp32\"",
      "[router]  # routing",
      "# experts per token (integer from 1 to 8; default 2)",
      "top_k = 2",
      "# nucleus mass (number from 0 to 1; default 0.7)",
      "top_p = 0.7",
      "# smoothing (number from 0 to 1; default 1e-05)",
      "eps = 1e-05",
      "# free text (string; default \"\")",
      "note = \"\"",
  };
  EXPECT_EQ(lines, want) << out.str();
}

}  // namespace
}  // namespace moed::config
