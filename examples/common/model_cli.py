"""The command line of every example's model.py:

    model.py write-checkpoint OUT [shape flags] [--seed 1]
    model.py generate --checkpoint PATH [--prompts 1,2,3 4,5] [--new-tokens 16] [--micro-batches 2]
    model.py selftest [--seed 1]

A model.py ends with `sys.exit(main(__doc__, Config, Model, save_checkpoint,
load_checkpoint, ...))` and keeps only what is its family's own: the model,
its checkpoint, the checks its selftest adds.
"""
import argparse
from typing import Callable, Optional, Sequence, Tuple

import torch

from tiny_lm import DEFAULT_PROMPTS, TorchMoe, generate, selftest_checks


def main(doc: str, config: type, model: Callable, save_checkpoint: Callable, load_checkpoint: Callable, *,
         selftest_file: str, extra_checks: Optional[Tuple[str, Callable]] = None, writes: Optional[str] = None,
         shape_flags: Sequence[Tuple[str, str]] = (), backends: Optional[dict] = None, argv=None) -> int:
    """Runs one command; returns the exit code.

    config: the family's Config (a dataclass); model(cfg, seed=...) builds the
    model; save_checkpoint(model, path) and load_checkpoint(path) write and read
    a checkpoint. selftest_file: the checkpoint's name in the selftest's round
    trip. extra_checks: (what they check, `checks(model, seed, check)`), run after
    the common ones. writes: what write-checkpoint writes, for its help (a Hugging
    Face directory). shape_flags: (flag, Config field) pairs write-checkpoint takes
    (integers; the Config's defaults otherwise). backends: {name: backend class}
    for generate's --backend (none: MoE blocks in torch)."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("write-checkpoint", help="write a seeded random model" + (f" as {writes}" if writes else ""))
    w.add_argument("out")
    for flag, field in shape_flags:
        w.add_argument(flag, dest=field, type=int, default=getattr(config, field))
    w.add_argument("--seed", type=int, default=1)
    g = sub.add_parser("generate",
                       help="greedy decoding from a checkpoint" + ("" if backends else ", MoE blocks in torch"))
    g.add_argument("--checkpoint", required=True)
    if backends:
        g.add_argument("--backend", choices=sorted(backends), default="torch")
    g.add_argument("--prompts", nargs="+", metavar="T1,T2,...",
                   help="comma-separated token ids, one argument per sequence")
    g.add_argument("--new-tokens", type=int, default=16)
    g.add_argument("--micro-batches", type=int, default=2)
    checks = "checkpoint, KV cache" + (f", ping-pong and {extra_checks[0]} checks" if extra_checks
                                      else " and ping-pong checks")
    s = sub.add_parser("selftest", help=checks)
    s.add_argument("--seed", type=int, default=1)
    args = p.parse_args(argv)
    torch.set_grad_enabled(False)

    if args.cmd == "write-checkpoint":
        cfg = config(**{field: getattr(args, field) for _, field in shape_flags})
        save_checkpoint(model(cfg, seed=args.seed), args.out)
        print(f"wrote {args.out}: {cfg}")
    elif args.cmd == "generate":
        m = load_checkpoint(args.checkpoint)
        prompts = ([[int(t) for t in s.split(",")] for s in args.prompts]
                   if args.prompts else DEFAULT_PROMPTS)
        backend = (backends[args.backend] if backends else TorchMoe)(m)
        tokens, _ = generate(m, prompts, args.new_tokens, backend, args.micro_batches)
        for b, seq in enumerate(tokens):
            print(f"seq {b}: {' '.join(map(str, seq))}")
    else:
        extra = (lambda m, check: extra_checks[1](m, args.seed, check)) if extra_checks else None
        return 0 if selftest_checks(model(config(), seed=args.seed), save_checkpoint, load_checkpoint,
                                    selftest_file, extra) else 1
    return 0
