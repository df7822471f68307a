#!/usr/bin/python3
"""A tiny DeepSeek-V3-shaped decoder-only language model (PyTorch, CPU, float32).

The MoE block is DeepSeek-V3's as transformers' `deepseek_v3` computes it in
fp32 (`DeepseekV3TopkRouter`, `DeepseekV3MoE`), with x the layer's
post_attention_layernorm of h:

    s = sigmoid(x @ W_g^T)                       mlp.gate.weight [E, H]
    c = s + e_score_correction_bias              mlp.gate.e_score_correction_bias [E]:
                                                 for the choice only
    n_group groups of E/n_group experts, each scored by the sum of its top-2 c;
    the topk_group best groups kept (the others' c masked to -inf, as DeepSeek's
    inference code; transformers fills 0.0, the same choice while k kept c are
    positive: sigmoids plus a bias of ~0.05); top-k of c
    w = s of the k chosen / their sum (norm_topk_prob) * routed_scaling_factor
    y = sum_i w_i SwiGLU_i(x) + shared(x)        SwiGLU = down(silu(gate x) * up x);
                                                 shared: F = n_shared_experts * moe_intermediate_size
    layer output h + y

Ties go to the lower expert id (moed's rule; in group selection too). The
first `first_k_dense_replace` layers (and those off `moe_layer_freq`) are
dense: a SwiGLU MLP of F = intermediate_size that the model runs itself; only
the MoE layers go to a backend (moed), with the model's own layer numbers.

Attention is plain grouped-query attention with RoPE (examples/common/tiny_lm.py),
not DeepSeek's multi-head latent attention: moed serves only the MoE blocks.
The checkpoint is a Hugging Face directory: config.json (model_type
deepseek_v3 and DeepSeek's keys) and model.safetensors with DeepSeek's tensor
names (docs/model-families.md).

Commands (examples/common/model_cli.py): `write-checkpoint OUT_DIR [--seed 1]`,
`generate --checkpoint DIR [--prompts 1,2,3 4,5]`, and `selftest`, which also
checks the router against transformers' formula.
"""
import os
import sys
from dataclasses import dataclass

import torch
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from model_cli import main  # noqa: E402
from tiny_lm import (DecoderConfig, DecoderLayer, SwiGLU, TinyLM, load_hf_checkpoint, mix_experts,  # noqa: E402
                     row_linear, top_k_lower_id, write_hf_checkpoint)


@dataclass
class Config(DecoderConfig):
    eps: float = 1e-6  # DeepSeek-V3's rms_norm_eps
    # The MoE layers (config.json's names but top_k).
    top_k: int = 4
    n_routed_experts: int = 16
    moe_intermediate_size: int = 32
    n_group: int = 4
    topk_group: int = 2
    norm_topk_prob: bool = True
    routed_scaling_factor: float = 2.5
    n_shared_experts: int = 1
    first_k_dense_replace: int = 1
    moe_layer_freq: int = 1
    intermediate_size: int = 128  # the dense layers' MLP


# The config.json keys whose values this model takes as given.
FIXED = {"scoring_func": "sigmoid", "topk_method": "noaux_tc"}
# Scale of the random selection bias: router scores s are sigmoids of O(1) logits
# (spread ~0.2), so 0.05 changes some choices and leaves most.
BIAS_SCALE = 0.05


def is_moe_layer(cfg: Config, layer: int) -> bool:
    return layer >= cfg.first_k_dense_replace and layer % cfg.moe_layer_freq == 0


class Gate(nn.Module):
    """DeepSeek-V3's router: `weight` [E, H] and `e_score_correction_bias` [E]."""

    def __init__(self, cfg: Config):
        super().__init__()
        self.cfg = cfg
        self.weight = nn.Parameter(torch.empty(cfg.n_routed_experts, cfg.hidden))
        self.e_score_correction_bias = nn.Parameter(torch.zeros(cfg.n_routed_experts))

    def route(self, x, use_bias=True, use_groups=True):
        """The chosen experts [n, k] and their weights [n, k]. use_bias / use_groups
        false: the choice without the correction bias / the group limit (to show
        what they change)."""
        c = self.cfg
        s = torch.sigmoid(row_linear(x, self.weight))
        choice = s + self.e_score_correction_bias if use_bias else s
        if use_groups:
            size = c.n_routed_experts // c.n_group
            top2, _ = top_k_lower_id(choice.view(-1, size), 2)
            group_scores = top2.sum(-1).view(-1, c.n_group)
            _, kept = top_k_lower_id(group_scores, c.topk_group)
            keep = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, kept, True)
            choice = choice.masked_fill(~keep.repeat_interleave(size, dim=1), float("-inf"))
        _, experts = top_k_lower_id(choice, c.top_k)
        weights = s.gather(1, experts)
        if c.norm_topk_prob:
            weights = weights / weights.sum(-1, keepdim=True)
        return experts, weights * c.routed_scaling_factor


class MoE(nn.Module):
    """mlp.gate, mlp.experts.e.{gate,up,down}_proj, mlp.shared_experts.{gate,up,down}_proj."""

    def __init__(self, cfg: Config):
        super().__init__()
        self.gate = Gate(cfg)
        self.experts = nn.ModuleList(SwiGLU(cfg.hidden, cfg.moe_intermediate_size)
                                     for _ in range(cfg.n_routed_experts))
        self.shared_experts = SwiGLU(cfg.hidden, cfg.n_shared_experts * cfg.moe_intermediate_size)

    def forward(self, x):
        experts, weights = self.gate.route(x)
        out = mix_experts(x, experts, weights, len(self.experts), lambda e, rows: self.experts[e](rows))
        return out + self.shared_experts(x)


class DeepSeekTiny(TinyLM):
    """Parameter names follow DeepSeek-V3's (but for attention), so `state_dict()`
    is the checkpoint."""

    def __init__(self, cfg: Config, seed: int = 1):
        layers = [DecoderLayer(cfg, l, "mlp", MoE(cfg), True) if is_moe_layer(cfg, l)
                  else DecoderLayer(cfg, l, "mlp", SwiGLU(cfg.hidden, cfg.intermediate_size), False)
                  for l in range(cfg.n_layers)]
        super().__init__(cfg, layers)
        self.init_weights(seed, lambda name, noise: BIAS_SCALE * noise
                          if name.endswith("e_score_correction_bias") else None)


def save_checkpoint(model: DeepSeekTiny, directory: str):
    write_hf_checkpoint(directory, model, "deepseek_v3", "DeepseekV3ForCausalLM", **FIXED)


def load_checkpoint(directory: str) -> DeepSeekTiny:
    """Reads a directory written by `save_checkpoint` back into a model."""
    return load_hf_checkpoint(directory, Config, DeepSeekTiny, "deepseek_v3", **FIXED)


def compare_notes(model: DeepSeekTiny, records):
    """For examples/common/compare.py: what the correction bias and the group limit
    change on the rows moed served."""
    pairs = by_bias = by_groups = 0
    for layer, h, _ in records:
        mlp = model.model.layers[layer].mlp
        x = model.model.layers[layer].post_attention_layernorm(h)
        chosen = mlp.gate.route(x)[0].sort(-1)[0]
        pairs += chosen.shape[0]
        by_bias += int((chosen != mlp.gate.route(x, use_bias=False)[0].sort(-1)[0]).any(-1).sum())
        by_groups += int((chosen != mlp.gate.route(x, use_groups=False)[0].sort(-1)[0]).any(-1).sum())
    return [f"routing: the correction bias changed the experts of {by_bias} of {pairs} token-layers, "
            f"the group limit ({model.cfg.topk_group} of {model.cfg.n_group} groups) {by_groups}"]


def router_checks(model: DeepSeekTiny, seed: int, check):
    """selftest's own check: the router against a transcription of transformers'
    DeepseekV3TopkRouter (torch.topk, masked to 0.0, the 1e-20 in the denominator)."""
    torch.manual_seed(seed)
    layer = model.moe_layers()[0]
    gate = model.model.layers[layer].mlp.gate
    x = torch.randn(256, model.cfg.hidden)
    experts, weights = gate.route(x)
    c = model.cfg
    s = (x @ gate.weight.T).sigmoid()
    choice = s + gate.e_score_correction_bias
    group_scores = choice.view(-1, c.n_group, c.n_routed_experts // c.n_group).topk(2, dim=-1)[0].sum(-1)
    group_idx = group_scores.topk(c.topk_group, dim=-1)[1]
    mask = torch.zeros_like(group_scores).scatter_(1, group_idx, 1).bool()
    mask = mask[:, :, None].expand(-1, -1, c.n_routed_experts // c.n_group).reshape(-1, c.n_routed_experts)
    ref_experts = choice.masked_fill(~mask, 0.0).topk(c.top_k, dim=-1, sorted=False)[1]
    ref_weights = s.gather(1, ref_experts)
    ref_weights = ref_weights / (ref_weights.sum(-1, keepdim=True) + 1e-20) * c.routed_scaling_factor
    order, ref_order = experts.sort(-1), ref_experts.sort(-1)
    same = torch.equal(order[0], ref_order[0])
    w_diff = (weights.gather(1, order[1]) - ref_weights.gather(1, ref_order[1])).abs().max().item()
    check("router vs transformers' formula", same and w_diff < 1e-6,
          f"the same experts for {x.shape[0]} rows, weights within {w_diff:.1e}" if same else "experts differ")


if __name__ == "__main__":
    sys.exit(main(__doc__, Config, DeepSeekTiny, save_checkpoint, load_checkpoint, selftest_file="tiny-deepseek",
                  extra_checks=("router", router_checks), writes="a Hugging Face directory"))
