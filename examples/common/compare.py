#!/usr/bin/python3
"""Generates with a tiny example model twice: its MoE blocks on moed (through
the front door, two micro-batches in flight, clients on every rank) and in
torch; a model's dense layers run in torch both times. The greedy tokens must
be the same, the logits agree within a tolerance, and so must moed's MoE
outputs with the torch reference run on the very rows moed was given.

    compare.py --example DIR --checkpoint PATH --sockets DIR --ranks 4 [--new-tokens 24]

DIR is the example's folder: its model.py gives `load_checkpoint(PATH)` and
may give `compare_notes(model, records)`, lines about the routing on the rows
moed served (records: (layer, h, output) of every MoE call), e.g. what
DeepSeek-V3's correction bias changed or how often gpt-oss's limit clamped.
"""
import argparse
import importlib.util
import os
import sys
import time

import torch

from moed_backend import MoedMoe
from tiny_lm import DEFAULT_PROMPTS, TorchMoe, generate


class Recording:
    """A backend that passes everything to another and keeps (layer, h, output)."""

    def __init__(self, inner):
        self.inner, self.records = inner, []

    def submit(self, layer, h, request_ids, positions):
        return layer, h, self.inner.submit(layer, h, request_ids, positions)

    def wait(self, handle):
        layer, h, inner = handle
        out = self.inner.wait(inner)
        self.records.append((layer, h, out))
        return out


# moed and torch sum in different orders (moed: one fma chain per output and an
# exact fixed-point combine; torch: its own reductions), so outputs differ in the
# last bits of fp32. The logits: 1e-4 leaves room for 4 layers of that (with
# DeepSeek-V3's scaling by 2.5 and shared expert, gpt-oss's activations of up to
# (up + 1) * 7). One layer's MoE outputs on the same rows: rounding alone.
LOGIT_TOLERANCE = 1e-4
MOE_TOLERANCE = 1e-5


def load_example(directory):
    """The example's model.py as a module."""
    spec = importlib.util.spec_from_file_location("model", os.path.join(directory, "model.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv=None):
    """Returns the exit code: 0 if the tokens are the same and both differences within tolerance."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--example", required=True, help="the example's folder (its model.py)")
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--sockets", required=True, help="moed's [ingress].dir")
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--key-file", help="through the ranks' network doors (moed-ingress-RANK.ucx), with this key")
    p.add_argument("--new-tokens", type=int, default=24)
    args = p.parse_args(argv)
    example = load_example(args.example)
    notes = getattr(example, "compare_notes", None)

    model = example.load_checkpoint(args.checkpoint)
    torch.set_grad_enabled(False)
    moed = Recording(MoedMoe(args.sockets, args.ranks, key_file=args.key_file))
    start = time.monotonic()
    tokens_moed, logits_moed = generate(model, DEFAULT_PROMPTS, args.new_tokens, moed, micro_batches=2)
    seconds = time.monotonic() - start
    moed.inner.close()
    tokens_torch, logits_torch = generate(model, DEFAULT_PROMPTS, args.new_tokens, TorchMoe(model), micro_batches=2)

    for b, (prompt, seq) in enumerate(zip(DEFAULT_PROMPTS, tokens_moed)):
        print(f"sequence {b}: prompt {prompt} -> {' '.join(map(str, seq))}")
    steps = len(logits_moed)
    layers = model.moe_layers()
    dense = [l for l in range(len(model.model.layers)) if l not in layers]
    door = f" (network door: {moed.inner.clients[0].address})" if args.key_file else ""
    print(f"{len(DEFAULT_PROMPTS)} sequences x {steps} tokens through moed on {args.ranks} ranks{door} in {seconds:.2f} s "
          f"(2 micro-batches in flight, MoE blocks on moed, attention in torch)")
    print(f"layers on moed: {', '.join(map(str, layers))}" +
          (f"; dense layers in torch: {', '.join(map(str, dense))}" if dense else ""))

    # The same rows through the torch reference: moed's MoE outputs alone, no drift.
    moe_diff, moe_scale, rows = 0.0, 0.0, 0
    for layer, h, out in moed.records:
        ref = model.model.layers[layer].moe(h)
        moe_diff = max(moe_diff, float((out - ref).abs().max()))
        moe_scale = max(moe_scale, float((ref - h).abs().max()))
        rows += h.shape[0]
    for line in (notes(model, moed.records) if notes else []):
        print(line)

    same = tokens_moed == tokens_torch
    diff = max(float((a - b).abs().max()) for a, b in zip(logits_moed, logits_torch))
    print(f"tokens: {'the same as' if same else 'DIFFERENT from'} the model with its MoE blocks in torch")
    print(f"MoE outputs: max |moed - torch| = {moe_diff:.2e} on the same {rows} rows (tolerance {MOE_TOLERANCE:.0e}; "
          f"largest |MoE(x)| {moe_scale:.3g})")
    print(f"logits: max |moed - torch| = {diff:.2e} (tolerance {LOGIT_TOLERANCE:.0e})")
    return 0 if same and diff <= LOGIT_TOLERANCE and moe_diff <= MOE_TOLERANCE else 1


if __name__ == "__main__":
    sys.exit(main())
