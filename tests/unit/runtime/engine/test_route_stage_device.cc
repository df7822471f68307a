// The route stage's device seam (route_stage.h's DeviceRouter), without a
// GPU: a fake device router takes the plain path when no router policy
// acts, and is never asked for replayed routing; with the balancing bias, a
// CPU double of the device router's contract gives the stage the CPU
// stage's routing, rows and counters, step after step; under a policy that
// needs the step's tokens or the logits on the host, the device normalises
// and gates, the policy chooses here, and the stage is again the CPU
// stage, bit for bit; make_device_router gives none on the CPU, and refuses
// a device it cannot make with an error, never a silent CPU stage.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "common/error.h"
#include "kernels/cpu/rms_norm.h"
#include "placement/placement.h"
#include "runtime/config/config.h"
#include "runtime/engine/route_stage.h"
#include "runtime/weights/expert_store.h"
#include "tests/unit/runtime/fake_fabric.h"

namespace moed::runtime {
namespace {

constexpr int kExperts = 8, kHidden = 64, kRows = 5;

// Answers every token with expert 3 at weight 0.5 and rows of 42, or logits
// that put expert 5 first (the rest tie, so expert 0 next): nothing the CPU
// would give.
class FakeDeviceRouter final : public DeviceRouter {
 public:
  FakeDeviceRouter(int* calls, int* gates) : calls_(calls), gates_(gates) {}
  void route(int layer, const float* x, std::size_t count, float* xn, Routing& routing,
             const double* adjust) override {
    static_cast<void>(layer), static_cast<void>(x), static_cast<void>(adjust);
    ++*calls_;
    for (std::size_t i = 0; i < count * kHidden; ++i) xn[i] = 42.0f;
    for (std::size_t t = 0; t < count; ++t) {
      routing.add(3, 0.5f);
      routing.end_token();
    }
  }
  void norm_and_gate(int layer, const float* x, std::size_t count, float* xn, float* logits) override {
    static_cast<void>(layer), static_cast<void>(x);
    ++*gates_;
    for (std::size_t i = 0; i < count * kHidden; ++i) xn[i] = 42.0f;
    for (std::size_t i = 0; i < count * kExperts; ++i) logits[i] = i % kExperts == 5 ? 4.0f : 0.0f;
  }

 private:
  int* calls_;
  int* gates_;
};

// The device router's contract computed on the CPU: the layer's RMSNorm, the
// fp32 gate (and router bias), then rank_experts with the adjustments and
// choose. What CudaRouter must match bit for bit (its own test holds it to
// runtime::route and rank_experts on a GPU).
class CpuDeviceRouter final : public DeviceRouter {
 public:
  CpuDeviceRouter(const Config& c, const ExpertStore& store, int* calls, int* adjusted, int* gates = nullptr)
      : config_(c), store_(store), calls_(calls), adjusted_(adjusted), gates_(gates) {}
  void route(int layer, const float* x, std::size_t count, float* xn, Routing& routing,
             const double* adjust) override {
    ++*calls_;
    *adjusted_ += adjust != nullptr;
    std::vector<float> logits(count * kExperts);
    gate(layer, x, count, xn, logits.data());
    const LayerWeights& w = store_.layer(layer);
    const std::size_t E = kExperts;
    const RouterParams params = RouterParams::from(config_).at_layer(w.selection_bias);
    Ranked ranked;
    rank_experts(logits.data(), adjust, count, E, params, 0, ranked);
    choose(ranked, params.spec, routing);
  }
  void norm_and_gate(int layer, const float* x, std::size_t count, float* xn, float* logits) override {
    if (gates_) ++*gates_;
    gate(layer, x, count, xn, logits);
  }

 private:
  void gate(int layer, const float* x, std::size_t count, float* xn, float* logits) const {
    const LayerWeights& w = store_.layer(layer);
    const std::size_t E = kExperts, H = kHidden;
    kernels::rms_norm(x, w.norm.data(), count, H, float(config_.model.norm_eps), xn);
    kernels::gemm_fixed_order(xn, count, kernels::PackedWeights(w.gate.data(), E, H), logits);
    for (std::size_t t = 0; t < count && !w.gate_bias.empty(); ++t)
      for (std::size_t e = 0; e < E; ++e) logits[t * E + e] += w.gate_bias[e];
  }

  const Config& config_;
  const ExpertStore& store_;
  int* calls_;
  int* adjusted_;
  int* gates_;
};

Config config_with(std::vector<std::string> settings) {
  std::vector<std::string> all = {"model.layers=2", "model.experts=8", "model.top_k=2", "model.hidden=64",
                                  "model.ffn=32"};
  all.insert(all.end(), settings.begin(), settings.end());
  return load_config("", all);
}

struct StageRun {
  int calls = 0, gates = 0;
  Routing routing;
  std::vector<float> xn;
};

StageRun run_stage(const Config& c, bool replayed) {
  fake::Fabric fabric(1);
  const auto transport = fabric.transport(0, 1);
  const placement::Placement placement = placement::contiguous(1, 2, kExperts);
  const ExpertStore store = ExpertStore::load(c, placement, 0);
  StageRun run;
  RouteStage stage(c, *transport, placement, store, std::make_unique<FakeDeviceRouter>(&run.calls, &run.gates));
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
  EXPECT_EQ(run.gates, 0);
  ASSERT_EQ(run.routing.tokens(), std::size_t(kRows));
  EXPECT_EQ(run.routing.experts_of(0)[0], 1u);  // as recorded
  EXPECT_NE(run.xn.front(), 42.0f);             // normalised on the CPU
}

// Smoothing and a load policy need every rank's tokens, the jitter
// measurement the logits on the host: the device normalises and gates (the
// jitter's noisy copies too), and the policy chooses from its logits here.
TEST(RouteStageDevice, NormalisesAndGatesOnTheDeviceWhereAPolicyChoosesOnTheHost) {
  for (const auto& [policy, gates] : {std::pair{std::string("router.smoothing_beta=0.3"), 1},
                                      std::pair{std::string("router.load_policy=drop"), 1},
                                      std::pair{std::string("router.measure_jitter=true"), 3}}) {
    SCOPED_TRACE(policy);
    const StageRun run = run_stage(config_with({policy}), false);
    EXPECT_EQ(run.calls, 0);
    EXPECT_EQ(run.gates, gates);
    EXPECT_EQ(run.xn.front(), 42.0f);  // the device's normalised rows
    ASSERT_EQ(run.routing.tokens(), std::size_t(kRows));
    std::size_t fives = 0;
    for (std::uint32_t e : run.routing.experts) {
      EXPECT_TRUE(e == 5 || e == 0) << "expert " << e << ": not from the device's logits";
      fives += e == 5;
    }
    EXPECT_GT(fives, 0u);
  }
}

// One step of both stages on `rows`: the same routing, normalised rows and
// counters, bit for bit; then the step's loads move both stages' policies
// alike (the engine's end_layer). The pairs the policies changed.
std::uint64_t same_step(RouteStage& on_cpu, RouteStage& on_device, const RouteStage::Rows& rows) {
  Routing want, got;
  StepRecord want_rec, got_rec;
  on_cpu.run(rows, false, want, want_rec);
  on_device.run(rows, false, got, got_rec);
  EXPECT_EQ(got.experts, want.experts);
  EXPECT_EQ(std::memcmp(got.weights.data(), want.weights.data(), want.weights.size() * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(on_device.normalised(), on_cpu.normalised(), rows.count * kHidden * sizeof(float)), 0);
  EXPECT_EQ(got_rec.router.words(), want_rec.router.words());
  std::vector<std::uint64_t> load(kExperts, 0);
  for (std::uint32_t e : want.experts) ++load[e];
  on_cpu.policies().end_layer(rows.layer, load);
  on_device.policies().end_layer(rows.layer, load);
  return got_rec.router.changed;
}

// Under the balancing bias the device routes with the bias's adjustments,
// then without them (the plain selection, whose pairs the bias changed are
// counted): with the contract computed on the CPU, the stage's routing,
// normalised rows and counters are the CPU stage's, over steps whose loads
// move the bias.
TEST(RouteStageDevice, RoutesUnderTheBalancingBiasAsTheCpuStage) {
  const Config c = config_with({"router.bias_gamma=0.05"});
  fake::Fabric fabric(1);
  const auto transport = fabric.transport(0, 1);
  const placement::Placement placement = placement::contiguous(1, 2, kExperts);
  const ExpertStore store = ExpertStore::load(c, placement, 0);
  int calls = 0, adjusted = 0;
  RouteStage on_cpu(c, *transport, placement, store);
  RouteStage on_device(c, *transport, placement, store,
                       std::make_unique<CpuDeviceRouter>(c, store, &calls, &adjusted));
  const std::size_t rows_here = 24;
  std::vector<TokenTag> tags(rows_here);
  for (std::size_t t = 0; t < tags.size(); ++t) tags[t] = {t + 1, 0};
  const std::vector<std::uint32_t> rows_of_rank = {std::uint32_t(rows_here)};
  const std::string where = "test";
  std::uint64_t changed = 0;
  for (int step = 0; step < 4; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    std::vector<float> x(rows_here * kHidden);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = float((i * 7 + std::size_t(step) * 13) % 17) / 8.0f - 1.0f;
    const RouteStage::Rows rows{1, x.data(), rows_here, tags, rows_of_rank, &where};
    changed += same_step(on_cpu, on_device, rows);
  }
  EXPECT_EQ(calls, 8);     // each step: with the bias, then the plain selection
  EXPECT_EQ(adjusted, 4);  // the plain selection has no adjustment
  EXPECT_GT(changed, 0u) << "the bias never changed a choice: the test shows nothing";
}

// Under each policy that chooses on the host (and with the balancing bias
// beside it), the device's rows and logits (the contract, computed here)
// give the CPU stage's routing, normalised rows and counters, bit for bit,
// over steps whose loads move the policies' state.
TEST(RouteStageDevice, ChoosesUnderEveryHostPolicyAsTheCpuStage) {
  for (const std::vector<std::string>& policy :
       {std::vector<std::string>{"router.smoothing_beta=0.3"}, std::vector<std::string>{"router.load_policy=drop"},
        std::vector<std::string>{"router.load_policy=demote", "router.bias_gamma=0.05"},
        std::vector<std::string>{"router.measure_jitter=true"}}) {
    SCOPED_TRACE(policy.front());
    const Config c = config_with(policy);
    fake::Fabric fabric(1);
    const auto transport = fabric.transport(0, 1);
    const placement::Placement placement = placement::contiguous(1, 2, kExperts);
    const ExpertStore store = ExpertStore::load(c, placement, 0);
    int calls = 0, adjusted = 0, gates = 0;
    RouteStage on_cpu(c, *transport, placement, store);
    RouteStage on_device(c, *transport, placement, store,
                         std::make_unique<CpuDeviceRouter>(c, store, &calls, &adjusted, &gates));
    const std::size_t rows_here = 24;
    std::vector<TokenTag> tags(rows_here);
    const std::vector<std::uint32_t> rows_of_rank = {std::uint32_t(rows_here)};
    const std::string where = "test";
    for (int step = 0; step < 3; ++step) {
      SCOPED_TRACE("step " + std::to_string(step));
      for (std::size_t t = 0; t < tags.size(); ++t) tags[t] = {t % 6 + 1, std::uint32_t(step * 4 + t / 6)};
      std::vector<float> x(rows_here * kHidden);
      for (std::size_t i = 0; i < x.size(); ++i) x[i] = float((i * 5 + std::size_t(step) * 11) % 19) / 9.0f - 1.0f;
      const RouteStage::Rows rows{1, x.data(), rows_here, tags, rows_of_rank, &where};
      same_step(on_cpu, on_device, rows);
    }
    EXPECT_EQ(calls, 0);  // never the device's own choice
    EXPECT_GE(gates, 3);
  }
}

TEST(RouteStageDevice, MakeDeviceRouterGivesNoneOnTheCpu) {
  const placement::Placement placement = placement::contiguous(1, 2, kExperts);
  const Config plain = config_with({}), smoothing = config_with({"router.smoothing_beta=0.3"});
  const ExpertStore store = ExpertStore::load(plain, placement, 0);
  EXPECT_EQ(make_device_router(ExpertDevice::cpu, plain, store, 0), nullptr);
  EXPECT_EQ(make_device_router(ExpertDevice::cpu, smoothing, store, 0), nullptr);
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
