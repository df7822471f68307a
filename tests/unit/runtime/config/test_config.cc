// The daemon's config: defaults, TOML loading, --set overrides, the checks that
// span keys (validate_config), one refusal per kind per section, and
// print_config reloading to itself.
#include "runtime/config/config.h"

#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "common/error.h"
#include "placement/optimizer.h"
#include "tests/unit/test_support.h"

namespace moed::runtime {
namespace {

using test::expect_error;

Config load(const std::string& toml, const std::vector<std::string>& overrides = {}) {
  return load_config_text(toml, "t.toml", overrides);
}

std::string printed(const Config& c) {
  std::ostringstream os;
  print_config(os, c);
  return os.str();
}

// ---------------------------------------------------------------- defaults

TEST(ConfigDefaults, DocumentedValues) {
  const Config c = default_config();
  EXPECT_EQ(c.model.layers, 4);
  EXPECT_EQ(c.model.experts, 8);
  EXPECT_EQ(c.model.top_k, 2);
  EXPECT_EQ(c.model.hidden, 512);
  EXPECT_EQ(c.model.dtype, "f32");
  EXPECT_EQ(c.model.weights, "");
  EXPECT_EQ(c.router.mode, RouterMode::topk);
  EXPECT_DOUBLE_EQ(c.router.temperature, 1.0);
  EXPECT_EQ(c.router.max_k, 0);
  EXPECT_EQ(c.workload.kind, WorkloadKind::synthetic);
  EXPECT_DOUBLE_EQ(c.workload.hot_ratio, 2.75);
  EXPECT_EQ(c.experts.chunk_rows, 512);
  EXPECT_EQ(c.cluster.ranks_per_island, 0);
  EXPECT_EQ(c.comm.backend, comm::Backend::automatic);
  EXPECT_EQ(c.placement.policy, placement::PlacementPolicy::contiguous);
  EXPECT_EQ(c.metrics.load_window_steps, 8);
  EXPECT_EQ(c.log.level, "info");
  EXPECT_TRUE(c.log.per_step);
}

TEST(ConfigDefaults, EmptyTextGivesTheDefaults) {
  EXPECT_EQ(printed(load("")), printed(default_config()));
}

// ---------------------------------------------------------------- loading

TEST(ConfigLoad, FileValuesReplaceDefaultsAndLeaveTheRest) {
  const Config c = load(
      "[model]\n"
      "layers = 6\n"
      "hidden = 32\n"
      "[router]\n"
      "mode = \"topp\"\n"
      "temperature = 2\n"  // an integer is accepted where a number is expected
      "[log]\n"
      "per_step = false\n");
  EXPECT_EQ(c.model.layers, 6);
  EXPECT_EQ(c.model.hidden, 32);
  EXPECT_EQ(c.model.experts, 8);  // untouched
  EXPECT_EQ(c.router.mode, RouterMode::topp);
  EXPECT_DOUBLE_EQ(c.router.temperature, 2.0);
  EXPECT_FALSE(c.log.per_step);
}

TEST(ConfigLoad, OverridesApplyAfterTheFileInOrder) {
  const Config c = load("[model]\nlayers = 6\nhidden = 32\n",
                        {"model.layers=3", "router.mode=topp", "model.hidden=48", "model.hidden=40",
                         "workload.hot_ratio=1.5"});
  EXPECT_EQ(c.model.layers, 3);        // the override beats the file
  EXPECT_EQ(c.router.mode, RouterMode::topp);  // a bare word is read as a string
  EXPECT_EQ(c.model.hidden, 40);       // the last override wins
  EXPECT_DOUBLE_EQ(c.workload.hot_ratio, 1.5);
}

TEST(ConfigLoad, ADirectoryIsRefusedNotReadAsTheDefaults) {
  test::TempDir dir;
  expect_error([&] { load_config(dir.path().string(), {}); }, ErrorKind::Usage,
               {dir.path().string(), "is a directory, not a config file"});
  expect_error([&] { load_config((dir.path() / "missing.toml").string(), {}); }, ErrorKind::Usage,
               {"cannot open", "missing.toml"});
}

TEST(ConfigLoad, CrossKeyChecksSeeTheOverriddenValues) {
  // The file alone is valid; the override makes top_k exceed experts.
  expect_error([] { load("[model]\nexperts = 4\ntop_k = 1\n", {"model.top_k=5"}); },
               ErrorKind::Usage, {"[model].top_k", "[model].experts"});
  // And an override can repair what the file alone would break.
  EXPECT_EQ(load("[model]\nexperts = 4\ntop_k = 1\n[workload]\nhot_ratio = 8.0\n",
                 {"workload.hot_ratio=2.0"})
                .workload.hot_ratio,
            2.0);
}

TEST(ConfigLoad, MicrobatchesNeedTheFixedOrderGemm) {
  // With OpenBLAS a row's bits depend on its chunk, and micro-batches change the chunks.
  expect_error([] { load("[engine]\nmicrobatches = 2\n", {"experts.gemm=openblas"}); }, ErrorKind::Usage,
               {"[engine].microbatches", "[experts].gemm"});
  EXPECT_EQ(load("[engine]\nmicrobatches = 2\n", {}).engine.microbatches, 2);
  EXPECT_EQ(load("", {"experts.gemm=openblas"}).engine.microbatches, 1);
  expect_error([] { load("[engine]\nmicrobatches = 0\n", {}); }, ErrorKind::Usage, {"[engine].microbatches"});
}

TEST(ConfigLoad, BadOverridesNameTheKey) {
  expect_error([] { load("", {"model.layerz=3"}); }, ErrorKind::Usage, {"[model].layerz"});
  expect_error([] { load("", {"modle.layers=3"}); }, ErrorKind::Usage, {"[modle]"});
  expect_error([] { load("", {"model.layers"}); }, ErrorKind::Usage, {"model.layers"});
  expect_error([] { load("", {"model.layers=\"three\""}); }, ErrorKind::Usage, {"[model].layers"});
  expect_error([] { load("", {"model.layers=0"}); }, ErrorKind::Usage, {"[model].layers"});
}

TEST(ConfigLoad, FileStructureErrorsNameTheFile) {
  expect_error([] { load("[modle]\nlayers = 3\n"); }, ErrorKind::Usage, {"[modle]", "t.toml"});
  expect_error([] { load("layers = 3\n"); }, ErrorKind::Usage, {"layers", "t.toml"});
  expect_error([] { load("[model\nlayers = 3\n"); }, ErrorKind::Usage, {"t.toml:1"});
}

TEST(ConfigLoad, ValueErrorsNameFileAndLine) {
  expect_error([] { load("[model]\nlayers = 4\nhidden = -3\n"); }, ErrorKind::Usage,
               {"[model].hidden", "t.toml:3"});
  expect_error([] { load("\n[router]\nmode = 5\n"); }, ErrorKind::Usage,
               {"[router].mode", "t.toml:3"});
}

TEST(ConfigLoad, FromAPath) {
  expect_error([] { load_config("/nonexistent/moed-test.toml", {}); }, ErrorKind::Usage,
               {"/nonexistent/moed-test.toml"});
  // No path: the defaults, then the overrides.
  const Config c = load_config("", {"model.layers=3"});
  EXPECT_EQ(c.model.layers, 3);
  EXPECT_EQ(c.model.experts, 8);
}

// ---------------------------------------------------------------- cross-key checks

struct CrossCase {
  const char* name;
  const char* toml;
  std::vector<std::string> named;  // both keys at fault
};

class ConfigCrossKey : public ::testing::TestWithParam<CrossCase> {};

TEST_P(ConfigCrossKey, IsAUsageErrorNamingBothKeys) {
  expect_error([] { load(GetParam().toml); }, ErrorKind::Usage, GetParam().named);
}

INSTANTIATE_TEST_SUITE_P(
    Validate, ConfigCrossKey,
    ::testing::Values(
        CrossCase{"TopKOverExperts", "[model]\nexperts = 4\ntop_k = 5\n[workload]\nhot_ratio = 1.0\n",
                  {"[model].top_k", "[model].experts"}},
        CrossCase{"MaxKOverExperts", "[model]\nexperts = 4\ntop_k = 1\n[router]\nmax_k = 5\n",
                  {"[router].max_k", "[model].experts"}},
        CrossCase{"TopPMinKOverMaxK", "[router]\nmode = \"topp\"\nmin_k = 3\nmax_k = 2\n",
                  {"[router].min_k", "[router].max_k"}},
        CrossCase{"TopPMinKOverTopK", "[router]\nmode = \"topp\"\nmin_k = 3\n",
                  {"[router].min_k", "[model].top_k"}},
        CrossCase{"TraceKindWithoutPath", "[workload]\nkind = \"trace\"\n",
                  {"[workload].kind", "[workload].trace"}},
        // 2.75 x top_k 4 = 11 > 8 experts: the hottest expert cannot carry more than every token.
        CrossCase{"HotRatioUnreachable", "[model]\nexperts = 8\ntop_k = 4\n",
                  {"[workload].hot_ratio", "[model].experts"}},
        CrossCase{"TopicSizeOverExperts", "[workload]\ntopic_size = 9\n",
                  {"[workload].topic_size", "[model].experts"}}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(ConfigCrossKeyLimits, BoundariesAreAccepted) {
  // top_k == experts, max_k == experts, min_k == max_k, hot_ratio x top_k == experts.
  EXPECT_NO_THROW(load("[model]\nexperts = 4\ntop_k = 4\n[workload]\nhot_ratio = 1.0\n"));
  EXPECT_NO_THROW(load("[model]\nexperts = 4\ntop_k = 1\n[router]\nmax_k = 4\n"));
  EXPECT_NO_THROW(load("[router]\nmode = \"topp\"\nmin_k = 2\nmax_k = 2\n"));
  EXPECT_NO_THROW(load("[model]\nexperts = 8\ntop_k = 2\n[workload]\nhot_ratio = 4.0\n"));
  EXPECT_NO_THROW(load("[workload]\ntopic_size = 8\n"));
}

// [comm].elastic: the front door's clients, over UCX, with the control
// collectives off MPI; each missing piece named.
TEST(ConfigCrossKeyLimits, ElasticServingNeedsTheFrontDoorUcxAndTransportControl) {
  const std::string ok = "[comm]\nelastic = true\nbackend = \"ucx\"\ncontrol = \"transport\"\n"
                         "[workload]\nkind = \"ingress\"\n[ingress]\ndir = \"/tmp\"\n";
  EXPECT_TRUE(load(ok).comm.elastic);
  expect_error([&] { load(ok, {"workload.kind=\"synthetic\""}); }, ErrorKind::Usage,
               {"[comm].elastic", "[workload].kind"});
  expect_error([&] { load(ok, {"comm.backend=\"auto\""}); }, ErrorKind::Usage, {"[comm].elastic", "[comm].backend"});
  expect_error([&] { load(ok, {"comm.control=\"mpi\""}); }, ErrorKind::Usage, {"[comm].elastic", "[comm].control"});
  EXPECT_EQ(load(ok, {"comm.spares=2"}).comm.spares, 2);
  expect_error([&] { load("[comm]\nspares = 1\n"); }, ErrorKind::Usage, {"[comm].spares = 1", "[comm].elastic"});
}

// [comm].join_slots: elastic serving, a listener, a key to prove, and no
// spares beside them; each missing piece named.
TEST(ConfigCrossKeyLimits, JoinSlotsNeedElasticServingAListenerAndAKey) {
  const std::string ok = "[comm]\nelastic = true\nbackend = \"ucx\"\ncontrol = \"transport\"\njoin_slots = 2\n"
                         "join_listen = \"127.0.0.1:7400\"\n[workload]\nkind = \"ingress\"\n[ingress]\ndir = \"/tmp\"\n"
                         "key_file = \"/tmp/key\"\n";
  EXPECT_EQ(load(ok).comm.join_slots, 2);
  expect_error([&] { load(ok, {"comm.elastic=false"}); }, ErrorKind::Usage, {"[comm].join_slots = 2", "[comm].elastic"});
  expect_error([&] { load(ok, {"comm.join_listen=\"\""}); }, ErrorKind::Usage, {"[comm].join_slots", "join_listen"});
  expect_error([&] { load(ok, {"comm.join_slots=0"}); }, ErrorKind::Usage, {"[comm].join_listen", "join_slots = 0"});
  expect_error([&] { load(ok, {"ingress.key_file=\"\""}); }, ErrorKind::Usage, {"[comm].join_slots", "[ingress].key_file"});
  expect_error([&] { load(ok, {"comm.spares=1"}); }, ErrorKind::Usage, {"[comm].join_slots and [comm].spares"});
  expect_error([&] { load(ok, {"comm.join_listen=\"somewhere:80\""}); }, ErrorKind::Usage, {"[comm].join_listen"});
}

// [comm].lease_ms: the fencing lease must end before the deadline at which
// the others may leave a rank out.
TEST(ConfigCrossKeyLimits, TheFencingLeaseEndsBeforeTheDeadline) {
  EXPECT_EQ(load("[comm]\nlease_ms = 4999\ntimeout_ms = 5000\n").comm.lease_ms, 4999);
  expect_error([&] { load("[comm]\nlease_ms = 5000\ntimeout_ms = 5000\n"); }, ErrorKind::Usage,
               {"[comm].lease_ms = 5000", "[comm].timeout_ms = 5000"});
}

TEST(ConfigCrossKeyLimits, ChecksApplyOnlyWhereTheyMatter) {
  // min_k is a top-p key: ignored in top-k mode.
  EXPECT_NO_THROW(load("[router]\nmode = \"topk\"\nmin_k = 3\n"));
  // The hot ratio is a synthetic-workload key: a trace replay does not need it reachable.
  EXPECT_NO_THROW(load("[model]\nexperts = 8\ntop_k = 4\n[workload]\nkind = \"trace\"\ntrace = \"x.trace\"\n"));
}

// [placement].shard_over_mean splits experts online: shards must divide the
// canonical F-chunks, and only the fixed-order GEMM keeps a shard's bits.
TEST(ConfigCrossKeyLimits, OnlineSplitsNeedWholeChunksAndTheFixedOrderGemm) {
  EXPECT_NO_THROW(load("[placement]\nshard_over_mean = 2\n[experts]\nffn_chunks = 4\n"));
  EXPECT_NO_THROW(load("[placement]\nshards = 3\n"));  // off: not checked
  expect_error([&] { load("[placement]\nshard_over_mean = 2\nshards = 3\n[experts]\nffn_chunks = 4\n"); },
               ErrorKind::Usage, {"[placement].shards = 3", "[experts].ffn_chunks = 4"});
  expect_error([&] { load("[placement]\nshard_over_mean = 2\n[experts]\nffn_chunks = 2\ngemm = \"openblas\"\n"); },
               ErrorKind::Usage, {"shard_over_mean", "fixed-order"});
}

// moed --generate-weights (issue 33): only the model's own checks apply to
// writing weights; what serving needs of the workload or the engine does not.
TEST(ConfigCrossKeyLimits, WritingWeightsChecksOnlyTheModel) {
  const auto weights = [](const std::string& toml) {
    return load_config_text(toml, "t.toml", {}, ConfigUse::write_weights);
  };
  const std::string serving_refuses[] = {
      "[model]\nexperts = 8\ntop_k = 3\n",  // the default hot_ratio 2.75 x 3 > 8 experts
      "[workload]\nkind = \"trace\"\n",   // no trace file
      "[workload]\nkind = \"ingress\"\n", // no socket dir
      "[experts]\nffn_chunks = 7\n",        // does not divide ffn
  };
  for (const std::string& toml : serving_refuses) {
    EXPECT_THROW(load(toml), Error) << toml;
    EXPECT_NO_THROW(weights(toml)) << toml;
  }
  EXPECT_EQ(weights("[model]\nexperts = 8\ntop_k = 3\n").model.top_k, 3);
  // The model's own checks still apply.
  expect_error([&] { weights("[model]\nexperts = 4\ntop_k = 5\n"); }, ErrorKind::Usage, {"[model].top_k"});
  Config c = default_config();
  c.workload.hot_ratio = 100;
  EXPECT_THROW(validate_config(c), Error);
  EXPECT_NO_THROW(validate_config(c, ConfigUse::write_weights));
}

TEST(ConfigCrossKeyLimits, ValidateConfigChecksAStructDirectly) {
  Config c = default_config();
  EXPECT_NO_THROW(validate_config(c));
  c.model.top_k = c.model.experts + 1;
  expect_error([&] { validate_config(c); }, ErrorKind::Usage, {"[model].top_k"});
}

// ---------------------------------------------------------------- one bad key per section

struct BadKeyCase {
  const char* name;
  const char* toml;
  const char* expected;  // the qualified key, and how it is wrong
};

class ConfigBadKey : public ::testing::TestWithParam<BadKeyCase> {};

TEST_P(ConfigBadKey, IsAUsageErrorNamingTheKey) {
  expect_error([] { load(GetParam().toml); }, ErrorKind::Usage, {GetParam().expected});
}

INSTANTIATE_TEST_SUITE_P(
    Sections, ConfigBadKey,
    ::testing::Values(
        BadKeyCase{"ModelUnknown", "[model]\nhiden = 64\n", "unknown key [model].hiden"},
        BadKeyCase{"ModelType", "[model]\nlayers = 2.5\n", "[model].layers must be an integer"},
        BadKeyCase{"ModelRange", "[model]\nexperts = 0\n", "[model].experts = 0 is out of range"},
        BadKeyCase{"ModelChoice", "[model]\ndtype = \"f16\"\n", "[model].dtype = \"f16\" is not allowed"},
        BadKeyCase{"RouterUnknown", "[router]\ntopp = 0.5\n", "unknown key [router].topp"},
        BadKeyCase{"RouterType", "[router]\ntemperature = \"hot\"\n", "[router].temperature must be a number"},
        BadKeyCase{"RouterRange", "[router]\ntop_p = 1.5\n", "[router].top_p = 1.5 is out of range"},
        BadKeyCase{"WorkloadUnknown", "[workload]\ntokens = 5\n", "unknown key [workload].tokens"},
        BadKeyCase{"WorkloadType", "[workload]\nsteps = true\n", "[workload].steps must be an integer"},
        BadKeyCase{"WorkloadRange", "[workload]\ncross_topic = 2.0\n", "[workload].cross_topic = 2 is out of range"},
        BadKeyCase{"ExpertsUnknown", "[experts]\nchunk = 4\n", "unknown key [experts].chunk"},
        BadKeyCase{"ExpertsType", "[experts]\nchunk_rows = \"4\"\n", "[experts].chunk_rows must be an integer"},
        BadKeyCase{"ExpertsRange", "[experts]\nblas_threads = 0\n", "[experts].blas_threads = 0 is out of range"},
        BadKeyCase{"ClusterUnknown", "[cluster]\nnodes = 2\n", "unknown key [cluster].nodes"},
        BadKeyCase{"ClusterType", "[cluster]\nranks_per_island = [2]\n", "[cluster].ranks_per_island must be an integer"},
        BadKeyCase{"ClusterRange", "[cluster]\nranks_per_island = -1\n", "[cluster].ranks_per_island = -1 is out of range"},
        BadKeyCase{"CommUnknown", "[comm]\nprotocol = true\n", "unknown key [comm].protocol"},
        BadKeyCase{"CommType", "[comm]\ntimeout_ms = 1.5\n", "[comm].timeout_ms must be an integer"},
        BadKeyCase{"CommRange", "[comm]\ntimeout_ms = 5\n", "[comm].timeout_ms = 5 is out of range"},
        BadKeyCase{"CommChoice", "[comm]\nbackend = \"pigeon\"\n", "[comm].backend = \"pigeon\" is not allowed"},
        BadKeyCase{"PlacementUnknown", "[placement]\npolicyy = \"contiguous\"\n", "unknown key [placement].policyy"},
        BadKeyCase{"PlacementType", "[placement]\nfile = 3\n", "[placement].file must be a string"},
        BadKeyCase{"PlacementRange", "[placement]\nmax_slots_per_rank = -2\n", "[placement].max_slots_per_rank = -2 is out of range"},
        BadKeyCase{"PlacementChoice", "[placement]\npolicy = \"metis\"\n", "[placement].policy = \"metis\" is not allowed"},
        BadKeyCase{"MetricsUnknown", "[metrics]\nwindow = 4\n", "unknown key [metrics].window"},
        BadKeyCase{"MetricsType", "[metrics]\nload_window_steps = \"8\"\n", "[metrics].load_window_steps must be an integer"},
        BadKeyCase{"MetricsRange", "[metrics]\nload_window_steps = 0\n", "[metrics].load_window_steps = 0 is out of range"},
        BadKeyCase{"LogUnknown", "[log]\nfile = \"x.log\"\n", "unknown key [log].file"},
        BadKeyCase{"LogType", "[log]\nper_step = 1\n", "[log].per_step must be true or false"},
        BadKeyCase{"LogChoice", "[log]\nlevel = \"loud\"\n", "[log].level = \"loud\" is not allowed"}),
    [](const auto& info) { return std::string(info.param.name); });

// ---------------------------------------------------------------- print_config

TEST(ConfigPrint, ListsEverySection) {
  const std::string text = printed(default_config());
  for (const char* s : {"model", "router", "workload", "experts", "cluster", "comm", "placement",
                        "metrics", "log"})
    EXPECT_NE(text.find(std::string("\n[") + s + "]"), std::string::npos) << "no [" << s << "] in:\n"
                                                                          << text;
}

TEST(ConfigPrint, DefaultsReloadToTheSameText) {
  const std::string first = printed(default_config());
  const std::string second = printed(load_config_text(first, "printed.toml", {}));
  EXPECT_EQ(first, second);
}

TEST(ConfigPrint, ChangedValuesReloadToThemselves) {
  const Config c = load(
      "[model]\nlayers = 3\nhidden = 48\nweights = \"dir with \\\"quotes\\\" and \\\\ slash\"\n"
      "[router]\nmode = \"topp\"\ntemperature = 0.1\ntop_p = 0.3333333333333333\nmax_k = 2\n"
      "[workload]\nhot_ratio = 1.25\ncross_topic = 0.0\n"
      "[comm]\ntimeout_ms = 1234\n[placement]\npolicy = \"shuffled\"\n"
      "[log]\nlevel = \"debug\"\nper_step = false\n");
  const std::string first = printed(c);
  const Config back = load_config_text(first, "printed.toml", {});
  EXPECT_EQ(printed(back), first);
  EXPECT_EQ(back.model.layers, 3);
  EXPECT_EQ(back.model.hidden, 48);
  EXPECT_EQ(back.model.weights, "dir with \"quotes\" and \\ slash");
  EXPECT_EQ(back.router.mode, RouterMode::topp);
  EXPECT_EQ(back.router.temperature, 0.1);                 // bit-exact round trip
  EXPECT_EQ(back.router.top_p, 0.3333333333333333);
  EXPECT_EQ(back.router.max_k, 2);
  EXPECT_EQ(back.workload.hot_ratio, 1.25);
  EXPECT_EQ(back.workload.cross_topic, 0.0);
  EXPECT_EQ(back.comm.timeout_ms, 1234);
  EXPECT_EQ(back.placement.policy, placement::PlacementPolicy::shuffled);
  EXPECT_EQ(back.log.level, "debug");
  EXPECT_FALSE(back.log.per_step);
}

TEST(ConfigPrint, EachKeyCarriesItsDocAndDefault) {
  const std::string text = printed(default_config());
  // A key line is preceded by its comment with the allowed values and the default.
  EXPECT_NE(text.find("(integer from 1 to 65536; default 8)\nexperts = 8\n"), std::string::npos)
      << text;
  EXPECT_NE(text.find("default \"topk\")\nmode = \"topk\"\n"), std::string::npos) << text;
}

// ---------------------------------------------------------------- name tables

// One name table, type-erased: its names in order and whether each entry
// reads back (name -> value -> name) and stands at its value's place.
struct TableCase {
  std::string label;
  std::vector<std::string> names, want;
  bool round_trips = true;
};

void PrintTo(const TableCase& c, std::ostream* os) { *os << c.label; }

template <class E, std::size_t N>
TableCase table_case(std::string label, const config::NameTable<E, N>& table, std::vector<std::string> want) {
  TableCase c{std::move(label), table.names(), std::move(want)};
  for (std::size_t i = 0; i < N; ++i) {
    const auto& entry = table.entries[i];
    c.round_trips = c.round_trips && std::size_t(entry.value) == i && table.find(entry.name) == entry.value &&
                    table.name(entry.value) == entry.name;
  }
  return c;
}

class NameTables : public ::testing::TestWithParam<TableCase> {};

// Every value has exactly one name, the names are unique, and they are the
// names configs, --set and command lines have always used.
TEST_P(NameTables, EachValueOneNameEachNameOneValue) {
  const TableCase& c = GetParam();
  EXPECT_TRUE(c.round_trips);
  EXPECT_EQ(c.names, c.want);
  for (std::size_t i = 0; i < c.names.size(); ++i)
    for (std::size_t j = 0; j < i; ++j) EXPECT_NE(c.names[i], c.names[j]);
}

INSTANTIATE_TEST_SUITE_P(
    Config, NameTables,
    ::testing::Values(table_case("router_mode", kRouterModeNames, {"topk", "topp"}),
                      table_case("load_policy", kLoadPolicyNames, {"none", "drop", "demote"}),
                      table_case("workload_kind", kWorkloadKindNames, {"synthetic", "trace", "ingress"}),
                      table_case("workload_order", kWorkloadOrderNames, {"sequential", "shuffled"}),
                      table_case("gemm", kGemmNames, {"fixed-order", "openblas"}),
                      table_case("isa", kIsaNames, {"auto", "avx512", "avx2", "portable"}),
                      table_case("comm_backend", comm::kBackendNames, {"auto", "nccl", "ucx", "mpi"}),
                      table_case("placement_policy", placement::kPlacementPolicyNames,
                                 {"contiguous", "round-robin", "shuffled"}),
                      table_case("optimizer_policy", placement::kOptimizerPolicyNames,
                                 {"metis", "greedy-load", "contiguous", "round-robin"})),
    [](const auto& info) { return info.param.label; });

// A name outside a table: the same Usage error through TOML and --set, naming
// the key and the allowed names.
TEST(ConfigChoices, AnUnknownNameIsRefusedNamingKeyAndAllowed) {
  expect_error([] { load("[experts]\ngemm = \"fixed_order\"\n"); }, ErrorKind::Usage,
               {"config: [experts].gemm = \"fixed_order\" is not allowed: one of \"fixed-order\", \"openblas\" "
                "(at t.toml:2)"});
  expect_error([] { load("", {"router.load_policy=dropp"}); }, ErrorKind::Usage,
               {"config: [router].load_policy = \"dropp\" is not allowed: one of \"none\", \"drop\", \"demote\""});
}

}  // namespace
}  // namespace moed::runtime
