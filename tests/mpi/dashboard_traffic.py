"""Skewed traffic through every rank's front door (tests/mpi/test_dashboard.sh).

    dashboard_traffic.py SOCKET_DIR RANKS PHASE ROUNDS

Each round sends ROWS rows to every layer on every rank at once (a client
needs a slot per layer: the model has few). The rows are
a few fixed vectors plus a little noise, so the router sends most of them to
the same few experts: a skewed load the heatmap shows. Each PHASE draws other
vectors, so the hot experts move between phases. Prints the rows it sent per
layer.
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "client", "python"))
from moed_client import Client  # noqa: E402

ROWS = 24
sock_dir, ranks, phase, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
clients = [Client(os.path.join(sock_dir, f"moed-ingress-{r}.sock"), slots=8, max_rows=ROWS) for r in range(ranks)]
H, L = clients[0].hidden, clients[0].layers
rng = np.random.default_rng(100 + phase)
bases = rng.standard_normal((3, H)).astype(np.float32) * 4
sent = 0
for n in range(rounds):
    # Every layer on every rank at once, so that a step serves all of them.
    handles = []
    for layer in range(L):
        for r, c in enumerate(clients):
            x = bases[rng.integers(0, len(bases), ROWS)] + rng.standard_normal((ROWS, H)).astype(np.float32)
            ids = np.arange(ROWS) + 1000 * (r + 1)
            handles.append((c, c.submit(layer, x.astype(np.float32), ids, np.full(ROWS, n))))
    for c, h in handles:
        c.wait(h)
    sent += ROWS * ranks
for c in clients:
    c.close()
print(sent)
