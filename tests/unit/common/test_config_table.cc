// Config tables: defaults, TOML loading, --set overrides, every refusal (kind,
// key, what is allowed, where in the file) and the printed config round trip;
// enum keys through their name tables, and renamed keys' old names.
#include "common/config_table.h"

#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

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

// ---- enum keys and renamed keys --------------------------------------------------------

enum class Gemm { fixed_order, openblas };
constexpr auto kGemmNames = name_table<Gemm>({{Gemm::fixed_order, "fixed-order"}, {Gemm::openblas, "openblas"}});
static_assert(kGemmNames.find("openblas") == Gemm::openblas && !kGemmNames.find("OpenBLAS"));

struct Experts {
  Gemm gemm = Gemm::openblas;
  std::int64_t chunk_rows = 0;
  bool operator==(const Experts&) const = default;
};
// The same key as a string choice: what moed declared before its choices were enums.
struct ExpertsText {
  std::string gemm;
  std::int64_t chunk_rows = 0;
};
struct Both {
  Experts experts;
  ExpertsText text;
};

const Section<Experts> kExperts{
    "experts",
    "expert computation",
    {
        choice("gemm", &Experts::gemm, Gemm::fixed_order, kGemmNames, "the GEMM"),
        integer("chunk_rows", &Experts::chunk_rows, 512, 1, 4096, "rows per call")
            .renamed_from("rows_per_call")
            .renamed_from("chunk"),
    }};
const Section<ExpertsText> kExpertsText{
    "experts",
    "expert computation",
    {
        choice("gemm", &ExpertsText::gemm, "fixed-order", {"fixed-order", "openblas"}, "the GEMM"),
        integer("chunk_rows", &ExpertsText::chunk_rows, 512, 1, 4096, "rows per call"),
    }};

Schema<Both> enum_schema() {
  Schema<Both> s;
  s.add(kExperts, &Both::experts);
  return s;
}
Schema<Both> text_schema() {
  Schema<Both> s;
  s.add(kExpertsText, &Both::text);
  return s;
}

Experts load_experts(const std::string& text, const std::vector<std::string>& sets = {}) {
  auto schema = enum_schema();
  Both b = schema.defaults();
  schema.load(detail::parse_toml(text, "test.toml"), b, "test.toml");
  for (const auto& set : sets) schema.set(b, set);
  return b.experts;
}

// The message of the error `f` throws.
std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}
std::string load_error(const Schema<Both>& schema, const std::string& text) {
  return message_of([&] {
    Both b = schema.defaults();
    schema.load(detail::parse_toml(text, "test.toml"), b, "test.toml");
  });
}
std::string set_error(const Schema<Both>& schema, const std::string& assignment) {
  return message_of([&] {
    Both b = schema.defaults();
    schema.set(b, assignment);
  });
}

TEST(ConfigTableEnum, DefaultsLoadAndSetByName) {
  EXPECT_EQ(kExperts.defaults(), (Experts{Gemm::fixed_order, 512}));
  EXPECT_EQ(load_experts("[experts]\ngemm = \"openblas\"\n").gemm, Gemm::openblas);
  EXPECT_EQ(load_experts("", {"experts.gemm=openblas"}).gemm, Gemm::openblas);
  EXPECT_EQ(load_experts("[experts]\ngemm = \"openblas\"\n", {"experts.gemm=fixed-order"}).gemm, Gemm::fixed_order);
}

// An enum key prints, and refuses, byte for byte as the string choice it replaced.
TEST(ConfigTableEnum, PrintsAndRefusesAsTheStringChoice) {
  std::ostringstream as_enum, as_text;
  Both values = enum_schema().defaults();
  values.experts.gemm = Gemm::openblas;
  enum_schema().print(as_enum, values);
  Both text_values = text_schema().defaults();
  text_values.text.gemm = "openblas";
  text_schema().print(as_text, text_values);
  EXPECT_EQ(as_enum.str(), as_text.str());
  EXPECT_NE(as_enum.str().find("# the GEMM (one of \"fixed-order\", \"openblas\"; default \"fixed-order\")\n"
                               "gemm = \"openblas\"\n"),
            std::string::npos)
      << as_enum.str();
  for (const std::string bad : {"[experts]\ngemm = \"fast\"\n", "[experts]\n\ngemm = 3\n"})
    EXPECT_EQ(load_error(enum_schema(), bad), load_error(text_schema(), bad));
  EXPECT_EQ(set_error(enum_schema(), "experts.gemm=fast"), set_error(text_schema(), "experts.gemm=fast"));
  expect_error([] { load_experts("[experts]\ngemm = \"fast\"\n"); }, ErrorKind::Usage,
               {"config: [experts].gemm = \"fast\" is not allowed: one of \"fixed-order\", \"openblas\" (at "
                "test.toml:2)"});
}

TEST(NameTable, NamesValuesBothWays) {
  EXPECT_EQ(kGemmNames.name(Gemm::fixed_order), "fixed-order");
  EXPECT_EQ(kGemmNames.name(Gemm::openblas), "openblas");
  EXPECT_EQ(kGemmNames.parse("openblas", "--gemm"), Gemm::openblas);
  EXPECT_EQ(kGemmNames.names(), (std::vector<std::string>{"fixed-order", "openblas"}));
  EXPECT_EQ(kGemmNames.find("fixed_order"), std::nullopt);
  // An unknown name: a Usage error in the config's words, naming where it came from.
  expect_error([] { kGemmNames.parse("fast", "--gemm"); }, ErrorKind::Usage,
               {"--gemm = \"fast\" is not allowed: one of \"fixed-order\", \"openblas\""});
  expect_error([] { kGemmNames.name(static_cast<Gemm>(7)); }, ErrorKind::Internal, {"7", "2 names"});
}

// A renamed key: its old names are still read (TOML and --set), never printed
// or offered, and a warning says so once per process.
TEST(ConfigTableRenamedKey, OldNamesAreReadAndWarnedOnce) {
  std::ostringstream log;
  auto previous = spdlog::default_logger();
  spdlog::set_default_logger(
      std::make_shared<spdlog::logger>("capture", std::make_shared<spdlog::sinks::ostream_sink_st>(log)));
  EXPECT_EQ(load_experts("[experts]\nrows_per_call = 64\n").chunk_rows, 64);
  EXPECT_EQ(load_experts("[experts]\nrows_per_call = 32\n").chunk_rows, 32);
  EXPECT_EQ(load_experts("", {"experts.rows_per_call=16"}).chunk_rows, 16);
  EXPECT_EQ(load_experts("[experts]\nchunk_rows = 8\n", {"experts.rows_per_call=16"}).chunk_rows, 16);
  spdlog::set_default_logger(previous);
  const std::string warned = log.str();
  const std::string once = "config: [experts].rows_per_call is deprecated: the key is now [experts].chunk_rows";
  ASSERT_NE(warned.find(once), std::string::npos) << warned;
  EXPECT_EQ(warned.find(once, warned.find(once) + 1), std::string::npos) << "warned twice: " << warned;
  // An old name is checked as the key is; the refusal names it as written.
  expect_error([] { load_experts("[experts]\nrows_per_call = 0\n"); }, ErrorKind::Usage,
               {"[experts].rows_per_call = 0 is out of range: allowed integer from 1 to 4096"});
}

TEST(ConfigTableRenamedKey, NeverPrintedNorOffered) {
  std::ostringstream out;
  auto schema = enum_schema();
  Both b = schema.defaults();
  schema.set(b, "experts.chunk=100");
  schema.print(out, b);
  EXPECT_NE(out.str().find("chunk_rows = 100\n"), std::string::npos) << out.str();
  EXPECT_EQ(out.str().find("rows_per_call"), std::string::npos) << out.str();
  EXPECT_EQ(out.str().find("chunk ="), std::string::npos) << out.str();
  expect_error([] { load_experts("[experts]\nchunk_row = 1\n"); }, ErrorKind::Usage,
               {"did you mean 'chunk_rows'", "keys of [experts]: gemm, chunk_rows"});
}

TEST(ConfigTableRenamedKey, NameAndOldNameTogetherAreRefused) {
  expect_error([] { load_experts("[experts]\nchunk_rows = 8\nrows_per_call = 64\n"); }, ErrorKind::Usage,
               {"[experts].rows_per_call and [experts].chunk_rows are one key", "(at test.toml:3)",
                "keep [experts].chunk_rows"});
}

TEST(ConfigTableRenamedKey, ANameDeclaredTwiceIsAnInternalError) {
  expect_error(
      [] {
        Section<Experts> twice("experts", "doc",
                               {integer("chunk_rows", &Experts::chunk_rows, 1, 1, 2, "rows"),
                                choice("gemm", &Experts::gemm, Gemm::openblas, kGemmNames, "the GEMM")
                                    .renamed_from("chunk_rows")});
      },
      ErrorKind::Internal, {"[experts]", "chunk_rows twice"});
}

}  // namespace
}  // namespace moed::config
