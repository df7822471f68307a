// The admin socket's snapshot answers: each command's body from what the
// snapshot holds, and the refusals before there is anything to show.
#include "runtime/control/snapshot_answer.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>

namespace moed::runtime {
namespace {

admin::Request request(const std::string& cmd, nlohmann::json params = nlohmann::json::object()) {
  admin::Request r;
  r.id = 1;
  r.cmd = cmd;
  r.params = std::move(params);
  return r;
}

std::string refusal(const nlohmann::json& body) {
  EXPECT_EQ(body.value("ok", true), false) << body;
  EXPECT_EQ(body["error"]["code"], "refused") << body;
  return body["error"].value("message", "");
}

TEST(SnapshotAnswer, BeforeAnyPublishStatusSaysStarting) {
  const Snapshot snapshot(default_config(), 3, {0, 0, 0, 0});
  EXPECT_EQ(snapshot_answer(snapshot, request("status")), (nlohmann::json{{"rank", 3}, {"state", "starting"}}));
  EXPECT_EQ(refusal(snapshot_answer(snapshot, request("metrics"))),
            "no figures yet: metrics come from rank 0 after the warm-up");
  EXPECT_EQ(refusal(snapshot_answer(snapshot, request("migration"))), "no migration has run (ask rank 0)");
  EXPECT_EQ(refusal(snapshot_answer(snapshot, request("stats"))),
            "no statistics gathered yet (rank 0 gathers every [stats].every_steps)");
}

TEST(SnapshotAnswer, AnswersAreWhatWasPublished) {
  Snapshot snapshot(default_config(), 0, {0});
  ControlState control;
  control.step = 4;
  control.state = "serving";
  Summary summary;
  summary.measured_steps = 1;
  snapshot.publish(control, &summary);
  snapshot.set_placement({{"epoch", 2}});
  const nlohmann::json status = snapshot_answer(snapshot, request("status"));
  EXPECT_EQ(status, snapshot.status());
  EXPECT_EQ(status["step"], 4);
  EXPECT_EQ(snapshot_answer(snapshot, request("metrics")), (nlohmann::json{{"text", *snapshot.metrics_text()}}));
  EXPECT_EQ(snapshot_answer(snapshot, request("placement")), (nlohmann::json{{"epoch", 2}}));
}

TEST(SnapshotAnswer, AMigrationIsAnsweredByItsId) {
  Snapshot snapshot(default_config(), 0, {0});
  snapshot.set_migration({{"id", 7}, {"state", "done"}});
  const nlohmann::json migration = {{"migration", {{"id", 7}, {"state", "done"}}}};
  EXPECT_EQ(snapshot_answer(snapshot, request("migration")), migration);
  EXPECT_EQ(snapshot_answer(snapshot, request("migration", {{"migration_id", 7}})), migration);
  EXPECT_EQ(refusal(snapshot_answer(snapshot, request("migration", {{"migration_id", 6}}))), "the last migration is 7");
}

TEST(SnapshotAnswer, StatsAreSummarised) {
  Snapshot snapshot(default_config(), 0, {0});
  snapshot.set_stats(std::make_shared<const routing::RoutingStats>(2, 4, 0.0));
  const nlohmann::json body = snapshot_answer(snapshot, request("stats"));
  EXPECT_EQ(body["steps"], 0);
  EXPECT_EQ(body["per_layer"].size(), 2u);
  EXPECT_FALSE(body.contains("dump"));
}

TEST(SnapshotAnswer, ACommandWithoutASnapshotIsAnInternalError) {
  const Snapshot snapshot(default_config(), 0, {0});
  const nlohmann::json body = snapshot_answer(snapshot, request("reoptimize"));
  EXPECT_EQ(body["error"]["code"], "internal");
  EXPECT_EQ(body["error"]["message"], "command reoptimize has no snapshot");
}

}  // namespace
}  // namespace moed::runtime
