#!/usr/bin/python3
"""A tiny gpt-oss-shaped decoder-only language model (PyTorch, CPU, float32).

The MoE block is gpt-oss's as transformers' `gpt_oss` computes it
(`GptOssTopKRouter`, `GptOssExperts`), with x the layer's
post_attention_layernorm of h:

    l = x @ W_r^T + b_r                          mlp.router.weight [E, H], .bias [E]
    top-k of l, w = softmax over those k
    u = x @ gate_up_proj[e] + gate_up_proj_bias[e]         [E, H, 2F], [E, 2F]
    gate = u[..., ::2].clamp(max=limit), up = u[..., 1::2].clamp(-limit, limit)
    a = gate * sigmoid(1.702 * gate) * (up + 1)
    o = a @ down_proj[e] + down_proj_bias[e]                [E, F, H], [E, H]
    y = sum_i w_i o_i, layer output h + y        limit = swiglu_limit = 7

Ties go to the lower expert id (moed's rule). The expert weights are drawn
large enough that some gate and up activations pass the limit, so that the
clamp is exercised (`compare_notes` counts them for examples/common/compare.py).

Attention is plain grouped-query attention with RoPE (examples/common/tiny_lm.py),
without gpt-oss's sinks, biases and sliding window: moed serves only the MoE
blocks. The checkpoint is a Hugging Face directory: config.json (model_type
gpt_oss) and model.safetensors with gpt-oss's tensor names, experts fused per
layer, gate and up interleaved (docs/model-families.md).

Commands (examples/common/model_cli.py): `write-checkpoint OUT_DIR [--seed 1]`,
`generate --checkpoint DIR [--prompts 1,2,3 4,5]`, and `selftest`, which also
checks the whole MoE block against transformers' formula.
"""
import math
import os
import sys
from dataclasses import dataclass

import torch
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from model_cli import main  # noqa: E402
from tiny_lm import (DecoderConfig, DecoderLayer, TinyLM, load_hf_checkpoint, mix_experts, row_linear,  # noqa: E402
                     row_matmul, top_k_lower_id, write_hf_checkpoint)


@dataclass
class Config(DecoderConfig):
    # The MoE layers (config.json's names but top_k).
    top_k: int = 4
    num_local_experts: int = 16
    intermediate_size: int = 32
    swiglu_limit: float = 7.0


ALPHA = 1.702
# Standard deviations of the expert tensors, as multiples of 1/sqrt(fan-in) for
# the matrices: x has RMS ~1, so gate and up have a spread of ~3.5 and a few
# per cent pass the limit of 7; down_proj is small to keep y O(1).
SCALES = {"gate_up_proj": 3.5, "gate_up_proj_bias": 0.5, "down_proj": 0.15, "down_proj_bias": 0.1,
          "router.bias": 0.5}


class Router(nn.Module):
    """mlp.router.weight [E, H] and mlp.router.bias [E]."""

    def __init__(self, cfg: Config):
        super().__init__()
        self.top_k = cfg.top_k
        self.weight = nn.Parameter(torch.empty(cfg.num_local_experts, cfg.hidden))
        self.bias = nn.Parameter(torch.zeros(cfg.num_local_experts))

    def route(self, x):
        """The chosen experts [n, k] and their weights [n, k]: softmax over the top-k logits."""
        logits = row_linear(x, self.weight) + self.bias
        top, experts = top_k_lower_id(logits, self.top_k)
        return experts, torch.softmax(top, dim=-1)


class Experts(nn.Module):
    """mlp.experts.{gate_up_proj, gate_up_proj_bias, down_proj, down_proj_bias}, fused."""

    def __init__(self, cfg: Config):
        super().__init__()
        e, h, f = cfg.num_local_experts, cfg.hidden, cfg.intermediate_size
        self.limit = cfg.swiglu_limit
        self.gate_up_proj = nn.Parameter(torch.empty(e, h, 2 * f))
        self.gate_up_proj_bias = nn.Parameter(torch.empty(e, 2 * f))
        self.down_proj = nn.Parameter(torch.empty(e, f, h))
        self.down_proj_bias = nn.Parameter(torch.empty(e, h))

    def gate_up(self, e: int, x):
        """Expert e's gate and up activations before the clamp."""
        u = row_matmul(x, self.gate_up_proj[e]) + self.gate_up_proj_bias[e]
        return u[..., ::2], u[..., 1::2]

    def forward(self, e: int, x):
        gate, up = self.gate_up(e, x)
        gate = gate.clamp(max=self.limit)
        up = up.clamp(-self.limit, self.limit)
        a = gate * torch.sigmoid(gate * ALPHA) * (up + 1)
        return row_matmul(a, self.down_proj[e]) + self.down_proj_bias[e]


class MLPBlock(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.router = Router(cfg)
        self.experts = Experts(cfg)

    def forward(self, x):
        experts, weights = self.router.route(x)
        return mix_experts(x, experts, weights, self.experts.gate_up_proj.shape[0], self.experts)


def special_init(name: str, noise):
    for suffix, scale in SCALES.items():
        if name.endswith("mlp." + suffix) or name.endswith("experts." + suffix):
            fan_in = noise.shape[1] if suffix in ("gate_up_proj", "down_proj") else 1
            return scale * noise / math.sqrt(fan_in)
    return None


class GptOssTiny(TinyLM):
    """Parameter names follow gpt-oss's (but for attention), so `state_dict()` is the checkpoint."""

    def __init__(self, cfg: Config, seed: int = 1):
        super().__init__(cfg, [DecoderLayer(cfg, l, "mlp", MLPBlock(cfg)) for l in range(cfg.n_layers)])
        self.init_weights(seed, special_init)


def save_checkpoint(model: GptOssTiny, directory: str):
    write_hf_checkpoint(directory, model, "gpt_oss", "GptOssForCausalLM")


def load_checkpoint(directory: str) -> GptOssTiny:
    """Reads a directory written by `save_checkpoint` back into a model."""
    return load_hf_checkpoint(directory, Config, GptOssTiny, "gpt_oss")


def compare_notes(model: GptOssTiny, records):
    """For examples/common/compare.py: how many of the chosen experts' activations
    the limit clamped, on the rows moed served."""
    limit = model.cfg.swiglu_limit
    gates = ups = gate_hit = up_hit = 0
    for layer, h, _ in records:
        mlp = model.model.layers[layer].mlp
        x = model.model.layers[layer].post_attention_layernorm(h)
        experts, _ = mlp.router.route(x)
        for e in experts.unique().tolist():
            rows = (experts == e).any(-1)
            gate, up = mlp.experts.gate_up(e, x[rows])
            gates, ups = gates + gate.numel(), ups + up.numel()
            gate_hit += int((gate > limit).sum())
            up_hit += int((up.abs() > limit).sum())
    return [f"clamp: swiglu_limit {limit:g} clamped {gate_hit} of {gates} gate activations "
            f"({100 * gate_hit / gates:.1f}%) and {up_hit} up ({100 * up_hit / ups:.1f}%) of the chosen experts"]


def block_checks(model: GptOssTiny, seed: int, check):
    """selftest's own check: the block against a transcription of transformers'
    GptOssTopKRouter and GptOssExperts (plain matmuls, torch.topk, index_add_)."""
    torch.manual_seed(seed)
    mlp = model.model.layers[0].mlp
    x = torch.randn(256, model.cfg.hidden)
    r, ex, limit = mlp.router, mlp.experts, model.cfg.swiglu_limit
    top, idx = torch.topk(nn.functional.linear(x, r.weight, r.bias), model.cfg.top_k, dim=-1)
    scores = torch.zeros(x.shape[0], ex.gate_up_proj.shape[0]).scatter_(1, idx, torch.softmax(top, dim=1))
    ref = torch.zeros_like(x)
    for e in idx.unique().tolist():
        tok = (idx == e).any(-1).nonzero()[:, 0]
        gate_up = x[tok] @ ex.gate_up_proj[e] + ex.gate_up_proj_bias[e]
        gate, up = gate_up[..., ::2].clamp(min=None, max=limit), gate_up[..., 1::2].clamp(min=-limit, max=limit)
        out = ((up + 1) * (gate * torch.sigmoid(gate * ALPHA))) @ ex.down_proj[e] + ex.down_proj_bias[e]
        ref.index_add_(0, tok, out * scores[tok, e, None])
    diff = (mlp(x) - ref).abs().max().item()
    check("MoE block vs transformers' formula", diff < 1e-4 * max(1.0, ref.abs().max().item()),
          f"max |diff| = {diff:.2e} on {x.shape[0]} rows (largest |y| {ref.abs().max().item():.3g})")


if __name__ == "__main__":
    sys.exit(main(__doc__, Config, GptOssTiny, save_checkpoint, load_checkpoint, selftest_file="tiny-gpt-oss",
                  extra_checks=("MoE block", block_checks), writes="a Hugging Face directory"))
