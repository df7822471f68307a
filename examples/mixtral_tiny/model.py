#!/usr/bin/python3
"""A tiny Mixtral-shaped decoder-only language model (PyTorch, CPU, float32).

The decoder runs attention itself and hands each layer's MoE block to a
*backend*: `TorchMoe` computes it here with the torch reference, while an
external server (moed) can be plugged in through the same two calls:

    handle = backend.submit(layer, h, request_ids, positions)   # h: [n, H]
    out = backend.wait(handle)       # h + moe(post_attention_layernorm(h))

`generate` splits the batch into micro-batches (two by default) and pipelines
them so that two MoE requests are in flight at once. Weights are saved in one
safetensors file with Mixtral's tensor names; the model shape is stored as
string entries of the header's `__metadata__`.

Usage:
    model.py write-checkpoint OUT.safetensors [--layers 4 --hidden 64 ...]
    model.py generate --checkpoint FILE --backend torch [--prompts 1,2,3 4,5]
    model.py selftest
"""
import argparse
import dataclasses
import json
import math
import os
import struct
import sys
import tempfile
from dataclasses import dataclass
from typing import List, Optional

import numpy as np
import torch
from torch import nn


@dataclass
class Config:
    vocab: int = 512
    hidden: int = 64
    ffn: int = 128
    n_experts: int = 8
    top_k: int = 2
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: int = 2
    head_dim: int = 16
    max_seq: int = 64
    rope_theta: float = 10000.0
    eps: float = 1e-5


class RMSNorm(nn.Module):
    """x * rsqrt(mean(x^2) + eps) * weight, in float32."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        x = x.float()
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class RowLinear(nn.Linear):
    """A bias-free linear layer whose every output row depends only on its input row.

    BLAS gemm picks its kernels by the number of rows, so a row's result may differ in
    the last bit with the batch around it. Multiplying and summing each row on its own
    makes the model batch-invariant: micro-batching cannot change a single bit."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__(in_features, out_features, bias=False)

    def forward(self, x):
        return (x[:, None, :] * self.weight).sum(-1)


class KVCache:
    """Keys and values of one sequence, per layer: [n_kv_heads, T, head_dim]."""

    def __init__(self, cfg: Config):
        empty = torch.zeros(cfg.n_kv_heads, 0, cfg.head_dim)
        self.k = [empty] * cfg.n_layers
        self.v = [empty] * cfg.n_layers

    def append(self, layer: int, k, v):
        """Appends this step's keys/values and returns the whole cache of `layer`."""
        self.k[layer] = torch.cat([self.k[layer], k], dim=1)
        self.v[layer] = torch.cat([self.v[layer], v], dim=1)
        return self.k[layer], self.v[layer]


@dataclass
class Segment:
    """`n` consecutive rows of one sequence, starting at position `start`.
    With `cache=None` the rows are the whole sequence and nothing is kept."""
    cache: Optional[KVCache]
    start: int
    n: int


@dataclass
class MicroBatch:
    """The rows one forward pass carries through the decoder."""
    tokens: torch.Tensor       # int64 [n]: rows of all segments, back to back
    segments: List[Segment]
    request_ids: torch.Tensor  # int64 [n]
    positions: torch.Tensor    # int64 [n]


def make_micro_batch(ids, token_lists, starts, caches) -> MicroBatch:
    """Packs the next tokens of several sequences into the rows of one micro-batch."""
    segments = [Segment(c, s, len(t)) for t, s, c in zip(token_lists, starts, caches)]
    return MicroBatch(
        tokens=torch.tensor([tok for t in token_lists for tok in t], dtype=torch.int64),
        segments=segments,
        request_ids=torch.tensor([i for i, t in zip(ids, token_lists) for _ in t], dtype=torch.int64),
        positions=torch.cat([torch.arange(g.start, g.start + g.n) for g in segments]))


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


class Attention(nn.Module):
    """Causal grouped-query attention with RoPE (Hugging Face's rotate-half layout)."""

    def __init__(self, cfg: Config, layer: int):
        super().__init__()
        self.cfg, self.layer = cfg, layer
        self.q_proj = RowLinear(cfg.hidden, cfg.n_heads * cfg.head_dim)
        self.k_proj = RowLinear(cfg.hidden, cfg.n_kv_heads * cfg.head_dim)
        self.v_proj = RowLinear(cfg.hidden, cfg.n_kv_heads * cfg.head_dim)
        self.o_proj = RowLinear(cfg.n_heads * cfg.head_dim, cfg.hidden)

    def forward(self, x, segments: List[Segment], cos, sin):
        c, n = self.cfg, x.shape[0]
        q = self.q_proj(x).view(n, c.n_heads, c.head_dim).transpose(0, 1)
        k = self.k_proj(x).view(n, c.n_kv_heads, c.head_dim).transpose(0, 1)
        v = self.v_proj(x).view(n, c.n_kv_heads, c.head_dim).transpose(0, 1)
        outs, row = [], 0
        for seg in segments:
            rows = slice(row, row + seg.n)
            row += seg.n
            pos = torch.arange(seg.start, seg.start + seg.n)
            qs = q[:, rows] * cos[pos] + rotate_half(q[:, rows]) * sin[pos]
            ks = k[:, rows] * cos[pos] + rotate_half(k[:, rows]) * sin[pos]
            vs = v[:, rows]
            if seg.cache is None:
                assert seg.start == 0, "a segment without cache must start at position 0"
            else:
                ks, vs = seg.cache.append(self.layer, ks, vs)
            group = c.n_heads // c.n_kv_heads  # query head j reads kv head j // group
            ks, vs = ks.repeat_interleave(group, 0), vs.repeat_interleave(group, 0)
            scores = qs @ ks.transpose(1, 2) / math.sqrt(c.head_dim)
            future = torch.arange(ks.shape[1])[None, :] > pos[:, None]
            probs = torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1)
            outs.append((probs @ vs).transpose(0, 1).reshape(seg.n, -1))
        return self.o_proj(torch.cat(outs))


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
        probs = torch.softmax(self.gate(xn).float(), dim=-1)
        probs, experts = torch.sort(probs, dim=-1, descending=True, stable=True)
        weights = probs[:, :self.top_k]
        return experts[:, :self.top_k], weights / weights.sum(-1, keepdim=True)

    def forward(self, xn):
        experts, weights = self.route(xn)
        out = torch.zeros_like(xn)
        for e, expert in enumerate(self.experts):
            rows, slot = torch.nonzero(experts == e, as_tuple=True)
            if len(rows):
                out[rows] += weights[rows, slot, None] * expert(xn[rows])
        return out


class DecoderLayer(nn.Module):
    def __init__(self, cfg: Config, layer: int):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden, cfg.eps)
        self.self_attn = Attention(cfg, layer)
        self.post_attention_layernorm = RMSNorm(cfg.hidden, cfg.eps)
        self.block_sparse_moe = MoeBlock(cfg)

    def attend(self, x, segments, cos, sin):
        """The first half of the layer: x + attn(input_layernorm(x))."""
        return x + self.self_attn(self.input_layernorm(x), segments, cos, sin)

    def moe(self, h):
        """The second half, what a MoE backend computes: h + moe(post_attention_layernorm(h))."""
        return h + self.block_sparse_moe(self.post_attention_layernorm(h))


class MixtralTiny(nn.Module):
    """Parameter names follow Mixtral's, so `state_dict()` is the checkpoint."""

    def __init__(self, cfg: Config, seed: int = 1):
        super().__init__()
        self.cfg = cfg
        self.model = nn.Module()
        self.model.embed_tokens = nn.Embedding(cfg.vocab, cfg.hidden)
        self.model.layers = nn.ModuleList(DecoderLayer(cfg, l) for l in range(cfg.n_layers))
        self.model.norm = RMSNorm(cfg.hidden, cfg.eps)
        self.lm_head = RowLinear(cfg.hidden, cfg.vocab)
        inv_freq = cfg.rope_theta ** (-torch.arange(0, cfg.head_dim, 2).double() / cfg.head_dim)
        angles = torch.outer(torch.arange(cfg.max_seq).double(), inv_freq).repeat(1, 2)
        self.cos, self.sin = angles.cos().float(), angles.sin().float()  # [max_seq, head_dim]
        self._init_weights(seed)
        self.requires_grad_(False)

    @torch.no_grad()
    def _init_weights(self, seed: int):
        """Norm weights ~1 + 0.1 N(0,1); embeddings N(0,1); every matrix (the router
        gate included) N(0,1)/sqrt(fan_in), which keeps activations and router logits O(1)."""
        g = torch.Generator().manual_seed(seed)
        for name, p in self.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if p.dim() == 1:
                p.copy_(1.0 + 0.1 * noise)
            elif name == "model.embed_tokens.weight":
                p.copy_(noise)
            else:
                p.copy_(noise / math.sqrt(p.shape[1]))


class TorchMoe:
    """MoE backend computing the torch reference eagerly; the handle is the result."""

    def __init__(self, model: MixtralTiny):
        self.layers = model.model.layers

    def submit(self, layer: int, h, request_ids, positions):
        return self.layers[layer].moe(h)

    def wait(self, handle):
        return handle


def forward_micro_batches(model: MixtralTiny, mbs: List[MicroBatch], backend) -> List[torch.Tensor]:
    """Runs the decoder over the micro-batches and returns each one's logits [n, V].

    Pipelined: micro-batch i waits for its MoE of layer l-1, runs its attention of
    layer l and submits that MoE while the other micro-batch's MoE is in flight."""
    xs = [model.model.embed_tokens(mb.tokens) for mb in mbs]
    handles = [None] * len(mbs)
    for l, layer in enumerate(model.model.layers):
        for i, mb in enumerate(mbs):
            if handles[i] is not None:
                xs[i] = backend.wait(handles[i])
            h = layer.attend(xs[i], mb.segments, model.cos, model.sin)
            handles[i] = backend.submit(l, h, mb.request_ids, mb.positions)
    return [model.lm_head(model.model.norm(backend.wait(hd))) for hd in handles]


def generate(model: MixtralTiny, prompts, new_tokens: int, backend, micro_batches: int = 2):
    """Greedy decoding. Each prompt is prefilled in one forward (its tokens as rows),
    then one token per sequence per step. Returns (new tokens per sequence,
    logits [B, V] per step: the logits each step's tokens were chosen from)."""
    assert all(prompts), "empty prompt"
    assert max(map(len, prompts)) + new_tokens <= model.cfg.max_seq, "sequence too long"
    batch = len(prompts)
    caches = [KVCache(model.cfg) for _ in range(batch)]
    groups = [g.tolist() for g in torch.arange(batch).tensor_split(micro_batches) if len(g)]
    feed, starts = [list(p) for p in prompts], [0] * batch
    generated, step_logits = [[] for _ in range(batch)], []
    for _ in range(new_tokens):
        mbs = [make_micro_batch(g, [feed[b] for b in g], [starts[b] for b in g],
                                [caches[b] for b in g]) for g in groups]
        logits = torch.empty(batch, model.cfg.vocab)
        for g, mb, out in zip(groups, mbs, forward_micro_batches(model, mbs, backend)):
            last_rows = torch.tensor([s.n for s in mb.segments]).cumsum(0) - 1
            logits[g] = out[last_rows]
        step_logits.append(logits)
        for b, tok in enumerate(logits.argmax(-1).tolist()):  # argmax: first maximum
            starts[b] += len(feed[b])
            feed[b] = [tok]
            generated[b].append(tok)
    return generated, step_logits


def full_logits(model: MixtralTiny, tokens) -> torch.Tensor:
    """Logits [len, V] of a whole sequence recomputed from scratch, without KV cache."""
    mb = make_micro_batch([0], [tokens], [0], [None])
    return forward_micro_batches(model, [mb], TorchMoe(model))[0]


def save_checkpoint(model: MixtralTiny, path: str):
    """Writes one safetensors file: u64 header length, JSON header, raw F32 data."""
    tensors = model.state_dict()
    header, offset = {}, 0
    for name, t in tensors.items():
        size = t.numel() * 4
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [offset, offset + size]}
        offset += size
    header["__metadata__"] = {"format": "pt", **{k: str(v) for k, v in
                                                  dataclasses.asdict(model.cfg).items()}}
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for t in tensors.values():
            f.write(t.contiguous().numpy().astype("<f4").tobytes())


def load_checkpoint(path: str) -> MixtralTiny:
    """Reads a file written by `save_checkpoint` back into a model."""
    with open(path, "rb") as f:
        data = f.read()
    (header_len,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + header_len])
    meta = header.pop("__metadata__")
    cfg = Config(**{f.name: type(f.default)(meta[f.name]) for f in dataclasses.fields(Config)})
    model = MixtralTiny(cfg)
    state = model.state_dict()
    assert set(header) == set(state), "tensor names differ from the model's"
    base = 8 + header_len
    for name, info in header.items():
        begin, end = info["data_offsets"]
        assert info["dtype"] == "F32" and info["shape"] == list(state[name].shape), name
        assert end - begin == 4 * state[name].numel(), name
        arr = np.frombuffer(data, dtype="<f4", count=(end - begin) // 4, offset=base + begin)
        state[name].copy_(torch.from_numpy(arr.copy()).view(info["shape"]))
    return model


BACKENDS = {"torch": TorchMoe}
DEFAULT_PROMPTS = [[1, 2, 3, 4, 5], [100, 200], [7, 7, 7, 300, 42, 9, 11], [511], [64, 128, 256]]


def selftest(seed: int) -> bool:
    model = MixtralTiny(Config(), seed=seed)
    ok = True

    def check(name, passed, detail):
        nonlocal ok
        ok &= passed
        print(f"[{'PASS' if passed else 'FAIL'}] {name}: {detail}")

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "tiny.safetensors")
        save_checkpoint(model, path)
        loaded = load_checkpoint(path)
    a, b = model.state_dict(), loaded.state_dict()
    same = loaded.cfg == model.cfg and a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    check("checkpoint round trip", same, f"{len(a)} tensors, config {loaded.cfg == model.cfg}")

    new = 16
    tokens, logits = generate(model, DEFAULT_PROMPTS, new, TorchMoe(model), micro_batches=2)
    worst = 0.0
    for b, prompt in enumerate(DEFAULT_PROMPTS):
        full = full_logits(model, prompt + tokens[b][:-1])[len(prompt) - 1:]
        step = torch.stack([lg[b] for lg in logits])
        worst = max(worst, (full - step).abs().max().item())
    check("KV cache vs full recompute", worst <= 1e-5, f"max |diff| = {worst:.3g} over {new} steps")

    tokens1, logits1 = generate(model, DEFAULT_PROMPTS, new, TorchMoe(model), micro_batches=1)
    same = tokens1 == tokens and all(torch.equal(x, y) for x, y in zip(logits, logits1))
    check("2 micro-batches vs 1", same, "tokens and logits bitwise equal" if same else "differ")

    distinct = len({t for seq in tokens for t in seq})
    check("varied output", distinct > len(DEFAULT_PROMPTS), f"{distinct} distinct tokens")
    for b, seq in enumerate(tokens):
        print(f"  seq {b}: {seq}")
    return ok


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("write-checkpoint", help="write a seeded random model")
    w.add_argument("out")
    for flag, field in [("--layers", "n_layers"), ("--hidden", "hidden"), ("--ffn", "ffn"),
                        ("--experts", "n_experts"), ("--top-k", "top_k"), ("--vocab", "vocab"),
                        ("--max-seq", "max_seq")]:
        w.add_argument(flag, dest=field, type=int, default=getattr(Config, field))
    w.add_argument("--seed", type=int, default=1)
    g = sub.add_parser("generate", help="greedy decoding from a checkpoint")
    g.add_argument("--checkpoint", required=True)
    g.add_argument("--backend", choices=sorted(BACKENDS), default="torch")
    g.add_argument("--prompts", nargs="+", metavar="T1,T2,...",
                   help="comma-separated token ids, one argument per sequence")
    g.add_argument("--new-tokens", type=int, default=16)
    g.add_argument("--micro-batches", type=int, default=2)
    s = sub.add_parser("selftest", help="checkpoint, KV cache and ping-pong checks")
    s.add_argument("--seed", type=int, default=1)
    args = p.parse_args(argv)

    if args.cmd == "write-checkpoint":
        fields = {f.name for f in dataclasses.fields(Config)}
        cfg = Config(**{k: v for k, v in vars(args).items() if k in fields})
        save_checkpoint(MixtralTiny(cfg, seed=args.seed), args.out)
        print(f"wrote {args.out}: {cfg}")
    elif args.cmd == "generate":
        model = load_checkpoint(args.checkpoint)
        prompts = ([[int(t) for t in s.split(",")] for s in args.prompts]
                   if args.prompts else DEFAULT_PROMPTS)
        tokens, _ = generate(model, prompts, args.new_tokens, BACKENDS[args.backend](model),
                             args.micro_batches)
        for b, seq in enumerate(tokens):
            print(f"seq {b}: {' '.join(map(str, seq))}")
    else:
        return 0 if selftest(args.seed) else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
