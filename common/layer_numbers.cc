#include "common/layer_numbers.h"

#include <algorithm>

#include <fmt/format.h>

#include "common/error.h"
#include "common/int_ranges.h"

namespace moed {

LayerNumbers::LayerNumbers(std::vector<int> model_layers) : model_layers_(std::move(model_layers)) {
  for (std::size_t i = 0; i < model_layers_.size(); ++i)
    MOED_CHECK(model_layers_[i] >= 0 && (i == 0 || model_layers_[i] > model_layers_[i - 1]),
               "model layer numbers must ascend: {} after {}", model_layers_[i], i ? model_layers_[i - 1] : -1);
}

int LayerNumbers::model(int moe) const {
  if (model_layers_.empty()) return moe;
  MOED_CHECK(moe >= 0 && std::size_t(moe) < model_layers_.size(), "MoE layer {} of {}", moe, model_layers_.size());
  return model_layers_[std::size_t(moe)];
}

std::optional<int> LayerNumbers::moe(int model, int moe_layers) const {
  if (model_layers_.empty()) return model >= 0 && model < moe_layers ? std::optional<int>(model) : std::nullopt;
  auto it = std::lower_bound(model_layers_.begin(), model_layers_.end(), model);
  if (it == model_layers_.end() || *it != model) return std::nullopt;
  return int(it - model_layers_.begin());
}

std::string LayerNumbers::why_not(int model, int moe_layers) const {
  if (moe_layers <= 0) return fmt::format("layer {}: the model has no MoE layer", model);
  return fmt::format("layer {} is not one of the model's MoE layers ({})", model, format_ranges(all(moe_layers)));
}

std::vector<int> LayerNumbers::all(int moe_layers) const {
  std::vector<int> out;
  for (int i = 0; i < moe_layers; ++i) out.push_back(model(i));
  return out;
}

bool LayerNumbers::identity() const {
  for (std::size_t i = 0; i < model_layers_.size(); ++i)
    if (model_layers_[i] != int(i)) return false;
  return true;
}

}  // namespace moed
