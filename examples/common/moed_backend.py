"""The MoE backend that hands each layer's MoE block to moed's ranks.

Every micro-batch's rows are split into contiguous pieces, one per rank, and
each piece goes to that rank's front door through the client library, so
every rank has a client and the ranks pool the rows of all micro-batches. A
handle holds the pieces in flight; wait() puts their outputs back together.
"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "client", "python"))
from moed_client import Client  # noqa: E402


def door_of(socket_dir, rank, key_file):
    """Rank `rank`'s front door: its socket on this host, or with a key file, the first network
    address it lists in moed-ingress-RANK.ucx (the expert hosts are elsewhere)."""
    base = os.path.join(socket_dir, f"moed-ingress-{rank}")
    if key_file is None:
        return base + ".sock"
    with open(base + ".ucx") as f:
        return f.readline().strip()


class MoedMoe:
    def __init__(self, socket_dir, ranks, max_rows=256, key_file=None):
        self.clients = [Client(door_of(socket_dir, r, key_file), slots=4, max_rows=max_rows, key_file=key_file)
                        for r in range(ranks)]

    def submit(self, layer, h, request_ids, positions):
        pieces = []
        for client, rows in zip(self.clients, torch.arange(h.shape[0]).tensor_split(len(self.clients))):
            if len(rows):
                first, last = int(rows[0]), int(rows[-1]) + 1
                pieces.append((client, client.submit(layer, h[first:last], request_ids[first:last].numpy(),
                                                     positions[first:last].numpy())))
        return pieces

    def wait(self, pieces):
        return torch.cat([client.wait(handle) for client, handle in pieces])

    def close(self):
        for c in self.clients:
            c.close()
