// [model].check_finite: weights holding NaN or inf are refused at load with an
// Input error naming the file (the shard, when sharded), the tensor, the first
// bad element and its value, for F32 and BF16 files; switched off, they load.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "placement/placement.h"
#include "runtime/config/config.h"
#include "runtime/weights/model.h"
#include "runtime/weights/expert_store.h"
#include "runtime/weights/finite_check.h"
#include "runtime/weights/safetensors_writer.h"
#include "runtime/weights/synthetic_model.h"
#include "tests/unit/test_support.h"

namespace moed::runtime {
namespace {

constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

using test::expect_error;

TEST(CheckFinite, NamesTheFirstBadElementAndItsValue) {
  std::vector<float> x(12, 1.0f);
  weights::check_finite("f.safetensors", "t", {3, 4}, x.data());  // all finite: no error
  x[9] = -kInf;
  x[11] = kNan;
  expect_error([&] { weights::check_finite("f.safetensors", "t", {3, 4}, x.data()); }, ErrorKind::Input,
               {"f.safetensors: tensor 't' holds -inf at element 9 (index [2, 1] of shape [3, 4])",
                "[model].check_finite"});
  x[5] = kNan;
  expect_error([&] { weights::check_finite("w", "t", {12}, x.data()); }, ErrorKind::Input,
               {"holds nan at element 5 (index [5]"});
  x[0] = kInf;
  expect_error([&] { weights::check_finite("w", "t", {12}, x.data()); }, ErrorKind::Input,
               {"holds inf at element 0"});
}

class FiniteWeightsTest : public ::testing::Test {
 protected:
  FiniteWeightsTest() {
    c_ = default_config();
    c_.model.layers = 2;
    c_.model.experts = 4;
    c_.model.top_k = 2;
    c_.model.hidden = 8;
    c_.model.ffn = 12;
  }

  // Every tensor of the synthetic model, written to `files` shards (tensors
  // dealt round-robin, with an index when more than one); `poke` may spoil one.
  std::string write_model(weights::DType dtype, int files,
                          const std::function<void(const std::string&, std::vector<float>&)>& poke) {
    const ModelShape s = ModelShape::from(c_.model);
    const SyntheticModel model(s, 42, dtype);
    std::vector<weights::SafetensorsWriter> writers{std::size_t(files)};
    std::vector<std::string> names;
    std::string map;
    auto add = [&](const std::string& name, const std::vector<std::int64_t>& dims, auto&& fill) {
      std::size_t n = 1;
      for (auto d : dims) n *= std::size_t(d);
      std::vector<float> v(n);
      fill(v.data());
      poke(name, v);
      const std::size_t k = names.size() % std::size_t(files);
      writers[k].add(name, dtype, dims, v.data());
      map += fmt::format("{}\"{}\": \"part{}.safetensors\"", names.empty() ? "" : ", ", name, k);
      names.push_back(name);
    };
    for (int l = 0; l < s.layers; ++l) {
      add(norm_tensor(l), norm_shape(s), [&](float* p) { model.norm(l, p); });
      add(gate_tensor(l), gate_shape(s), [&](float* p) { model.gate(l, p); });
      for (int e = 0; e < s.experts; ++e) {
        add(expert_tensor(l, e, "w1"), up_shape(s), [&](float* p) { model.up(l, e, 1, p); });
        add(expert_tensor(l, e, "w2"), down_shape(s), [&](float* p) { model.down(l, e, p); });
        add(expert_tensor(l, e, "w3"), up_shape(s), [&](float* p) { model.up(l, e, 3, p); });
      }
    }
    for (int k = 0; k < files; ++k) writers[std::size_t(k)].write(tmp_.file(fmt::format("part{}.safetensors", k)));
    if (files == 1) return tmp_.file("part0.safetensors");
    return tmp_.write("model.safetensors.index.json", "{\"weight_map\": {" + map + "}}");
  }

  // Spoils element `at` of tensor `name` with `value`.
  static std::function<void(const std::string&, std::vector<float>&)> spoil(std::string name, std::size_t at,
                                                                            float value) {
    return [=](const std::string& n, std::vector<float>& v) {
      if (n == name) v.at(at) = value;
    };
  }

  void load(const std::string& weights, const char* dtype) {
    c_.model.weights = weights;
    c_.model.dtype = dtype;
    ExpertStore::load(c_, placement::contiguous(1, int(c_.model.layers), int(c_.model.experts)), 0);
  }

  Config c_;
  test::TempDir tmp_{"moed_finite"};
};

TEST_F(FiniteWeightsTest, NanInAGateIsRefused) {
  const std::string path = write_model(weights::DType::F32, 1, spoil(gate_tensor(1), 13, kNan));
  expect_error([&] { load(path, "f32"); }, ErrorKind::Input,
               {"part0.safetensors: tensor '" + gate_tensor(1) + "' holds nan at element 13 (index [1, 5]"});
  c_.model.check_finite = false;  // the operator's choice: loads as before
  load(path, "f32");
}

TEST_F(FiniteWeightsTest, InfInABf16ExpertIsRefused) {
  const std::string w2 = expert_tensor(0, 3, "w2");
  const std::string path = write_model(weights::DType::BF16, 1, spoil(w2, 20, kInf));
  expect_error([&] { load(path, "bf16"); }, ErrorKind::Input, {"tensor '" + w2 + "' holds inf at element 20"});
  const std::string neg = write_model(weights::DType::BF16, 1, spoil(w2, 0, -kInf));
  expect_error([&] { load(neg, "bf16"); }, ErrorKind::Input, {"holds -inf at element 0 (index [0, 0]"});
}

TEST_F(FiniteWeightsTest, ShardedCheckpointNamesTheShard) {
  const std::string w1 = expert_tensor(1, 2, "w1");
  const std::string index = write_model(weights::DType::F32, 3, spoil(w1, 95, kNan));
  expect_error([&] { load(index, "f32"); }, ErrorKind::Input, {"part", ".safetensors: tensor '" + w1 + "' holds nan"});
  load(write_model(weights::DType::F32, 3, [](const std::string&, std::vector<float>&) {}), "f32");
}

TEST_F(FiniteWeightsTest, SyntheticWeightsPassTheCheck) {
  load("", "f32");
  load("", "bf16");
}

}  // namespace
}  // namespace moed::runtime
