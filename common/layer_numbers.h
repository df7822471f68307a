// The model's own layer numbers of the MoE layers moed serves. Inside moed an
// MoE layer is its index among the MoE layers (0 .. L-1: placement, routing
// statistics, the engine); what users read and send speaks the model's
// numbering, in which dense layers take numbers too (DeepSeek-V3's MoE
// layers are model layers 3 to 60): admin answers and requests, metrics,
// traces, logs and placement files.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace moed {

class LayerNumbers {
 public:
  // Every MoE layer numbered as its index (a model without dense layers).
  LayerNumbers() = default;
  // model_layers[i]: the model layer number of MoE layer i, ascending.
  // A list that is not strictly ascending and non-negative is an Internal error.
  explicit LayerNumbers(std::vector<int> model_layers);

  // The model layer number of MoE layer `moe`.
  int model(int moe) const;
  // The MoE layer of model layer `model`; none for a dense layer or one
  // outside the model. `moe_layers` bounds the identity numbering.
  std::optional<int> moe(int model, int moe_layers) const;
  // Why model layer `model` is no MoE layer of `moe_layers`: "layer 2 is not
  // one of the model's MoE layers (3-5,7)".
  std::string why_not(int model, int moe_layers) const;
  // The numbers of MoE layers 0 .. moe_layers-1.
  std::vector<int> all(int moe_layers) const;
  bool identity() const;

 private:
  std::vector<int> model_layers_;  // empty: identity
};

}  // namespace moed
