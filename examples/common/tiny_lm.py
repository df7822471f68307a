"""What the tiny example models share (PyTorch, CPU, float32): the decoder
around the MoE blocks, greedy generation with two micro-batches in flight,
and safetensors / Hugging Face checkpoint files.

A model (examples/*/model.py) is a `TinyLM` whose layers are `DecoderLayer`s:
the layer runs attention itself and its second half,

    h + ffn(post_attention_layernorm(h))

either in torch (a dense layer, `is_moe` false: the model runs it) or through
a *backend* (a MoE layer), in two calls that an external server (moed) can
answer as well as the torch reference `TorchMoe` does:

    handle = backend.submit(layer, h, request_ids, positions)   # h: [n, H]
    out = backend.wait(handle)       # h + moe(post_attention_layernorm(h))

`layer` is the model's own layer number. `generate` splits the batch into
micro-batches (two by default) and pipelines them so that two MoE requests
are in flight at once.

A family's Config is a `DecoderConfig` (the decoder's shape) with its MoE
fields added; `mix_experts` sums the chosen experts' outputs, and
`selftest_checks` is what every example's `selftest` checks
(examples/common/model_cli.py: the command line of every model.py).
"""
import dataclasses
import json
import math
import os
import struct
import tempfile
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional

import numpy as np
import torch
from torch import nn

DEFAULT_PROMPTS = [[1, 2, 3, 4, 5], [100, 200], [7, 7, 7, 300, 42, 9, 11], [511], [64, 128, 256]]


@dataclass
class DecoderConfig:
    """Attention and embeddings: the shape every family shares. A family's Config
    adds its MoE fields (and may change a default)."""
    vocab: int = 512
    hidden: int = 64
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
        return row_linear(x, self.weight)


def row_linear(x, weight):
    """x [n, K] @ weight [N, K]^T, each row on its own (what RowLinear computes)."""
    return (x[:, None, :] * weight).sum(-1)


def row_matmul(x, w):
    """x [n, K] @ w [K, N], each row on its own (batch-invariant like RowLinear)."""
    return (x[:, :, None] * w).sum(1)


class SwiGLU(nn.Module):
    """down(silu(gate x) * up x) with Hugging Face's {gate,up,down}_proj names."""

    def __init__(self, hidden: int, ffn: int):
        super().__init__()
        self.gate_proj = RowLinear(hidden, ffn)
        self.up_proj = RowLinear(hidden, ffn)
        self.down_proj = RowLinear(ffn, hidden)

    def forward(self, x):
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


def top_k_lower_id(scores, k):
    """The k largest scores per row and their columns, ties to the lower column (as moed)."""
    values, columns = torch.sort(scores, dim=-1, descending=True, stable=True)
    return values[:, :k], columns[:, :k]


def mix_experts(x, experts, weights, n_experts: int, expert: Callable):
    """sum_i weights[:, i] * expert(experts[:, i], x): each expert runs once, on the
    rows that chose it (`expert(e, rows)`), in the order of the expert ids."""
    out = torch.zeros_like(x)
    for e in range(n_experts):
        rows, slot = torch.nonzero(experts == e, as_tuple=True)
        if len(rows):
            out[rows] += weights[rows, slot, None] * expert(e, x[rows])
    return out


class KVCache:
    """Keys and values of one sequence, per layer: [n_kv_heads, T, head_dim]."""

    def __init__(self, cfg):
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

    def __init__(self, cfg, layer: int):
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


class DecoderLayer(nn.Module):
    """input_layernorm, self_attn, post_attention_layernorm and the feed-forward block
    registered as `ffn_name` (Mixtral: block_sparse_moe; the others: mlp), so that the
    parameter names are the family's. `is_moe` false: a dense layer, run by the model."""

    def __init__(self, cfg, layer: int, ffn_name: str, ffn: nn.Module, is_moe: bool = True):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden, cfg.eps)
        self.self_attn = Attention(cfg, layer)
        self.post_attention_layernorm = RMSNorm(cfg.hidden, cfg.eps)
        self.ffn_name, self.is_moe = ffn_name, is_moe
        setattr(self, ffn_name, ffn)

    def attend(self, x, segments, cos, sin):
        """The first half of the layer: x + attn(input_layernorm(x))."""
        return x + self.self_attn(self.input_layernorm(x), segments, cos, sin)

    def moe(self, h):
        """The second half, what a MoE backend computes: h + ffn(post_attention_layernorm(h))."""
        return h + getattr(self, self.ffn_name)(self.post_attention_layernorm(h))


class TinyLM(nn.Module):
    """model.embed_tokens, model.layers, model.norm, lm_head: with the layers' own
    names, `state_dict()` holds Hugging Face's tensor names."""

    def __init__(self, cfg, layers: List[DecoderLayer]):
        super().__init__()
        self.cfg = cfg
        self.model = nn.Module()
        self.model.embed_tokens = nn.Embedding(cfg.vocab, cfg.hidden)
        self.model.layers = nn.ModuleList(layers)
        self.model.norm = RMSNorm(cfg.hidden, cfg.eps)
        self.lm_head = RowLinear(cfg.hidden, cfg.vocab)
        inv_freq = cfg.rope_theta ** (-torch.arange(0, cfg.head_dim, 2).double() / cfg.head_dim)
        angles = torch.outer(torch.arange(cfg.max_seq).double(), inv_freq).repeat(1, 2)
        self.cos, self.sin = angles.cos().float(), angles.sin().float()  # [max_seq, head_dim]

    def moe_layers(self) -> List[int]:
        return [l for l, layer in enumerate(self.model.layers) if layer.is_moe]

    @torch.no_grad()
    def init_weights(self, seed: int, special: Optional[Callable] = None):
        """Norm weights (every 1-D tensor) ~1 + 0.1 N(0,1); embeddings N(0,1); every matrix
        N(0,1)/sqrt(shape[1]) (the fan-in of a [out, in] weight and of a [E, in, out]
        fused one), which keeps activations and router logits O(1). `special(name,
        noise)` may return another value for a tensor (None: the default)."""
        g = torch.Generator().manual_seed(seed)
        for name, p in self.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            value = special(name, noise) if special else None
            if value is not None:
                p.copy_(value)
            elif p.dim() == 1:
                p.copy_(1.0 + 0.1 * noise)
            elif name == "model.embed_tokens.weight":
                p.copy_(noise)
            else:
                p.copy_(noise / math.sqrt(p.shape[1]))
        self.requires_grad_(False)


class TorchMoe:
    """MoE backend computing the torch reference eagerly; the handle is the result."""

    def __init__(self, model: TinyLM):
        self.layers = model.model.layers

    def submit(self, layer: int, h, request_ids, positions):
        assert self.layers[layer].is_moe, f"layer {layer} is dense"
        return self.layers[layer].moe(h)

    def wait(self, handle):
        return handle


def forward_micro_batches(model: TinyLM, mbs: List[MicroBatch], backend) -> List[torch.Tensor]:
    """Runs the decoder over the micro-batches and returns each one's logits [n, V].

    Pipelined: micro-batch i waits for its MoE of layer l-1, runs its attention of
    layer l and submits that MoE while the other micro-batch's MoE is in flight.
    A dense layer's feed-forward block runs here, in torch."""
    xs = [model.model.embed_tokens(mb.tokens) for mb in mbs]
    handles = [None] * len(mbs)  # (backend or None for a result at hand, handle)

    def finish(i):
        owner, handle = handles[i]
        return owner.wait(handle) if owner is not None else handle

    for l, layer in enumerate(model.model.layers):
        for i, mb in enumerate(mbs):
            if handles[i] is not None:
                xs[i] = finish(i)
            h = layer.attend(xs[i], mb.segments, model.cos, model.sin)
            if layer.is_moe:
                handles[i] = (backend, backend.submit(l, h, mb.request_ids, mb.positions))
            else:
                handles[i] = (None, layer.moe(h))
    return [model.lm_head(model.model.norm(finish(i))) for i in range(len(mbs))]


def generate(model: TinyLM, prompts, new_tokens: int, backend, micro_batches: int = 2):
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


def full_logits(model: TinyLM, tokens) -> torch.Tensor:
    """Logits [len, V] of a whole sequence recomputed from scratch, without KV cache."""
    mb = make_micro_batch([0], [tokens], [0], [None])
    return forward_micro_batches(model, [mb], TorchMoe(model))[0]


# --- checkpoints ------------------------------------------------------------

def write_safetensors(path: str, tensors: Dict[str, torch.Tensor], metadata: Optional[Dict[str, str]] = None):
    """Writes one safetensors file: u64 header length, JSON header, raw F32 data."""
    header, offset = {}, 0
    for name, t in tensors.items():
        size = t.numel() * 4
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [offset, offset + size]}
        offset += size
    header["__metadata__"] = {"format": "pt", **(metadata or {})}
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for t in tensors.values():
            f.write(t.contiguous().numpy().astype("<f4").tobytes())


def read_safetensors(path: str):
    """Reads an F32 safetensors file: ({name: tensor}, metadata)."""
    with open(path, "rb") as f:
        data = f.read()
    (header_len,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + header_len])
    meta = header.pop("__metadata__", {})
    base, tensors = 8 + header_len, {}
    for name, info in header.items():
        begin, end = info["data_offsets"]
        assert info["dtype"] == "F32", f"{path}: {name} is {info['dtype']}, not F32"
        count = (end - begin) // 4
        assert count == math.prod(info["shape"]), f"{path}: {name}: data size and shape differ"
        arr = np.frombuffer(data, dtype="<f4", count=count, offset=base + begin)
        tensors[name] = torch.from_numpy(arr.copy()).view(info["shape"])
    return tensors, meta


def load_state(model: nn.Module, tensors: Dict[str, torch.Tensor], where: str):
    """Copies the tensors into the model; names and shapes must be the model's."""
    state = model.state_dict()
    assert set(tensors) == set(state), (f"{where}: tensor names differ from the model's: "
                                        f"{sorted(set(tensors) ^ set(state))[:6]}")
    for name, t in tensors.items():
        assert list(t.shape) == list(state[name].shape), f"{where}: {name} has shape {list(t.shape)}"
        state[name].copy_(t)


# config.json's names of the config fields named otherwise here (DecoderConfig's
# and top_k, which every family has).
HF_NAMES = {"vocab": "vocab_size", "hidden": "hidden_size", "n_layers": "num_hidden_layers",
            "n_heads": "num_attention_heads", "n_kv_heads": "num_key_value_heads", "head_dim": "head_dim",
            "max_seq": "max_position_embeddings", "eps": "rms_norm_eps", "top_k": "num_experts_per_tok"}


def write_hf_checkpoint(directory: str, model: TinyLM, model_type: str, architecture: str, **fixed):
    """A Hugging Face checkpoint directory: config.json (model_type, architectures,
    the config's fields under config.json's names, the `fixed` keys, torch_dtype)
    and model.safetensors (`state_dict()`)."""
    config_json = {"model_type": model_type, "architectures": [architecture],
                   **{HF_NAMES.get(k, k): v for k, v in dataclasses.asdict(model.cfg).items()},
                   **fixed, "torch_dtype": "float32"}
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config_json, f, indent=2)
        f.write("\n")
    write_safetensors(os.path.join(directory, "model.safetensors"), model.state_dict())


def load_hf_checkpoint(directory: str, config: type, make_model: Callable, model_type: str, **fixed) -> TinyLM:
    """Reads a directory written by `write_hf_checkpoint` back into `make_model(config(...))`;
    config.json must name `model_type` and hold the `fixed` keys' values."""
    with open(os.path.join(directory, "config.json")) as f:
        js = json.load(f)
    assert js["model_type"] == model_type, f"{directory}: model_type {js['model_type']}"
    for key, value in fixed.items():
        assert js[key] == value, f"{directory}: {key} {js[key]}; only {value} here"
    cfg = config(**{f.name: type(f.default)(js[HF_NAMES.get(f.name, f.name)]) for f in dataclasses.fields(config)})
    model = make_model(cfg)
    path = os.path.join(directory, "model.safetensors")
    load_state(model, read_safetensors(path)[0], path)
    return model


# --- self-test ---------------------------------------------------------------

def selftest_checks(model: TinyLM, save: Callable, load: Callable, filename: str,
                    extra: Optional[Callable] = None) -> bool:
    """The checks every example's `selftest` runs: checkpoint round trip, KV cache
    against full recompute, 2 micro-batches against 1, varied output; then
    `extra(model, check)`, the family's own. `check(name, passed, detail)`
    prints one. True if all passed."""
    ok = True

    def check(name, passed, detail):
        nonlocal ok
        ok &= passed
        print(f"[{'PASS' if passed else 'FAIL'}] {name}: {detail}")

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, filename)
        save(model, path)
        loaded = load(path)
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
    if extra:
        extra(model, check)
    return ok
