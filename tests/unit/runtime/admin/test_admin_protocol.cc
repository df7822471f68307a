// The admin protocol's parser and answer formatting, table-driven: every
// command with valid and invalid parameters, ids, and the error answers' shape.
#include "runtime/admin/protocol.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace moed::runtime::admin {
namespace {

// The answer `line` parses to, checked for the shape every answer has.
json parsed_answer(const std::string& line) {
  EXPECT_EQ(line.find('\n'), std::string::npos) << line;
  json answer = json::parse(line);
  EXPECT_TRUE(answer.is_object()) << line;
  EXPECT_TRUE(answer.contains("id")) << line;
  EXPECT_TRUE(answer.contains("ok") && answer["ok"].is_boolean()) << line;
  if (answer["ok"] == false) {
    EXPECT_TRUE(answer["error"].is_object()) << line;
    EXPECT_TRUE(answer["error"]["code"].is_string()) << line;
    EXPECT_TRUE(answer["error"]["message"].is_string()) << line;
  }
  return answer;
}

struct Valid {
  std::string line;
  std::string cmd;
  json params;  // after defaults
};

TEST(AdminProtocol, ValidRequestsOfEveryCommand) {
  const std::vector<Valid> cases{
      {R"({"cmd":"status"})", "status", json::object()},
      {R"({"cmd":"metrics","id":1})", "metrics", json::object()},
      {R"({"cmd":"placement"})", "placement", json::object()},
      {R"({"cmd":"stats"})", "stats", json::object()},
      {R"({"cmd":"stats","dump":"/tmp/s.json"})", "stats", {{"dump", "/tmp/s.json"}}},
      // No policy: the daemon's [placement].reoptimize_policy.
      {R"({"cmd":"reoptimize"})", "reoptimize", {{"dry_run", false}}},
      {R"({"cmd":"reoptimize","dry_run":true,"max_moves":0,"policy":"greedy-load"})", "reoptimize",
       {{"dry_run", true}, {"max_moves", 0}, {"policy", "greedy-load"}}},
      {R"({"cmd":"reoptimize","policy":"contiguous","max_moves":12})", "reoptimize",
       {{"dry_run", false}, {"max_moves", 12}, {"policy", "contiguous"}}},
      {R"({"cmd":"reoptimize","policy":"round-robin"})", "reoptimize",
       {{"dry_run", false}, {"policy", "round-robin"}}},
      {R"({"cmd":"migrate","layer":0,"expert":5,"to":3})", "migrate",
       {{"layer", 0}, {"expert", 5}, {"to", 3}}},
      {R"({"cmd":"migrate","layer":57,"expert":255,"to":63,"from":0})", "migrate",
       {{"layer", 57}, {"expert", 255}, {"to", 63}, {"from", 0}}},
      {R"({"cmd":"migration"})", "migration", json::object()},
      {R"({"cmd":"migration","migration_id":7})", "migration", {{"migration_id", 7}}},
      {R"({"cmd":"drain"})", "drain", json::object()},
      {R"({"cmd":"shutdown"})", "shutdown", json::object()},
      // Whitespace, key order and a trailing CR (a client writing CRLF).
      {"  { \"layer\" : 1 , \"to\":2,\"cmd\":\"migrate\",\"expert\":3 }  \r", "migrate",
       {{"layer", 1}, {"expert", 3}, {"to", 2}}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.line);
    auto parsed = parse_request(c.line);
    ASSERT_TRUE(std::holds_alternative<Request>(parsed)) << std::get<Answer>(parsed).line;
    const Request& r = std::get<Request>(parsed);
    EXPECT_EQ(r.cmd, c.cmd);
    EXPECT_EQ(r.params, c.params);
  }
}

TEST(AdminProtocol, IdsAreEchoedStringOrInteger) {
  struct Case {
    std::string line;
    json id;
  };
  const std::vector<Case> cases{
      {R"({"cmd":"status"})", nullptr},
      {R"({"cmd":"status","id":null})", nullptr},
      {R"({"cmd":"status","id":0})", 0},
      {R"({"cmd":"status","id":-4})", -4},
      {R"({"cmd":"status","id":18446744073709551615})", json(18446744073709551615ull)},
      {R"({"cmd":"status","id":"abc-1"})", "abc-1"},
      {R"({"cmd":"status","id":""})", ""},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.line);
    auto parsed = parse_request(c.line);
    ASSERT_TRUE(std::holds_alternative<Request>(parsed));
    EXPECT_EQ(std::get<Request>(parsed).id, c.id);
    const json answer = parsed_answer(answer_ok(std::get<Request>(parsed).id, {{"x", 1}}));
    EXPECT_EQ(answer["id"], c.id);
    EXPECT_EQ(answer["ok"], true);
    EXPECT_EQ(answer["x"], 1);
  }
  // Ids the protocol does not take are refused; the answer's id is then null.
  for (const std::string bad : {R"({"cmd":"status","id":1.5})", R"({"cmd":"status","id":true})",
                                R"({"cmd":"status","id":[1]})", R"({"cmd":"status","id":{"a":1}})"}) {
    SCOPED_TRACE(bad);
    auto parsed = parse_request(bad);
    ASSERT_TRUE(std::holds_alternative<Answer>(parsed));
    const json answer = parsed_answer(std::get<Answer>(parsed).line);
    EXPECT_EQ(answer["id"], nullptr);
    EXPECT_EQ(answer["error"]["code"], "bad_params");
    EXPECT_NE(answer["error"]["message"].get<std::string>().find("'id'"), std::string::npos);
  }
}

struct Invalid {
  std::string line;
  std::string code;
  std::vector<std::string> in_message;  // substrings
};

void expect_refused(const std::vector<Invalid>& cases) {
  for (const auto& c : cases) {
    SCOPED_TRACE(c.line);
    auto parsed = parse_request(c.line, 256);
    ASSERT_TRUE(std::holds_alternative<Answer>(parsed)) << "accepted";
    const Answer& a = std::get<Answer>(parsed);
    EXPECT_EQ(a.code, c.code);
    const json answer = parsed_answer(a.line);
    EXPECT_EQ(answer["ok"], false);
    EXPECT_EQ(answer["error"]["code"], c.code);
    const std::string message = answer["error"]["message"];
    for (const auto& part : c.in_message)
      EXPECT_NE(message.find(part), std::string::npos) << "'" << part << "' not in: " << message;
  }
}

TEST(AdminProtocol, NotJsonOrNotAnObject) {
  expect_refused({
      {"", "bad_json", {"not JSON"}},
      {"hello", "bad_json", {"not JSON", "byte"}},
      {R"({"cmd":"status")", "bad_json", {"not JSON"}},
      {R"({"cmd":"status"} {"cmd":"status"})", "bad_json", {"not JSON"}},
      {"\xff\xfe{}", "bad_json", {"not JSON"}},
      {R"({"cmd":"st\xffus"})", "bad_json", {"not JSON"}},  // invalid UTF-8 in a string
      {"[1,2]", "bad_json", {"object"}},
      {"42", "bad_json", {"object"}},
      {"\"status\"", "bad_json", {"object"}},
      {"null", "bad_json", {"object"}},
  });
}

TEST(AdminProtocol, LineTooLongIsRefusedBeforeParsingAndCloses) {
  const std::string line = R"({"cmd":"status","pad":")" + std::string(300, 'x') + "\"}";
  auto parsed = parse_request(line, 256);
  ASSERT_TRUE(std::holds_alternative<Answer>(parsed));
  EXPECT_EQ(std::get<Answer>(parsed).code, "line_too_long");
  EXPECT_TRUE(std::get<Answer>(parsed).close);
  EXPECT_NE(parsed_answer(std::get<Answer>(parsed).line)["error"]["message"].get<std::string>().find("256"),
            std::string::npos);
  // Exactly at the limit is fine (and the other errors do not close).
  const std::string at_limit = R"({"cmd":"status"})" + std::string(256 - 16, ' ');
  ASSERT_EQ(at_limit.size(), 256u);
  EXPECT_TRUE(std::holds_alternative<Request>(parse_request(at_limit, 256)));
  EXPECT_FALSE(std::get<Answer>(parse_request("nope", 256)).close);
}

TEST(AdminProtocol, UnknownOrMissingCommand) {
  expect_refused({
      {R"({"cmd":"statuss"})", "unknown_command", {"statuss", "status", "migrate"}},
      {R"({"cmd":"replay"})", "unknown_command", {"replay"}},
      {R"({"cmd":"trace"})", "bad_params", {"missing 'request_id'"}},
      {R"({"cmd":""})", "unknown_command", {"''"}},
      {R"({"cmd":"STATUS"})", "unknown_command", {"STATUS"}},
      {R"({"id":1})", "bad_params", {"missing 'cmd'"}},
      {R"({})", "bad_params", {"missing 'cmd'"}},
      {R"({"cmd":1})", "bad_params", {"'cmd' must be a string"}},
      {R"({"cmd":null})", "bad_params", {"'cmd' must be a string"}},
      {R"({"cmd":["status"]})", "bad_params", {"'cmd' must be a string"}},
  });
  // A long unknown name is cut in the message.
  auto parsed = parse_request(R"({"cmd":")" + std::string(1000, 'z') + "\"}");
  EXPECT_LT(std::get<Answer>(parsed).line.size(), 600u);
}

TEST(AdminProtocol, BadParamsOfEachKind) {
  expect_refused({
      // unknown parameters, named
      {R"({"cmd":"status","verbose":true})", "bad_params", {"unknown parameter 'verbose'", "takes none"}},
      {R"({"cmd":"drain","a":1,"b":2})", "bad_params", {"unknown parameters 'a', 'b'"}},
      {R"({"cmd":"migrate","layer":0,"expert":0,"to":1,"rank":2})", "bad_params",
       {"'rank'", "'layer'", "'from'"}},
      {R"({"cmd":"migration","id":3,"mid":3})", "bad_params", {"'mid'"}},
      {R"({"cmd":"reoptimize","dry-run":true})", "bad_params", {"'dry-run'", "'dry_run'"}},
      // missing required
      {R"({"cmd":"migrate","expert":0,"to":1})", "bad_params", {"missing 'layer'"}},
      {R"({"cmd":"migrate","layer":0,"to":1})", "bad_params", {"missing 'expert'"}},
      {R"({"cmd":"migrate","layer":0,"expert":1})", "bad_params", {"missing 'to'"}},
      // ill-typed
      {R"({"cmd":"migrate","layer":"0","expert":0,"to":1})", "bad_params", {"'layer'", "integer", "string"}},
      {R"({"cmd":"migrate","layer":1.5,"expert":0,"to":1})", "bad_params", {"'layer'", "1.5"}},
      {R"({"cmd":"migrate","layer":2.0,"expert":0,"to":1})", "bad_params", {"'layer'"}},
      {R"({"cmd":"migrate","layer":true,"expert":0,"to":1})", "bad_params", {"'layer'", "boolean"}},
      {R"({"cmd":"migrate","layer":null,"expert":0,"to":1})", "bad_params", {"'layer'", "null"}},
      {R"({"cmd":"migrate","layer":0,"expert":[1],"to":1})", "bad_params", {"'expert'", "array"}},
      {R"({"cmd":"reoptimize","dry_run":1})", "bad_params", {"'dry_run'", "true or false"}},
      {R"({"cmd":"reoptimize","dry_run":"yes"})", "bad_params", {"'dry_run'"}},
      {R"({"cmd":"reoptimize","policy":3})", "bad_params", {"'policy'", "metis"}},
      {R"({"cmd":"stats","dump":7})", "bad_params", {"'dump'", "absolute path"}},
      {R"({"cmd":"migration","migration_id":"3"})", "bad_params", {"'migration_id'"}},
      // out of range, or not one of the choices
      {R"({"cmd":"migrate","layer":-1,"expert":0,"to":1})", "bad_params", {"'layer'", "-1"}},
      {R"({"cmd":"migrate","layer":0,"expert":-3,"to":1})", "bad_params", {"'expert'", "-3"}},
      {R"({"cmd":"migrate","layer":0,"expert":0,"to":-1})", "bad_params", {"'to'"}},
      {R"({"cmd":"migrate","layer":0,"expert":0,"to":1,"from":-2})", "bad_params", {"'from'"}},
      {R"({"cmd":"migrate","layer":2147483648,"expert":0,"to":1})", "bad_params", {"'layer'", "2147483648"}},
      {R"({"cmd":"migrate","layer":18446744073709551615,"expert":0,"to":1})", "bad_params", {"'layer'"}},
      {R"({"cmd":"reoptimize","max_moves":-1})", "bad_params", {"'max_moves'", "[0, "}},
      {R"({"cmd":"reoptimize","policy":"best"})", "bad_params", {"'policy'", "one of metis, greedy-load, contiguous, round-robin", "'best'"}},
      {R"({"cmd":"reoptimize","policy":"METIS"})", "bad_params", {"'policy'"}},
      {R"({"cmd":"stats","dump":""})", "bad_params", {"'dump'"}},
      {R"({"cmd":"stats","dump":"relative/path"})", "bad_params", {"'dump'", "absolute"}},
      {R"({"cmd":"migration","migration_id":-1})", "bad_params", {"'migration_id'"}},
  });
}

TEST(AdminProtocol, ErrorAnswersKeepTheIdWhenItIsValid) {
  auto parsed = parse_request(R"({"id":"x7","cmd":"migrate","layer":-1,"expert":0,"to":1})");
  EXPECT_EQ(parsed_answer(std::get<Answer>(parsed).line)["id"], "x7");
  parsed = parse_request(R"({"id":9,"cmd":"nope"})");
  EXPECT_EQ(parsed_answer(std::get<Answer>(parsed).line)["id"], 9);
  // Not JSON: no id can be known.
  parsed = parse_request(R"({"id":9,"cmd":)");
  EXPECT_EQ(parsed_answer(std::get<Answer>(parsed).line)["id"], nullptr);
}

TEST(AdminProtocol, AnswerFormatting) {
  const json ok = parsed_answer(answer_ok(5, {{"epoch", 3}, {"ok", false}, {"id", "spoof"}}));
  EXPECT_EQ(ok, json({{"id", 5}, {"ok", true}, {"epoch", 3}}));
  // id and ok come first, for people reading the lines.
  EXPECT_EQ(answer_ok("a", {{"b", 1}}).rfind(R"({"id":"a","ok":true,)", 0), 0u);
  EXPECT_EQ(parsed_answer(answer_ok(nullptr, nullptr)), json({{"id", nullptr}, {"ok", true}}));

  const json err = parsed_answer(answer_error("r1", "busy", "migration 3 runs"));
  EXPECT_EQ(err, json({{"id", "r1"},
                       {"ok", false},
                       {"error", {{"code", "busy"}, {"message", "migration 3 runs"}}}}));
  // Newlines in a message are escaped: one answer, one line.
  EXPECT_EQ(answer_error(1, "internal", "a\nb").find('\n'), std::string::npos);
  // Invalid UTF-8 (say, from a path) never throws: replaced.
  const json bad_utf8 = parsed_answer(answer_error(1, "refused", "no \xff\xfe memory"));
  EXPECT_NE(bad_utf8["error"]["message"].get<std::string>().find("memory"), std::string::npos);
  EXPECT_NO_THROW(answer_ok(1, {{"path", "\xc3"}}));

  EXPECT_EQ(error_body("busy", "m"), json({{"ok", false}, {"error", {{"code", "busy"}, {"message", "m"}}}}));
}

TEST(AdminProtocol, CommandTable) {
  std::vector<std::string> names;
  for (const auto& c : commands()) {
    names.push_back(c.name);
    EXPECT_FALSE(c.doc.empty()) << c.name;
    for (const auto& p : c.params) {
      EXPECT_FALSE(p.doc.empty()) << c.name << "." << p.name;
      EXPECT_NE(p.name, "id") << "'id' is the request's own id";
      EXPECT_NE(p.name, "cmd");
    }
  }
  EXPECT_EQ(names, (std::vector<std::string>{"status", "metrics", "placement", "stats", "reoptimize",
                                             "migrate", "migration", "trace", "trace_follow", "admit",
                                             "drain", "shutdown"}));
  EXPECT_FALSE(is_control("trace")) << "answered from rank 0's traces at once";
  for (const std::string control : {"reoptimize", "migrate", "trace_follow", "admit", "drain", "shutdown"})
    EXPECT_TRUE(is_control(control)) << control;
  for (const std::string snapshot : {"status", "metrics", "placement", "stats", "migration", "nope"})
    EXPECT_FALSE(is_control(snapshot)) << snapshot;
  EXPECT_EQ(find_command("nope"), nullptr);
  ASSERT_NE(find_command("migrate"), nullptr);
  EXPECT_EQ(find_command("migrate")->params.size(), 4u);
}

TEST(AdminProtocol, HelpersForPathsAndText) {
  EXPECT_EQ(socket_path("/run/moed", 3), "/run/moed/moed-3.sock");
  EXPECT_EQ(socket_path("/run/moed/", 0), "/run/moed/moed-0.sock");
  EXPECT_EQ(default_run_dir(nullptr, 1000), "/tmp/moed-1000");
  EXPECT_EQ(default_run_dir("", 0), "/tmp/moed-0");
  EXPECT_EQ(default_run_dir("/srv/run", 0), "/srv/run");
  EXPECT_TRUE(is_blank(""));
  EXPECT_TRUE(is_blank(" \t\r"));
  EXPECT_FALSE(is_blank(" x"));
  EXPECT_EQ(excerpt("short"), "short");
  EXPECT_EQ(excerpt(std::string(100, 'a'), 10), std::string(10, 'a') + "...");
  // Never cut inside a UTF-8 sequence: "é" is 2 bytes.
  EXPECT_EQ(excerpt("aaaa\xc3\xa9zz", 5), "aaaa...");
  EXPECT_EQ(echo_id(json{{"id", 4}}), 4);
  EXPECT_EQ(echo_id(json{{"id", 4.5}}), nullptr);
  EXPECT_EQ(echo_id(json::array()), nullptr);
}

}  // namespace
}  // namespace moed::runtime::admin
