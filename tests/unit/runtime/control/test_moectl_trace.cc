// moectl trace: its command line (trace REQUEST_ID, --follow, --json), the
// text it prints, and a run against an in-process AdminServer answering from
// a real Tracer (runtime/trace/tracer.h).
#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "runtime/admin/admin_client.h"
#include "runtime/control/admin_server.h"
#include "runtime/admin/moectl_format.h"
#include "runtime/trace/tracer.h"
#include "tests/unit/runtime/trace_fixture.h"
#include "tests/unit/test_support.h"

namespace moed::runtime::admin {
namespace {

using namespace std::chrono_literals;

CommandLine parse(std::vector<std::string> args) {
  args.insert(args.begin(), "moectl");
  return parse_command_line(args, MoectlEnv{"", 1234, "/home/op"});
}

// One token of request `id` through `layers` layers (trace_fixture.h).
trace::TraceFragments traced_token(std::uint64_t id, int layers) {
  trace::TraceFragments f;
  for (int l = 0; l < layers; ++l) f.append(trace::token_layer(id, l));
  return f;
}

TEST(MoectlTraceCommandLine, RequestIdIsPositional) {
  CommandLine cl = parse({"trace", "42"});
  ASSERT_TRUE(cl.invocation) << cl.err;
  EXPECT_EQ(cl.invocation->request, (json{{"cmd", "trace"}, {"request_id", 42}}));
  EXPECT_FALSE(cl.invocation->follow);
}

TEST(MoectlTraceCommandLine, FollowAsksTheCoordinatorToTraceTheId) {
  CommandLine cl = parse({"trace", "--follow", "42"});
  ASSERT_TRUE(cl.invocation) << cl.err;
  EXPECT_EQ(cl.invocation->command, "trace_follow");
  EXPECT_EQ(cl.invocation->request, (json{{"cmd", "trace_follow"}, {"request_id", 42}}));
  EXPECT_TRUE(cl.invocation->follow);
}

TEST(MoectlTraceCommandLine, ARequestIdIsRequiredAndANumber) {
  for (const auto& args : std::vector<std::vector<std::string>>{{"trace"}, {"trace", "abc"}, {"trace", "-3"},
                                                                 {"trace_follow", "3"}}) {
    const CommandLine cl = parse(args);
    EXPECT_FALSE(cl.invocation) << args.back();
    EXPECT_EQ(cl.exit_code, kExitUsage) << args.back();
  }
}

TEST(MoectlTraceFormat, ShowsEveryLayersExpertsPlacesAndPhases) {
  trace::Tracer tracer(4, 2, 0.001);
  tracer.absorb(traced_token(42, 2));
  const std::string text = format_answer("trace", tracer.answer(42));
  for (const char* part : {"request 42 position 0: 2 of 2 layers traced", "layer 0  step 7  epoch 2  home rank 1 (island 0)",
                           "layer 1", "4 (w 0.750) on rank 2 [queue 20 us, expert 140 us]", "0 (w 0.250) on rank 1",
                           "ranks 1, 2; islands 0, 1; 1.1 kB moved (1.1 kB across islands)",
                           "route 20 us, plan 8 us, dispatch 5 us, wait 272 us, combine 20 us = 325 us",
                           "slowest  expert 4 on rank 2: rows travel 32 us, queue 20 us, expert 140 us, answer wait 10 us, "
                           "answer travel 70 us"})
    EXPECT_NE(text.find(part), std::string::npos) << "'" << part << "' not in:\n" << text;
}

// The daemon's side: `trace` from the Tracer, `trace_follow` decided at a
// "boundary" that, here, also serves the followed request.
class MoectlTraceRun : public ::testing::Test {
 protected:
  void SetUp() override {
    Handlers h;
    h.snapshot_answer = [this](const Request& r) {
      return tracer_.answer(r.params.at("request_id").get<std::uint64_t>());
    };
    h.submit = [this](Request r, Reply reply) {
      reply(answer_ok(r.id, {{"following", r.params.at("request_id")}}));
      if (already_served_) tracer_.note_too_late(r.params.at("request_id").get<std::uint64_t>(), 4, 10);
      else if (serve_followed_) tracer_.absorb(traced_token(r.params.at("request_id").get<std::uint64_t>(), 2));
    };
    server_ = std::make_unique<AdminServer>(tmp_.file("run"), 0, 0, h);
  }

  int run(std::vector<std::string> args) {
    args.insert(args.begin(), {"--socket", server_->path(), "--timeout", "1"});
    CommandLine cl = parse(args);
    EXPECT_TRUE(cl.invocation) << cl.err;
    out_.str("");
    err_.str("");
    RunOptions options;
    options.poll_interval = 1ms;
    return run_moectl(*cl.invocation, out_, err_, options);
  }

  test::TempDir tmp_{"moed_moectl_trace"};
  trace::Tracer tracer_{8, 2, 0.001};
  std::atomic<bool> serve_followed_{true}, already_served_{false};
  std::unique_ptr<AdminServer> server_;
  std::ostringstream out_, err_;
};

TEST_F(MoectlTraceRun, UnknownIdIsAnErrorNamingTheWayToFollowIt) {
  EXPECT_EQ(run({"trace", "7"}), kExitError);
  EXPECT_EQ(out_.str(), "");
  EXPECT_NE(err_.str().find("moectl: not_found: no trace of request 7"), std::string::npos) << err_.str();
  EXPECT_NE(err_.str().find("moectl trace --follow 7"), std::string::npos) << err_.str();
}

TEST_F(MoectlTraceRun, TextAndJson) {
  tracer_.absorb(traced_token(9, 2));
  EXPECT_EQ(run({"trace", "9"}), kExitOk);
  EXPECT_NE(out_.str().find("request 9 position 0: 2 of 2 layers traced"), std::string::npos) << out_.str();
  EXPECT_EQ(run({"--json", "trace", "9"}), kExitOk);
  const json answer = json::parse(out_.str());
  EXPECT_EQ(answer["ok"], true);
  ASSERT_EQ(answer["tokens"].size(), 1u);
  EXPECT_EQ(answer["tokens"][0]["layers"][1]["layer"], 1);
  EXPECT_TRUE(answer["tokens"][0]["complete"].get<bool>());
}

TEST_F(MoectlTraceRun, FollowWaitsForTheTraceThenShowsIt) {
  EXPECT_EQ(run({"trace", "--follow", "11"}), kExitOk) << err_.str();
  EXPECT_NE(out_.str().find("request 11 position 0: 2 of 2 layers traced"), std::string::npos) << out_.str();
}

TEST_F(MoectlTraceRun, FollowOfARequestNeverServedTimesOut) {
  serve_followed_ = false;
  EXPECT_EQ(run({"trace", "--follow", "12"}), kExitError);
  EXPECT_NE(err_.str().find("request 12 was not served within 1 s; it stays followed"), std::string::npos)
      << err_.str();
}

TEST_F(MoectlTraceRun, FollowOfARequestAlreadyServedAnswersAtOnce) {
  already_served_ = true;
  EXPECT_EQ(run({"trace", "--follow", "13"}), kExitError);
  EXPECT_NE(err_.str().find("moectl: already_served: request 13 was served by step 4"), std::string::npos)
      << err_.str();
  EXPECT_EQ(err_.str().find("was not served within"), std::string::npos) << "said at once, not a timeout: "
                                                                         << err_.str();
}

}  // namespace
}  // namespace moed::runtime::admin
