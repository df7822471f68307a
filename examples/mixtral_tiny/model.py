#!/usr/bin/python3
"""A tiny Mixtral-shaped decoder-only language model (PyTorch, CPU, float32).

The decoder (examples/common/tiny_lm.py) runs attention itself and hands each
layer's MoE block to a *backend*: `TorchMoe` computes it here with the torch
reference, while an external server (moed) can be plugged in through the
same two calls:

    handle = backend.submit(layer, h, request_ids, positions)   # h: [n, H]
    out = backend.wait(handle)       # h + moe(post_attention_layernorm(h))

`generate` splits the batch into micro-batches (two by default) and pipelines
them so that two MoE requests are in flight at once. Weights are saved in one
safetensors file with Mixtral's tensor names; the model shape is stored as
string entries of the header's `__metadata__`.

Commands (examples/common/model_cli.py): `write-checkpoint OUT.safetensors
[--layers 4 --hidden 64 ...]` (the shape flags are this model's),
`generate --checkpoint FILE --backend torch [--prompts 1,2,3 4,5]`, `selftest`.
"""
import dataclasses
import os
import sys
from dataclasses import dataclass

import torch
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from model_cli import main  # noqa: E402
from tiny_lm import (DecoderConfig, DecoderLayer, RowLinear, TinyLM, TorchMoe, load_state,  # noqa: E402
                     mix_experts, read_safetensors, top_k_lower_id, write_safetensors)


@dataclass
class Config(DecoderConfig):
    ffn: int = 128
    n_experts: int = 8
    top_k: int = 2


# The shape's entries in the checkpoint's `__metadata__`, in the order they are written.
METADATA = ["vocab", "hidden", "ffn", "n_experts", "top_k", "n_layers", "n_heads", "n_kv_heads", "head_dim",
            "max_seq", "rope_theta", "eps"]


class Expert(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.w1 = RowLinear(cfg.hidden, cfg.ffn)
        self.w3 = RowLinear(cfg.hidden, cfg.ffn)
        self.w2 = RowLinear(cfg.ffn, cfg.hidden)

    def forward(self, x):
        return self.w2(nn.functional.silu(self.w1(x)) * self.w3(x))


class MoeBlock(nn.Module):
    """Softmax router over all experts, top-k (ties to the lower id), renormalised weights."""

    def __init__(self, cfg: Config):
        super().__init__()
        self.top_k = cfg.top_k
        self.gate = RowLinear(cfg.hidden, cfg.n_experts)
        self.experts = nn.ModuleList(Expert(cfg) for _ in range(cfg.n_experts))

    def route(self, xn):
        """Returns the chosen experts [n, k] and their weights [n, k]."""
        weights, experts = top_k_lower_id(torch.softmax(self.gate(xn).float(), dim=-1), self.top_k)
        return experts, weights / weights.sum(-1, keepdim=True)

    def forward(self, xn):
        experts, weights = self.route(xn)
        return mix_experts(xn, experts, weights, len(self.experts), lambda e, rows: self.experts[e](rows))


class MixtralTiny(TinyLM):
    """Parameter names follow Mixtral's, so `state_dict()` is the checkpoint."""

    def __init__(self, cfg: Config, seed: int = 1):
        super().__init__(cfg, [DecoderLayer(cfg, l, "block_sparse_moe", MoeBlock(cfg)) for l in range(cfg.n_layers)])
        self.init_weights(seed)


def save_checkpoint(model: MixtralTiny, path: str):
    """One safetensors file; the shape in the header's `__metadata__`."""
    write_safetensors(path, model.state_dict(), {k: str(getattr(model.cfg, k)) for k in METADATA})


def load_checkpoint(path: str) -> MixtralTiny:
    """Reads a file written by `save_checkpoint` back into a model."""
    tensors, meta = read_safetensors(path)
    cfg = Config(**{f.name: type(f.default)(meta[f.name]) for f in dataclasses.fields(Config)})
    model = MixtralTiny(cfg)
    load_state(model, tensors, path)
    return model


if __name__ == "__main__":
    sys.exit(main(__doc__, Config, MixtralTiny, save_checkpoint, load_checkpoint, selftest_file="tiny.safetensors",
                  shape_flags=[("--layers", "n_layers"), ("--hidden", "hidden"), ("--ffn", "ffn"),
                               ("--experts", "n_experts"), ("--top-k", "top_k"), ("--vocab", "vocab"),
                               ("--max-seq", "max_seq")],
                  backends={"torch": TorchMoe}))
