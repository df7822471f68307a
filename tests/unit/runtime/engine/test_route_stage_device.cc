// The route stage's device seam (route_stage.h's DeviceRouter), without a
// GPU: a fake device router takes the plain path when no router policy
// acts, and is never asked for replayed routing; make_device_router gives
// none on the CPU or where a policy acts, and refuses a device it cannot
// make with an error, never a silent CPU stage.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/error.h"
#include "placement/placement.h"
#include "runtime/config/config.h"
#include "runtime/engine/route_stage.h"
#include "runtime/weights/expert_store.h"
#include "tests/unit/runtime/fake_fabric.h"

namespace moed::runtime {
namespace {

constexpr int kExperts = 8, kHidden = 64, kRows = 5;

// Answers every token with expert 3 at weight 0.5 and rows of 42: nothing the CPU would give.
class FakeDeviceRouter final : public DeviceRouter {
 public:
  explicit FakeDeviceRouter(int* calls) : calls_(calls) {}
  void route(int layer, const float* x, std::size_t count, float* xn, Routing& routing) override {
    static_cast<void>(layer), static_cast<void>(x);
    ++*calls_;
    for (std::size_t i = 0; i < count * kHidden; ++i) xn[i] = 42.0f;
    for (std::size_t t = 0; t < count; ++t) {
      routing.add(3, 0.5f);
      routing.end_token();
    }
  }

 private:
  int* calls_;
};

Config config_with(std::vector<std::string> settings) {
  std::vector<std::string> all = {"model.layers=2", "model.experts=8", "model.top_k=2", "model.hidden=64",
                                  "model.ffn=32"};
  all.insert(all.end(), settings.begin(), settings.end());
  return load_config("", all);
}

struct StageRun {
  int calls = 0;
  Routing routing;
  std::vector<float> xn;
};

StageRun run_stage(const Config& c, bool replayed) {
  fake::Fabric fabric(1);
  const auto transport = fabric.transport(0, 1);
  const placement::Placement placement = placement::contiguous(1, 2, kExperts);
  const ExpertStore store = ExpertStore::load(c, placement, 0);
  StageRun run;
  RouteStage stage(c, *transport, placement, store, std::make_unique<FakeDeviceRouter>(&run.calls));
  std::vector<float> x(std::size_t(kRows) * kHidden, 0.25f);
  std::vector<TokenTag> tags(kRows);
  for (std::size_t t = 0; t < tags.size(); ++t) tags[t] = {t + 1, 0};
  const std::vector<std::uint32_t> rows_of_rank = {kRows};
  const std::string where = "test";
  RouteStage::Rows rows{1, x.data(), kRows, tags, rows_of_rank, &where};
  if (replayed) {  // routing as a trace recorded it
    for (int t = 0; t < kRows; ++t) {
      run.routing.add(1, 0.75f);
      run.routing.add(6, 0.25f);
      run.routing.end_token();
    }
  }
  StepRecord rec;
  stage.run(rows, replayed, run.routing, rec);
  run.xn.assign(stage.normalised(), stage.normalised() + x.size());
  return run;
}

TEST(RouteStageDevice, TakesThePlainPathWhenNoPolicyActs) {
  const StageRun run = run_stage(config_with({}), false);
  EXPECT_EQ(run.calls, 1);
  ASSERT_EQ(run.routing.tokens(), std::size_t(kRows));
  for (std::size_t t = 0; t < run.routing.tokens(); ++t) EXPECT_EQ(run.routing.experts_of(t)[0], 3u);
  EXPECT_EQ(run.xn.front(), 42.0f);  // the experts take the device's normalised rows
}

TEST(RouteStageDevice, IsNeverAskedForReplayedRouting) {
  const StageRun run = run_stage(config_with({}), true);
  EXPECT_EQ(run.calls, 0);
  ASSERT_EQ(run.routing.tokens(), std::size_t(kRows));
  EXPECT_EQ(run.routing.experts_of(0)[0], 1u);  // as recorded
  EXPECT_NE(run.xn.front(), 42.0f);             // normalised on the CPU
}

TEST(RouteStageDevice, StaysOnTheCpuWhereAPolicyActs) {
  for (const std::string& policy : {std::string("router.smoothing_beta=0.3"), std::string("router.bias_gamma=0.01")}) {
    SCOPED_TRACE(policy);
    const StageRun run = run_stage(config_with({policy}), false);
    EXPECT_EQ(run.calls, 0);
    ASSERT_EQ(run.routing.tokens(), std::size_t(kRows));
    EXPECT_NE(run.xn.front(), 42.0f);
  }
}

TEST(RouteStageDevice, MakeDeviceRouterGivesNoneOnTheCpuOrUnderAPolicy) {
  const placement::Placement placement = placement::contiguous(1, 2, kExperts);
  const Config plain = config_with({}), smoothing = config_with({"router.smoothing_beta=0.3"});
  const ExpertStore store = ExpertStore::load(plain, placement, 0);
  EXPECT_EQ(make_device_router(ExpertDevice::cpu, plain, store, 0), nullptr);
  EXPECT_EQ(make_device_router(ExpertDevice::cuda, smoothing, store, 0), nullptr);
}

TEST(RouteStageDevice, MakeDeviceRouterRefusesADeviceItCannotMake) {
  // Here there is no usable GPU (or no CUDA in the build): an error naming it, never a silent CPU stage.
  std::string why;
  const Config plain = config_with({});
  const ExpertStore store = ExpertStore::load(plain, placement::contiguous(1, 2, kExperts), 0);
  bool made = false;
  try {
    made = make_device_router(ExpertDevice::cuda, plain, store, 0) != nullptr;
  } catch (const std::exception& e) {
    why = e.what();
  }
  if (made) GTEST_SKIP() << "a usable GPU is here: CudaRouter's own test covers it";
  EXPECT_NE(why.find("cuda"), std::string::npos) << why;
}

}  // namespace
}  // namespace moed::runtime
