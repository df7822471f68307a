// moectl: its command line, its rendering of answers and progress, and the
// client run end to end against an in-process AdminServer with fake handlers.
#include "runtime/admin/moectl_format.h"

#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "runtime/admin/admin_client.h"
#include "runtime/control/admin_server.h"
#include "tests/unit/test_support.h"

namespace moed::runtime::admin {
namespace {

using namespace std::chrono_literals;

MoectlEnv env(std::string run_dir = "") { return MoectlEnv{std::move(run_dir), 1234, "/home/op"}; }

CommandLine parse(std::vector<std::string> args, const MoectlEnv& e = env()) {
  args.insert(args.begin(), "moectl");
  return parse_command_line(args, e);
}

Invocation parsed(std::vector<std::string> args, const MoectlEnv& e = env()) {
  CommandLine cl = parse(args, e);
  EXPECT_TRUE(cl.invocation.has_value()) << cl.err;
  return cl.invocation.value_or(Invocation{});
}

// ---- Command line ---------------------------------------------------------------

TEST(MoectlCommandLine, SocketDefaultsAndOverrides) {
  EXPECT_EQ(parsed({"status"}).socket, "/tmp/moed-1234/moed-0.sock");
  EXPECT_EQ(parsed({"status"}, env("/srv/moed")).socket, "/srv/moed/moed-0.sock");
  EXPECT_EQ(parsed({"--rank", "3", "status"}, env("/srv/moed")).socket, "/srv/moed/moed-3.sock");
  EXPECT_EQ(parsed({"--dir", "/x", "--rank", "2", "status"}).socket, "/x/moed-2.sock");
  EXPECT_EQ(parsed({"--socket", "/a/b.sock", "status"}).socket, "/a/b.sock");
  // Global options may also come after the command.
  Invocation inv = parsed({"status", "--json", "--timeout", "2.5"});
  EXPECT_TRUE(inv.as_json);
  EXPECT_DOUBLE_EQ(inv.timeout_s, 2.5);
  EXPECT_FALSE(parsed({"status"}).as_json);
  // Rank 0's socket by default may give way to the lowest that answers in
  // the run dir (elastic serving's coordinator); a rank or socket asked for
  // never does.
  EXPECT_EQ(parsed({"status"}, env("/srv/moed")).coordinator_dir, "/srv/moed");
  EXPECT_EQ(parsed({"--dir", "/x", "shutdown"}).coordinator_dir, "/x");
  EXPECT_EQ(parsed({"--rank", "0", "status"}).coordinator_dir, "");
  EXPECT_EQ(parsed({"--socket", "/a/b.sock", "status"}).coordinator_dir, "");
}

// Elastic serving's survivors, as status shows them.
TEST(MoectlFormat, StatusShowsTheSurvivors) {
  const json answer = json::parse(R"({"ok":true,"rank":2,"epoch":0,"survivors":{"epoch":1,"members":[0,2,3],
      "rank":1,"losses":[{"lost":[1],"step":234}]}})");
  EXPECT_EQ(format_answer("status", answer),
            "rank       2\n"
            "epoch      0\n"
            "survivors  epoch 1, world ranks 0 2 3 (this one 1 of 3), 1 rank lost\n");
  // A spare admitted after the loss ([comm].spares).
  const json grown = json::parse(R"({"ok":true,"rank":4,"survivors":{"epoch":3,"members":[0,2,3,4],
      "rank":3,"ranks_lost":1,"ranks_joined":1,"losses":[{"lost":[1]},{"joined":[4]}]}})");
  EXPECT_EQ(format_answer("status", grown),
            "rank       4\n"
            "survivors  epoch 3, world ranks 0 2 3 4 (this one 3 of 4), 1 rank lost, 1 joined\n");
}

TEST(MoectlCommandLine, EveryCommandBuildsItsRequest) {
  struct Case {
    std::vector<std::string> args;
    json request;
    bool follow;
  };
  const std::vector<Case> cases{
      {{"status"}, {{"cmd", "status"}}, false},
      {{"metrics"}, {{"cmd", "metrics"}}, false},
      {{"placement"}, {{"cmd", "placement"}}, false},
      {{"stats"}, {{"cmd", "stats"}}, false},
      {{"stats", "--dump", "/tmp/s.json"}, {{"cmd", "stats"}, {"dump", "/tmp/s.json"}}, false},
      {{"stats", "--dump", "out/../s.json"}, {{"cmd", "stats"}, {"dump", "/home/op/s.json"}}, false},
      {{"reoptimize"}, {{"cmd", "reoptimize"}, {"dry_run", true}}, false},
      {{"reoptimize", "--dry-run", "--max-moves", "4"},
       {{"cmd", "reoptimize"}, {"dry_run", true}, {"max_moves", 4}}, false},
      {{"reoptimize", "--apply", "--policy", "greedy-load"},
       {{"cmd", "reoptimize"}, {"dry_run", false}, {"policy", "greedy-load"}}, true},
      {{"migrate", "1", "5", "3"}, {{"cmd", "migrate"}, {"layer", 1}, {"expert", 5}, {"to", 3}}, true},
      {{"migrate", "1", "5", "3", "--from", "0"},
       {{"cmd", "migrate"}, {"layer", 1}, {"expert", 5}, {"to", 3}, {"from", 0}}, true},
      {{"migration"}, {{"cmd", "migration"}}, false},
      {{"migration", "7"}, {{"cmd", "migration"}, {"migration_id", 7}}, false},
      {{"admit"}, {{"cmd", "admit"}}, false},
      {{"admit", "--count", "2"}, {{"cmd", "admit"}, {"count", 2}}, false},
      {{"drain"}, {{"cmd", "drain"}}, false},
      {{"shutdown"}, {{"cmd", "shutdown"}}, false},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.args.front() + (c.args.size() > 1 ? " " + c.args[1] : ""));
    Invocation inv = parsed(c.args);
    EXPECT_EQ(inv.command, c.request["cmd"]);
    EXPECT_EQ(inv.request, c.request);
    EXPECT_EQ(inv.follow, c.follow);
    // What moectl sends, the daemon's parser takes.
    json line = inv.request;
    line["id"] = 1;
    auto accepted = parse_request(line.dump());
    EXPECT_TRUE(std::holds_alternative<Request>(accepted))
        << std::get<Answer>(accepted).line;
  }
}

TEST(MoectlCommandLine, BadUsageExitsTwo) {
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{}, {"nope"}, {"status", "extra"}, {"migrate", "1", "2"},
        {"migrate", "1", "x", "3"}, {"migrate", "-1", "2", "3"}, {"migrate", "1", "2", "3", "--from", "-4"},
        {"reoptimize", "--max-moves", "-1"}, {"reoptimize", "--policy", "best"},
        {"reoptimize", "--apply", "--dry-run"}, {"migration", "x"}, {"--timeout", "0", "status"},
        {"--socket", "/a", "--dir", "/b", "status"}, {"--rank", "-1", "status"}, {"status", "--bogus"},
        {"stats", "--dump"}}) {
    std::string shown;
    for (const auto& a : args) shown += a + " ";
    CommandLine cl = parse(args);
    EXPECT_FALSE(cl.invocation) << shown;
    EXPECT_EQ(cl.exit_code, kExitUsage) << shown;
    EXPECT_FALSE(cl.err.empty()) << shown;
  }
}

TEST(MoectlCommandLine, HelpAndVersionExitZero) {
  CommandLine help = parse({"--help"});
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_FALSE(help.invocation);
  for (const auto& c : commands())
    if (c.name != "trace_follow") {  // moectl trace --follow
      EXPECT_NE(help.out.find(c.name), std::string::npos) << c.name;
    }
  CommandLine version = parse({"--version"});
  EXPECT_EQ(version.exit_code, 0);
  EXPECT_NE(version.out.find("moectl"), std::string::npos);
}

// Every parameter of the protocol's table can be given on moectl's command line.
TEST(MoectlCommandLine, EveryProtocolParameterIsReachable) {
  for (const auto& c : commands()) {
    if (c.name == "trace_follow") continue;  // moectl trace --follow: test_moectl_trace.cc
    CommandLine help = parse({c.name, "--help"});
    ASSERT_EQ(help.exit_code, 0) << c.name;
    for (const auto& p : c.params) {
      std::string option = "--" + p.name;
      std::replace(option.begin(), option.end(), '_', '-');
      std::string upper = p.name;
      for (auto& ch : upper) ch = static_cast<char>(std::toupper(ch));
      const bool shown = help.out.find(option) != std::string::npos ||
                         help.out.find(upper) != std::string::npos ||
                         (p.name == "migration_id" && help.out.find("ID") != std::string::npos);
      EXPECT_TRUE(shown) << c.name << " lacks " << p.name << " in:\n" << help.out;
    }
  }
}

// ---- Rendering ------------------------------------------------------------------------

TEST(MoectlFormat, Errors) {
  EXPECT_EQ(format_error(json::parse(answer_error(1, "busy", "migration 3 runs"))),
            "moectl: busy: migration 3 runs");
  EXPECT_EQ(format_error(json{{"ok", false}}), "moectl: error: ");
}

TEST(MoectlFormat, StatusAsAlignedKeyValueLines) {
  const json answer = json::parse(R"({"id":1,"ok":true,"rank":0,"epoch":4,"step":1200,
      "tokens_per_s":4072.137,"alerts":["load spread 0.9 > 0.8"],"state":"serving",
      "migration":{"id":3,"state":"transfer","layer":1,"expert":5,"from":0,"to":2,
                   "bytes":34600000,"done_bytes":15570000},"zeta":1})");
  EXPECT_EQ(format_answer("status", answer),
            "rank          0\n"
            "state         serving\n"
            "epoch         4\n"
            "step          1200\n"
            "tokens_per_s  4072.1\n"
            "alerts        load spread 0.9 > 0.8\n"
            "migration     3: transfer 45% (15.6 of 34.6 MB)\n"
            "zeta          1\n");
  const json quiet = json::parse(R"({"ok":true,"rank":1,"alerts":[],"migration":null})");
  EXPECT_EQ(format_answer("status", quiet), "rank       1\nalerts     none\nmigration  none\n");
}

TEST(MoectlFormat, StatusShowsTheRecentRateBesideTheOneSinceStart) {
  const json answer = json::parse(R"({"ok":true,"rank":0,"recent_tokens_per_s":2040.44,"tokens_per_s":3400.04,
      "alerts":[],"migration":null})");
  EXPECT_EQ(format_answer("status", answer),
            "rank                 0\n"
            "tokens_per_s         3400.0\n"
            "recent_tokens_per_s  2040.4\n"
            "alerts               none\n"
            "migration            none\n");
}

TEST(MoectlFormat, MetricsAreRawText) {
  EXPECT_EQ(format_answer("metrics", json{{"ok", true}, {"text", "a 1\nb 2"}}), "a 1\nb 2\n");
}

TEST(MoectlFormat, StatsAsATable) {
  const json answer = json::parse(R"({"ok":true,"steps":3396,"half_life_steps":64,"sample_tokens":1024,
      "per_layer":[{"layer":0,"tokens":9183.3,"hottest_expert":1,"hottest_over_mean":2.7629,"top_pair":[1,7]},
                   {"layer":1,"tokens":9183.3,"hottest_expert":12,"hottest_over_mean":2.5,"top_pair":[1,2]}]})");
  EXPECT_EQ(format_answer("stats", answer),
            "statistics of 3396 steps (half-life 64 steps), 1024 sampled token paths\n"
            "layer      tokens  hottest expert      x mean  most co-routed pair\n"
            "0            9183  1                     2.76  1 + 7\n"
            "1            9183  12                    2.50  1 + 2\n");
  // With bias balancing on, each layer's range of biases.
  json biased = answer;
  biased["per_layer"][0]["router_bias"] = {-0.0125, 0.5, 0.002};
  biased["per_layer"][1]["router_bias"] = {0.0, 0.0, 0.0};
  EXPECT_EQ(format_answer("stats", biased),
            "statistics of 3396 steps (half-life 64 steps), 1024 sampled token paths\n"
            "layer      tokens  hottest expert      x mean  most co-routed pair  router bias min..max\n"
            "0            9183  1                     2.76  1 + 7                -0.0125..+0.5000\n"
            "1            9183  12                    2.50  1 + 2                +0.0000..+0.0000\n");
  // An unexpected shape falls back to fields rather than failing.
  EXPECT_EQ(format_answer("stats", json{{"ok", true}, {"per_layer", json::array({1})}}), "per_layer  [1]\n");
}

TEST(MoectlFormat, PlacementAsATable) {
  const json answer = json::parse(R"({"ok":true,"epoch":2,"ranks":4,"layers":2,"experts":8,
      "slots":[[[0],[0],[1],[1],[2],[2],[3],[3]],
               [[0],[0],[1],[1],[2],[2],[3],[3,0]]]})");
  EXPECT_EQ(format_answer("placement", answer),
            "placement epoch 2: 4 ranks, 2 layers, 8 experts\n"
            "layer  rank 0  rank 1  rank 2  rank 3\n"
            "0      0-1     2-3     4-5     6-7\n"
            "1      0-1,7   2-3     4-5     6-7\n");
  // A split expert's shards are named under the table; a bad entry is skipped.
  const json split = json::parse(R"({"ok":true,"epoch":3,"ranks":2,"layers":1,"experts":2,
      "slots":[[[0,1],[1]]], "split":[[0, 7, "x"]], "shards":[{"0":[[0,1]]}]})");
  EXPECT_EQ(format_answer("placement", split),
            "placement epoch 3: 2 ranks, 1 layers, 2 experts\n"
            "layer  rank 0  rank 1\n"
            "0      0       0-1\n"
            "layer 0 expert 0: split into 2 shards, on ranks 0, 1\n");
  // A model with dense layers names its rows by model layer; DeepSeek's groups are said.
  const json deepseek = json::parse(R"({"ok":true,"epoch":0,"ranks":2,"layers":2,"experts":4,
      "slots":[[[0],[0],[1],[1]],[[0],[0],[1],[1,0]]], "split":[[], [3]], "shards":[{}, {"3":[[1,0]]}],
      "model_layers":[3, 4],
      "expert_groups":{"groups":2,"kept":1,"size":2},
      "slot":{"dtype":"fp8","bytes":44302336,"shard_bytes":{"2":22151168}}})");
  EXPECT_EQ(format_answer("placement", deepseek),
            "placement epoch 0: 2 ranks, 2 layers, 4 experts\n"
            "slots hold experts in fp8: 44.302 MB each, a shard of 2: 22.151 MB\n"
            "experts in 2 groups of 2 (ids in order); a token's experts come from 1 of them\n"
            "layer  rank 0  rank 1\n"
            "3      0-1     2-3\n"
            "4      0-1,3   2-3\n"
            "layer 4 expert 3: split into 2 shards, on ranks 1, 0\n");
  // A split expert held twice: its copies, each in shard order.
  const json copies = json::parse(R"({"ok":true,"epoch":1,"ranks":4,"layers":1,"experts":2,
      "slots":[[[0,1,2,3],[1]]], "split":[[0]], "shards":[{"0":[[1,0],[3,2]]}]})");
  EXPECT_EQ(format_answer("placement", copies),
            "placement epoch 1: 4 ranks, 1 layers, 2 experts\n"
            "layer  rank 0  rank 1  rank 2  rank 3\n"
            "0      0       0-1     0       0\n"
            "layer 0 expert 0: split into 2 shards, 2 copies, on ranks 1, 0; 3, 2\n");
  // An unexpected shape falls back to fields rather than failing.
  EXPECT_EQ(format_answer("placement", json{{"ok", true}, {"epoch", 1}, {"slots", "?"}}),
            "epoch  1\nslots  ?\n");
}

TEST(MoectlFormat, Reoptimize) {
  const json answer = json::parse(R"({"ok":true,"dry_run":true,
      "predicted":{"cross_island_copies_per_token":{"now":1.5,"after":0.75},
                   "max_mean_rank_load":{"now":1.25,"after":1.25}},
      "moves":[{"layer":0,"expert":5,"from":1,"to":3},{"layer":2,"expert":0,"from":0,"to":2}],
      "migration":null})");
  EXPECT_EQ(format_answer("reoptimize", answer),
            "reoptimize (dry run): 2 moves\n"
            "  cross_island_copies_per_token  1.5 -> 0.75  (-50.0%)\n"
            "  max_mean_rank_load             1.25 -> 1.25  (+0.0%)\n"
            "  move layer 0 expert 5, rank 1 -> rank 3\n"
            "  move layer 2 expert 0, rank 0 -> rank 2\n");
  json applied = answer;
  applied["dry_run"] = false;
  applied["migration"] = 12;
  EXPECT_NE(format_answer("reoptimize", applied).find("migration 12 started\n"), std::string::npos);
  json many = applied;
  many["moves"] = json::array();
  for (int i = 0; i < 25; ++i) many["moves"].push_back({{"layer", 0}, {"expert", i}, {"from", 0}, {"to", 1}});
  EXPECT_NE(format_answer("reoptimize", many).find("... and 5 more moves"), std::string::npos);
  // A split's cut moves and release, a shard's move, and a release.
  json split = answer;
  split["moves"] = json::parse(R"([{"layer":1,"expert":2,"from":1,"to":3,"drop":-1,"shard":0,"shards":2,"cut":true},
      {"layer":1,"expert":2,"from":-1,"to":-1,"drop":2,"shard":0,"shards":2,"cut":true},
      {"layer":1,"expert":4,"from":0,"to":1,"drop":0,"shard":1,"shards":2,"cut":false},
      {"layer":1,"expert":5,"from":-1,"to":-1,"drop":3}])");
  const std::string text = format_answer("reoptimize", split);
  EXPECT_NE(text.find("move layer 1 expert 2, split: shard 0 of 2 to rank 3, cut from rank 1\n"), std::string::npos)
      << text;
  EXPECT_NE(text.find("move layer 1 expert 2, split into 2 shards: releases rank 2\n"), std::string::npos) << text;
  EXPECT_NE(text.find("move layer 1 expert 4, shard 1 of 2, rank 0 -> rank 1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("move layer 1 expert 5, releases rank 3\n"), std::string::npos) << text;
}

TEST(MoectlFormat, ProgressLines) {
  json m = json::parse(R"({"id":3,"state":"transfer","layer":1,"expert":5,"from":0,"to":2,
                          "bytes":34600000,"done_bytes":15570000})");
  EXPECT_EQ(progress_line(m), "migration 3: transfer 45% (15.6 of 34.6 MB)");
  EXPECT_EQ(progress_bar(m, 20), "migration 3 [#########...........]  45% transfer 15.6 of 34.6 MB");
  m["state"] = "prepare";
  m["done_bytes"] = 0;
  EXPECT_EQ(progress_line(m), "migration 3: prepare");
  EXPECT_EQ(progress_bar(m, 10), "migration 3 [..........]   0% prepare 0.0 of 34.6 MB");
  m["state"] = "committed";
  EXPECT_EQ(progress_line(m), "migration 3: committed (layer 1 expert 5, rank 0 -> rank 2; 34.6 MB moved)");
  EXPECT_EQ(progress_bar(m, 10), "migration 3 [##########] 100% committed 0.0 of 34.6 MB");
  // A migration of several moves (a reoptimize) names no single expert.
  EXPECT_EQ(progress_line(json{{"id", 4}, {"state", "committed"}, {"moves", 3}, {"bytes", 2000}}),
            "migration 4: committed (3 moves; 2.0 kB moved)");
  EXPECT_EQ(progress_line(json{{"id", 4}, {"state", "committed"}}), "migration 4: committed");
  m["state"] = "aborted";
  m["error"] = "checksum mismatch on rank 2";
  EXPECT_EQ(progress_line(m), "migration 3: aborted: checksum mismatch on rank 2");
  EXPECT_TRUE(migration_finished(m));
  EXPECT_TRUE(migration_aborted(m));
  m["state"] = "verify";
  EXPECT_FALSE(migration_finished(m));
  EXPECT_EQ(format_answer("migration", json{{"ok", true}, {"migration", nullptr}}), "no migration\n");
}

TEST(MoectlFormat, MigrationIds) {
  EXPECT_EQ(migration_id_of(json{{"migration", 4}}), 4);
  EXPECT_EQ(migration_id_of(json{{"migration", {{"id", 5}, {"state", "prepare"}}}}), 5);
  EXPECT_EQ(migration_id_of(json{{"migration", nullptr}}), std::nullopt);
  EXPECT_EQ(migration_id_of(json{{"epoch", 1}}), std::nullopt);
  EXPECT_EQ(format_answer("migrate", json{{"ok", true}, {"migration", 4}}), "migration 4 started\n");
}

TEST(MoectlFormat, BytesAndRanges) {
  EXPECT_EQ(format_byte_pair(15'570'000, 34'600'000), "15.6 of 34.6 MB");
  EXPECT_EQ(format_byte_pair(0, 2'500'000'000), "0.0 of 2.5 GB");
  EXPECT_EQ(format_byte_pair(1'000, 4'096), "1.0 of 4.1 kB");
  EXPECT_EQ(format_byte_pair(3, 512), "3 of 512 B");
  EXPECT_EQ(format_ranges({7, 0, 1, 2, 3, 9, 10}), "0-3,7,9-10");
  EXPECT_EQ(format_ranges({}), "");
  EXPECT_EQ(format_ranges({4}), "4");
}

TEST(MoectlFormat, UnknownAnswersFallBackToFields) {
  EXPECT_EQ(format_answer("drain", json{{"ok", true}, {"id", 1}, {"state", "draining"}}),
            "state  draining\n");
  EXPECT_EQ(format_answer("shutdown", json{{"ok", true}}), "");
  EXPECT_EQ(format_answer("stats", json{{"ok", true}, {"dump", "/tmp/s.json"}}),
            "statistics written to /tmp/s.json\n");
  EXPECT_EQ(format_fields(json{{"b", 1}, {"a", {{"x", 1}}}}, {"b"}), "b  1\na  {\"x\":1}\n");
}

// ---- The client against a real server --------------------------------------------------

// A daemon faked enough for moectl: status, and a migration that advances
// one state per poll.
class MoectlRunTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Handlers h;
    h.snapshot_answer = [this](const Request& r) -> json {
      if (r.cmd == "status") return {{"rank", 0}, {"epoch", 2}, {"state", "serving"}};
      if (r.cmd == "migration") {
        std::lock_guard lock(mutex_);
        if (r.params.value("migration_id", -1) != 9) return error_body("bad_params", "no migration 9");
        const std::size_t i = std::min(polls_++, states_.size() - 1);
        return {{"migration",
                 {{"id", 9}, {"state", states_[i]}, {"layer", 1}, {"expert", 2}, {"from", 0}, {"to", 1},
                  {"bytes", 4000000}, {"done_bytes", 1000000 * std::min<std::size_t>(i, 4)},
                  {"error", states_[i] == "aborted" ? "checksum mismatch" : ""}}}};
      }
      return error_body("refused", "not in this test");
    };
    h.submit = [this](Request r, Reply reply) {
      if (r.cmd == "drain") {
        if (!answer_drain_) return;  // never decided: the client times out
        reply(answer_error(r.id, "busy", "migration 9 runs"));
        return;
      }
      reply(answer_ok(r.id, {{"migration", 9}}));
    };
    server_ = std::make_unique<AdminServer>(tmp_.file("run"), 0, 0, h);
  }

  int run(std::vector<std::string> args, bool tty = false) {
    args.insert(args.begin(), {"--socket", server_->path()});
    Invocation inv = parsed(args);
    out_.str("");
    err_.str("");
    RunOptions options;
    options.tty = tty;
    options.poll_interval = 1ms;
    options.bar_width = 10;
    return run_moectl(inv, out_, err_, options);
  }

  test::TempDir tmp_{"moed_moectl"};
  std::mutex mutex_;
  std::vector<std::string> states_{"prepare", "transfer", "transfer", "verify", "commit", "committed"};
  std::size_t polls_ = 0;
  bool answer_drain_ = true;
  std::unique_ptr<AdminServer> server_;
  std::ostringstream out_, err_;
};

TEST_F(MoectlRunTest, StatusHumanAndJson) {
  EXPECT_EQ(run({"status"}), kExitOk);
  EXPECT_EQ(out_.str(), "rank   0\nstate  serving\nepoch  2\n");
  EXPECT_EQ(run({"--json", "status"}), kExitOk);
  EXPECT_EQ(out_.str(), R"({"id":1,"ok":true,"epoch":2,"rank":0,"state":"serving"})" "\n");
}

TEST_F(MoectlRunTest, ErrorAnswerExitsOne) {
  EXPECT_EQ(run({"drain"}), kExitError);
  EXPECT_EQ(err_.str(), "moectl: busy: migration 9 runs\n");
  EXPECT_EQ(out_.str(), "");
  EXPECT_EQ(run({"--json", "drain"}), kExitError);
  EXPECT_NE(out_.str().find(R"("code":"busy")"), std::string::npos);
}

TEST_F(MoectlRunTest, MigrateFollowsProgressToTheCommit) {
  EXPECT_EQ(run({"migrate", "1", "2", "1"}), kExitOk) << err_.str();
  EXPECT_EQ(out_.str(),
            "migration 9 started\n"
            "migration 9: prepare\n"
            "migration 9: transfer 25% (1.0 of 4.0 MB)\n"
            "migration 9: transfer 50% (2.0 of 4.0 MB)\n"
            "migration 9: verify\n"
            "migration 9: commit\n"
            "migration 9: committed (layer 1 expert 2, rank 0 -> rank 1; 4.0 MB moved)\n");
}

TEST_F(MoectlRunTest, ProgressBarOnATerminal) {
  EXPECT_EQ(run({"reoptimize", "--apply"}, true), kExitOk) << err_.str();
  const std::string out = out_.str();
  EXPECT_NE(out.find("\rmigration 9 [##........]  25% transfer 1.0 of 4.0 MB\x1b[K"), std::string::npos) << out;
  EXPECT_NE(out.find("\rmigration 9 [##########] 100% committed 4.0 of 4.0 MB\x1b[K\n"), std::string::npos) << out;
}

TEST_F(MoectlRunTest, AbortedMigrationExitsOne) {
  states_ = {"prepare", "transfer", "aborted"};
  EXPECT_EQ(run({"migrate", "1", "2", "1"}), kExitError);
  EXPECT_NE(out_.str().find("migration 9: aborted: checksum mismatch\n"), std::string::npos);
  EXPECT_EQ(err_.str(),
            "moectl: aborted: migration 9 aborted before its commit: checksum mismatch; the old "
            "placement is still served\n");
}

// The daemon stops (its admin server goes) while moectl follows a migration
// that has not reached its commit: moectl says the migration ends aborted.
TEST_F(MoectlRunTest, DaemonStoppingBeforeTheCommitIsAnAbort) {
  for (const bool past_commit : {false, true}) {
    polls_ = 0;
    states_ = past_commit ? std::vector<std::string>{"verify", "commit"} : std::vector<std::string>{"transfer"};
    server_.reset();
    SetUp();  // a fresh server
    int rc = -1;
    std::thread follower([&] { rc = run({"migrate", "1", "2", "1"}); });
    for (;;) {  // let it poll a few times, then stop the "daemon"
      {
        std::lock_guard lock(mutex_);
        if (polls_ >= 3) break;
      }
      std::this_thread::sleep_for(1ms);
    }
    server_.reset();
    follower.join();
    if (past_commit) {
      EXPECT_EQ(rc, kExitOk) << err_.str();
      EXPECT_NE(err_.str().find("migration 9 committed (state commit) before the daemon stopped"), std::string::npos)
          << err_.str();
    } else {
      EXPECT_EQ(rc, kExitError) << err_.str();
      EXPECT_NE(err_.str().find("moectl: aborted: migration 9 was in transfer when the daemon stopped"),
                std::string::npos)
          << err_.str();
    }
    EXPECT_EQ(err_.str().find("cannot connect"), std::string::npos) << err_.str();
  }
}

TEST_F(MoectlRunTest, JsonFollowPrintsEachChangedAnswer) {
  EXPECT_EQ(run({"--json", "migrate", "1", "2", "1"}), kExitOk);
  std::istringstream lines(out_.str());
  std::vector<json> answers;
  for (std::string line; std::getline(lines, line);) answers.push_back(json::parse(line));
  ASSERT_EQ(answers.size(), 7u);  // the migrate answer, then six distinct states
  EXPECT_EQ(answers.front()["migration"], 9);
  EXPECT_EQ(answers.back()["migration"]["state"], "committed");
}

TEST_F(MoectlRunTest, CannotConnectExitsThree) {
  Invocation inv = parsed({"--socket", tmp_.file("missing.sock"), "status"});
  std::ostringstream out, err;
  EXPECT_EQ(run_moectl(inv, out, err), kExitConnect);
  EXPECT_NE(err.str().find("moectl: cannot connect: cannot connect to " + tmp_.file("missing.sock")),
            std::string::npos)
      << err.str();
  EXPECT_NE(err.str().find("is moed running"), std::string::npos);
}

TEST_F(MoectlRunTest, NoAnswerInTimeExitsThree) {
  answer_drain_ = false;
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(run({"--timeout", "0.2", "drain"}), kExitConnect);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s);  // the default timeout is 30 s
  EXPECT_NE(err_.str().find("no answer from"), std::string::npos) << err_.str();
}

TEST_F(MoectlRunTest, ClientRoundTripsAndTimeouts) {
  AdminClient client = AdminClient::connect(server_->path(), 1s);
  std::string raw;
  json a = client.call(json{{"id", "x"}, {"cmd", "status"}}, 1s, &raw);
  EXPECT_EQ(a["id"], "x");
  EXPECT_EQ(raw, R"({"id":"x","ok":true,"epoch":2,"rank":0,"state":"serving"})");
  client.send_line("garbage", 1s);
  EXPECT_EQ(json::parse(client.read_line(1s))["error"]["code"], "bad_json");
  EXPECT_THROW(client.read_line(50ms), ConnectError);
  EXPECT_THROW(AdminClient::connect(tmp_.file("nope.sock"), 100ms), ConnectError);
}

TEST_F(MoectlRunTest, RefusedConnectionExitsThree) {
  Limits limits;
  limits.max_clients = 0;
  AdminServer full(tmp_.file("full"), 0, 0, Handlers{}, limits);
  Invocation inv = parsed({"--socket", full.path(), "status"});
  std::ostringstream out, err;
  EXPECT_EQ(run_moectl(inv, out, err), kExitConnect);
  EXPECT_NE(err.str().find("moectl: too_many_clients:"), std::string::npos) << err.str();
}

}  // namespace
}  // namespace moed::runtime::admin
