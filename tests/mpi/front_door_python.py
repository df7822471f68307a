"""The Python client against a running moed (tests/mpi/test_front_door.sh).

    MOED_SOCKET=... front_door_python.py batching|faults
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "client", "python"))
from moed_client import Client, MoedError  # noqa: E402

try:
    import torch
except ImportError:
    torch = None


def ok(what):
    print("ok:", what)


def fail(what):
    print("FAIL:", what, file=sys.stderr)
    sys.exit(1)


def refused(call, words, status=None):
    try:
        call()
    except MoedError as e:
        if words not in str(e) or (status and e.status != status):
            fail(f"refusal without '{words}' (status {status}): {e} ({e.status})")
        return str(e)
    fail(f"not refused: expected '{words}'")


c = Client(os.environ["MOED_SOCKET"], slots=4, max_rows=64)
H = c.hidden
rng = np.random.default_rng(3)


def rows(n):
    return rng.standard_normal((n, H)).astype(np.float32)


if sys.argv[1] == "batching":
    x = rows(24)
    ids, pos = np.arange(24) // 6, np.arange(24) % 6
    whole = c.forward(1, x, ids, pos)
    one_by_one = np.concatenate([c.forward(1, x[i:i + 1], ids[i:i + 1], pos[i:i + 1]) for i in range(24)])
    if not np.array_equal(whole.view(np.uint32), one_by_one.view(np.uint32)):
        fail("rows served one at a time differ from the same rows served together")
    ok("24 rows together and one at a time: the same bits")
    a, b = c.submit(0, x[:10], ids[:10], pos[:10]), c.submit(2, x[10:], ids[10:], pos[10:])
    yb, ya = c.wait(b), c.wait(a)
    if not (np.array_equal(ya, c.forward(0, x[:10], ids[:10], pos[:10]))
            and np.array_equal(yb, c.forward(2, x[10:], ids[10:], pos[10:]))):
        fail("two submits in flight differ from the same submits one after the other")
    ok("two submits in flight at two layers")
    staged = c.stage(3)
    staged.rows[...] = x[:3]
    staged.request_ids[...] = ids[:3]
    staged.positions[...] = pos[:3]
    view = c.wait(c.submit_staged(staged, 1), copy=False)
    if not np.array_equal(view, whole[:3]):
        fail("a staged (zero-copy) submit differs")
    ok("zero-copy staging")
    if c.reconnects != 0:
        fail(f"{c.reconnects} reconnects with the daemon up all along")
    if torch is not None:
        t = c.forward(1, torch.from_numpy(x), ids, pos)
        if not (isinstance(t, torch.Tensor) and np.array_equal(t.numpy(), whole)):
            fail("torch float32 differs from numpy")
        xb = torch.from_numpy(x).to(torch.bfloat16)
        yb = c.forward(1, xb, ids, pos)
        want = torch.from_numpy(c.forward(1, xb.float().numpy(), ids, pos)).to(torch.bfloat16)
        if yb.dtype != torch.bfloat16 or not torch.equal(yb, want):
            fail("bf16 rows: not the fp32 layer of the widened rows, rounded to bf16")
        ok("torch float32 and bfloat16 tensors")
elif sys.argv[1] == "faults":
    x = rows(8)
    ids, pos = np.zeros(8, np.uint64), np.arange(8)
    refused(lambda: c.forward(0, rows(8)[:, :-1], ids, pos), f"expected [n, {H}]")
    refused(lambda: c.forward(0, x.astype(np.float64), ids, pos), "send float32")
    refused(lambda: c.forward(0, x, ids[:3], pos), "must hold 8 values")
    refused(lambda: c.forward(c.layers, x, ids, pos), f"layer {c.layers} is out of range", "bad_request")
    refused(lambda: c.forward(0, rows(c.max_rows + 1), np.zeros(c.max_rows + 1), np.zeros(c.max_rows + 1)),
            "rows: a submit holds 1 to")
    ok("wrong shape, dtype, lengths, layer and size are refused with the reason")
    alone = c.forward(1, x, ids, pos)
    bad = rows(4)
    bad[2, 5] = np.inf
    h_good, h_bad = c.submit(1, x, ids, pos), c.submit(1, bad, np.ones(4), np.arange(4))
    message = refused(lambda: c.wait(h_bad), "row 2 holds Inf at column 5", "not_finite")
    if not np.array_equal(c.wait(h_good), alone):
        fail("a bad row in flight beside good ones changed their outputs")
    ok(f"a row with Inf is refused ({message}) and its neighbours keep their bits")
    if not np.array_equal(c.forward(1, x, ids, pos), alone):
        fail("the client is not served after its refusals")
    ok("the client is served after its refusals")
