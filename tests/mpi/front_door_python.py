"""The Python client against a running moed (tests/mpi/test_front_door.sh).

    MOED_SOCKET=... front_door_python.py batching|faults|network

batching: rows together, one at a time, in flight, staged, torch; forward()
of more rows than a submit holds (split over slots, the same bits); waits
that time out keep their handles (more timeouts than slots, each followed by
a wait that gets the answer); dropped and released handles; what Client()
asks for and is granted. faults: bad inputs refused with the reason, bad
request ids, positions and layers named with their row, bad Client()
arguments; the client is served after. network: the network door (ucx://,
with the key) and several homes (both spreads) give the Unix door's bits; a
wrong key, no key and an unknown spread are refused.
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

    # forward() of more rows than a submit holds splits them over slots (issue 33).
    for n in (300, 3 * c.max_rows + 1):
        x = rows(n)
        ids, pos = np.arange(n) // 7, np.arange(n) % 7
        whole = c.forward(2, x, ids, pos)
        one_by_one = np.concatenate([c.forward(2, x[i:i + 1], ids[i:i + 1], pos[i:i + 1]) for i in range(n)])
        if whole.shape != x.shape or not np.array_equal(whole.view(np.uint32), one_by_one.view(np.uint32)):
            fail(f"forward of {n} rows (max_rows {c.max_rows}) differs from the rows one at a time")
        ok(f"forward of {n} rows over submits of {c.max_rows}: the bits of the rows one at a time")
    if torch is not None:
        xb = torch.from_numpy(x).to(torch.bfloat16)
        yb = c.forward(2, xb, ids, pos)
        want = torch.cat([c.forward(2, xb[i:i + 1], ids[i:i + 1], pos[i:i + 1]) for i in range(n)])
        if yb.dtype != torch.bfloat16 or not torch.equal(yb.view(torch.int16), want.view(torch.int16)):
            fail(f"forward of {n} bf16 rows differs from the rows one at a time")
        ok(f"forward of {n} torch bfloat16 rows: the same")
    if c.forward(0, rows(0), [], []).shape != (0, H):
        fail("forward of no rows")

    # A wait that times out keeps its handle: the slot stays in flight, and a
    # later wait gets the answer (issue 33: each timeout lost a slot for good,
    # and after as many as the client has slots every submit failed). A wait
    # of 0 ms right after a submit times out unless the answer is already
    # there: go on until there have been 3 times as many timeouts as slots.
    x = rows(8)
    ids, pos = np.arange(8), np.arange(8)
    want = c.forward(1, x, ids, pos)
    timeouts = rounds = 0
    while timeouts < 3 * c.slots:
        rounds += 1
        if rounds > 1000:
            fail(f"only {timeouts} waits of 0 ms timed out in {rounds} submits")
        h = c.submit(1, x, ids, pos)
        try:
            y = c.wait(h, timeout_ms=0)
        except MoedError as e:
            if not e.in_flight or "timed out" not in str(e):
                fail(f"a wait of 0 ms failed otherwise than by a timeout in flight: {e} (in_flight {e.in_flight})")
            timeouts += 1
            y = c.wait(h)
        if not np.array_equal(y, want):
            fail("the answer after a timed-out wait differs")
    ok(f"{timeouts} waits of 0 ms timed out in {rounds} submits ({c.slots} slots): each handle waited again "
       "got its answer, and no slot was lost")
    # All slots in flight, each wait timing out, then every answer.
    handles = [c.submit(1, x, ids, pos) for _ in range(c.slots)]
    answers = {}
    for i, h in enumerate(handles):
        try:
            answers[i] = c.wait(h, timeout_ms=0)
        except MoedError as e:
            if not e.in_flight:
                fail(f"a wait of 0 ms with every slot in flight: {e}")
    for i, h in enumerate(handles):
        if not np.array_equal(answers[i] if i in answers else c.wait(h), want):
            fail("an answer after a timed-out wait, every slot in flight, differs")
    ok(f"all {c.slots} slots in flight, waits of 0 ms, then every answer")
    # Releasing a handle in flight is refused (the daemon may still write its
    # slot); it stays waitable. A handle waited for gives its outputs once.
    h = c.submit(1, x, ids, pos)
    refused(lambda: h.release(), "is in flight: wait() for its handle")
    if not np.array_equal(c.wait(h), want):
        fail("a handle whose release was refused")
    refused(lambda: c.wait(h), "was released")
    # Handles dropped in flight give their slots back once answered: every
    # slot in flight, dropped, three times over.
    for _ in range(3):
        handles = [c.submit(1, x, ids, pos) for _ in range(c.slots)]
        del handles
    h = c.submit(1, x, ids, pos)
    if not np.array_equal(c.wait(h), want) or not np.array_equal(c.forward(1, x, ids, pos), want):
        fail("served wrong after handles were dropped in flight")
    ok("a release in flight refused, a handle waited once, handles dropped in flight give their slots back")

    # What a client asks for and what it is granted.
    d = Client(os.environ["MOED_SOCKET"])
    if (d.slots, d.max_rows) != (4, 1024):
        fail(f"Client() is granted {d.slots} slots of {d.max_rows} rows: expected 4 of 1024 (the daemon's max_rows)")
    d.close()
    d = Client(os.environ["MOED_SOCKET"], slots=1000, max_rows=100000)
    if (d.slots, d.max_rows) != (8, 1024):
        fail(f"Client(slots=1000, max_rows=100000) is granted {d.slots} x {d.max_rows}: expected the daemon's 8 x 1024")
    y = d.forward(1, np.concatenate([x] * 200), np.tile(ids, 200), np.tile(pos, 200))
    if not np.array_equal(y[:8], want) or not np.array_equal(y[-8:], want):
        fail("1600 rows through a client of 8 slots of 1024")
    d.close()
    ok("Client() asks for 4 slots of 1024 rows; asking for more is granted the daemon's "
       "[ingress].max_slots and max_rows")
elif sys.argv[1] == "faults":
    x = rows(8)
    ids, pos = np.zeros(8, np.uint64), np.arange(8)
    refused(lambda: c.forward(0, rows(8)[:, :-1], ids, pos), f"expected [n, {H}]")
    refused(lambda: c.forward(0, x.astype(np.float64), ids, pos), "send float32")
    refused(lambda: c.forward(0, x, ids[:3], pos), "request_ids has shape (3,): expected (8,)")
    refused(lambda: c.forward(c.layers, x, ids, pos), f"layer {c.layers} is out of range", "bad_request")
    n = c.max_rows + 1
    refused(lambda: c.submit(0, rows(n), np.zeros(n, np.uint64), np.zeros(n, np.uint32)),
            f"{n} rows: a submit holds 1 to {c.max_rows} rows (forward() splits more)")
    ok("wrong shape, dtype, lengths, layer and size are refused with the reason")
    # Request ids, positions and layers are checked here, naming the value and
    # its row (issue 33: -1 went as 2^64 - 1, 0.5 as 0, layer -1 as 4294967295).
    bad_ids = np.arange(8)
    bad_ids[3] = -1
    for call in (c.forward, c.submit):
        refused(lambda: call(0, x, bad_ids, pos), "request_ids: row 3 holds -1: request ids are integers in [0, 2^64)")
    refused(lambda: c.forward(0, x, np.arange(8) + 0.5, pos), "request_ids: row 0 holds 0.5 (a float64)")
    refused(lambda: c.forward(0, x, [0] * 7 + [1 << 64], pos), f"request_ids: row 7 holds {1 << 64}")
    refused(lambda: c.forward(0, x, [1, -1] + [0] * 6, pos), "request_ids: row 1 holds -1")
    refused(lambda: c.forward(0, x, [True] * 8, pos), "request_ids: row 0 holds True (a bool)")
    refused(lambda: c.forward(0, x, ids, [0, 1 << 32] + [0] * 6),
            f"positions: row 1 holds {1 << 32}: positions are integers in [0, 2^32)")
    refused(lambda: c.forward(0, x, ids, -np.arange(8)), "positions: row 1 holds -1")
    refused(lambda: c.forward(0, x, ids, np.full(8, 2.0)), "positions: row 0 holds 2.0 (a float64)")
    refused(lambda: c.forward(-1, x, ids, pos), "layer -1: a layer is the model's own layer number, an integer >= 0")
    refused(lambda: c.forward(1.0, x, ids, pos), "layer 1.0: a layer is")
    refused(lambda: c.submit(1 << 40, x, ids, pos), f"layer {1 << 40} is out of range")
    edge = c.forward(1, x, np.full(8, (1 << 64) - 1, np.uint64), np.full(8, (1 << 32) - 1, np.uint32))
    if not np.array_equal(edge, c.forward(1, x, [(1 << 64) - 1] * 8, [(1 << 32) - 1] * 8)):
        fail("the largest request id and position as numpy and as Python ints")
    ok("request ids, positions and layers out of range or not integers are refused naming the value and row")
    path = os.environ["MOED_SOCKET"]
    refused(lambda: Client(path, max_rows=0), "max_rows = 0: ask for 1 or more rows per submit")
    refused(lambda: Client(path, max_rows=2.5), "max_rows = 2.5")
    refused(lambda: Client(path, slots=-1), "slots = -1: ask for 1 or more slots")
    refused(lambda: Client(path, slots=True), "slots = True")
    refused(lambda: Client(path, timeout_ms=1.5), "timeout_ms = 1.5")
    refused(lambda: Client(path, reconnect_ms=-1), "reconnect_ms = -1")
    refused(lambda: c.wait(c.submit(1, x, ids, pos), timeout_ms="1"), "timeout_ms = '1'")
    ok("Client() arguments that are not positive integers (or ms) are refused naming them")
    alone = c.forward(1, x, ids, pos)
    bad = rows(4)
    bad[2, 5] = np.inf
    h_good, h_bad = c.submit(1, x, ids, pos), c.submit(1, bad, np.ones(4, np.uint64), np.arange(4))
    message = refused(lambda: c.wait(h_bad), "row 2 holds Inf at column 5", "not_finite")
    if not np.array_equal(c.wait(h_good), alone):
        fail("a bad row in flight beside good ones changed their outputs")
    ok(f"a row with Inf is refused ({message}) and its neighbours keep their bits")
    if not np.array_equal(c.forward(1, x, ids, pos), alone):
        fail("the client is not served after its refusals")
    ok("the client is served after its refusals")

if sys.argv[1] == "network":
    # MOED_NETWORK: each rank's ucx:// address, comma-separated; MOED_KEY and MOED_OTHER_KEY: key files.
    homes = os.environ["MOED_NETWORK"].split(",")
    key, other = os.environ["MOED_KEY"], os.environ["MOED_OTHER_KEY"]
    x = rows(300)
    ids, pos = np.arange(300) // 7, np.arange(300) % 7
    here = c.forward(1, x, ids, pos)
    net = Client(homes[0], key_file=key, slots=4, max_rows=64)
    if not np.array_equal(net.forward(1, x, ids, pos).view(np.uint32), here.view(np.uint32)):
        fail("the network door's outputs differ from the Unix door's")
    ok(f"300 rows through {homes[0]}: the Unix door's bits")
    for spread, silence in (("round_robin", 3000), ("least_loaded", 0)):
        spread_client = Client(homes, key_file=key, slots=4, max_rows=32, spread=spread, home_silence_ms=silence)
        handles = [spread_client.submit(1, x[i:i + 30], ids[i:i + 30], pos[i:i + 30]) for i in range(0, 120, 30)]
        got = np.concatenate([spread_client.wait(h) for h in handles])
        if not np.array_equal(got.view(np.uint32), here[:120].view(np.uint32)):
            fail(f"{len(homes)} homes, {spread}: outputs differ")
        if not np.array_equal(spread_client.forward(1, x, ids, pos).view(np.uint32), here.view(np.uint32)):
            fail(f"{len(homes)} homes, {spread}: forward() differs")
        spread_client.close()
    ok(f"{len(homes)} homes, round-robin and least-loaded (home silence 3 s, and off): the same bits")
    refused(lambda: Client(homes[0], key_file=other), "does not hold the cluster's key", "forbidden")
    refused(lambda: Client(homes[0]), "needs Options::key_file")
    refused(lambda: Client(homes, key_file=key, spread="random"), "spread = 'random'")
    refused(lambda: Client(homes, key_file=key, home_silence_ms=-1), "home_silence_ms = -1")
    ok("a wrong key, no key, an unknown spread and a negative home silence are refused")
