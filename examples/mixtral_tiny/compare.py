#!/usr/bin/python3
"""Generates with the tiny Mixtral twice: its MoE blocks on moed (through the
front door, two micro-batches in flight, clients on every rank) and in torch.
The tokens must be the same and the logits agree within a tolerance.

    compare.py --checkpoint FILE --sockets DIR --ranks 4 [--new-tokens 24]
"""
import argparse
import sys
import time

import torch

from model import DEFAULT_PROMPTS, TorchMoe, generate, load_checkpoint
from moed_backend import MoedMoe

# moed and torch sum in different orders (moed: one fma chain per output and
# an exact fixed-point combine; torch: its own reductions), so logits differ
# in the last bits of fp32; 1e-4 leaves room for 4 layers of that.
LOGIT_TOLERANCE = 1e-4


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--sockets", required=True, help="moed's [ingress].dir")
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--new-tokens", type=int, default=24)
    args = p.parse_args()

    model = load_checkpoint(args.checkpoint)
    torch.set_grad_enabled(False)
    moed = MoedMoe(args.sockets, args.ranks)
    start = time.monotonic()
    tokens_moed, logits_moed = generate(model, DEFAULT_PROMPTS, args.new_tokens, moed, micro_batches=2)
    seconds = time.monotonic() - start
    moed.close()
    tokens_torch, logits_torch = generate(model, DEFAULT_PROMPTS, args.new_tokens, TorchMoe(model), micro_batches=2)

    for b, (prompt, seq) in enumerate(zip(DEFAULT_PROMPTS, tokens_moed)):
        print(f"sequence {b}: prompt {prompt} -> {' '.join(map(str, seq))}")
    diff = max(float((a - b).abs().max()) for a, b in zip(logits_moed, logits_torch))
    steps = len(logits_moed)
    print(f"{len(DEFAULT_PROMPTS)} sequences x {steps} tokens through moed on {args.ranks} ranks in {seconds:.2f} s "
          f"(2 micro-batches in flight, MoE blocks on moed, attention in torch)")
    same = tokens_moed == tokens_torch
    print(f"tokens: {'the same as' if same else 'DIFFERENT from'} the model with its MoE blocks in torch")
    print(f"logits: max |moed - torch| = {diff:.2e} (tolerance {LOGIT_TOLERANCE:.0e})")
    return 0 if same and diff <= LOGIT_TOLERANCE else 1


if __name__ == "__main__":
    sys.exit(main())
