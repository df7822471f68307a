"""Python client of moed's front door: hand one MoE layer's tokens to the moed
rank on this host and get the layer's outputs back.

    from moed_client import Client
    c = Client("/run/moed/moed-ingress-0.sock")
    y = c.forward(layer, hidden, request_ids, positions)   # hidden: [n, H]
    h = c.submit(layer, hidden, request_ids, positions)   # several in flight
    y = c.wait(h)

What a layer returns, for each row h: h + MoE(RMSNorm(h)), as in Mixtral's
decoder layer (RMSNorm with the layer's post_attention_layernorm weight, the
router, the SwiGLU experts, the gate-weighted sum and the residual add). A
row's output bits depend only on the row, the layer and the weights, not on
which other rows, clients or ranks share its step.

`hidden` is a numpy array (float32) or a CPU torch tensor (float32 or
bfloat16); the output has the same kind and dtype. Rows travel in shared
memory: submit copies them into a slot once (stage() gives views of a slot to
write into without that copy), and wait(..., copy=False) returns a view of the
slot, valid until the handle is released.

A lost connection (the daemon restarted on the same socket, e.g. by
`moed-mpirun --restart`) is mended within reconnect_ms: the client connects
again and submits again what was in flight, so wait() returns late but with
the same bits; `reconnects` counts the times. reconnect_ms=0 fails at once.
A reconnect may move the shared memory (it stays put when the daemon grants
the same slots and rows again): fill a Staged before the next submit or
wait, and use a copy=False view before the next submit or wait.

A thin ctypes layer over libmoed_client's C ABI (client/moed_client.h). The
library is found through $MOED_CLIENT_LIB, then next to this file's build
tree (build/client) or install (PREFIX/lib, for PREFIX/python), then the
system's library path.
"""

import ctypes
import ctypes.util
import os

import numpy as np

try:  # torch is optional
    import torch
except ImportError:  # pragma: no cover
    torch = None

F32, BF16 = 0, 1
STATUS = {1: "bad_request", 2: "busy", 3: "not_finite", 4: "too_many_clients",
          5: "forbidden", 6: "shutting_down", 7: "internal"}


class MoedError(RuntimeError):
    """A failure reported by the daemon (status set) or by this side."""

    def __init__(self, message, status=0):
        super().__init__(message)
        self.status = STATUS.get(status)


class _Info(ctypes.Structure):
    _fields_ = [(name, ctypes.c_int32) for name in ("rank", "ranks", "hidden", "layers", "slots", "max_rows")]


def _find_library():
    here = os.path.dirname(os.path.abspath(__file__))
    candidates = [os.environ.get("MOED_CLIENT_LIB"),
                  os.path.join(here, "..", "..", "build", "client", "libmoed_client.so"),
                  os.path.join(here, "..", "lib", "libmoed_client.so.0"),
                  ctypes.util.find_library("moed_client")]
    for c in candidates:
        if c and (os.path.exists(c) or not os.path.isabs(c)):
            try:
                return ctypes.CDLL(c)
            except OSError:
                continue
    raise MoedError("libmoed_client.so not found: build moed (ci/build.sh) or set MOED_CLIENT_LIB")


_lib = None


def _library():
    global _lib
    if _lib is None:
        lib = _find_library()
        p, i, u32, i32 = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_int32
        lib.moed_client_connect.restype = p
        lib.moed_client_connect.argtypes = [ctypes.c_char_p, u32, u32, i32, ctypes.c_char_p, ctypes.c_size_t]
        lib.moed_client_close.argtypes = [p]
        lib.moed_client_get_info.argtypes = [p, ctypes.POINTER(_Info)]
        for name in ("acquire",):
            getattr(lib, "moed_client_" + name).argtypes = [p]
        for name in ("rows", "request_ids", "positions"):
            getattr(lib, "moed_client_" + name).restype = p
            getattr(lib, "moed_client_" + name).argtypes = [p, i]
        lib.moed_client_submit.argtypes = [p, i, i, u32, i]
        lib.moed_client_wait.argtypes = [p, i, i32]
        lib.moed_client_release.argtypes = [p, i]
        lib.moed_client_set_reconnect.argtypes = [p, i32]
        lib.moed_client_reconnects.restype = ctypes.c_uint64
        lib.moed_client_reconnects.argtypes = [p]
        lib.moed_client_error.restype = ctypes.c_char_p
        lib.moed_client_error.argtypes = [p]
        lib.moed_client_status.argtypes = [p]
        _lib = lib
    return _lib


class Staged:
    """Views of one slot to fill in place: rows [n, H], request_ids [n], positions [n]."""

    def __init__(self, client, slot, n, dtype):
        self.client, self.slot, self.n, self.dtype = client, slot, n, dtype
        self.rows = client._rows(slot, n, dtype)
        self.request_ids = client._view(client._lib.moed_client_request_ids, slot, n, np.uint64)
        self.positions = client._view(client._lib.moed_client_positions, slot, n, np.uint32)


class Handle:
    """A submit in flight; wait() on it, then release() it (or let it go)."""

    def __init__(self, client, slot, n, dtype, as_torch):
        self.client, self.slot, self.n, self.dtype, self.as_torch = client, slot, n, dtype, as_torch
        self.waited = False
        self.released = False

    def release(self):
        if not self.released and self.client._handle:
            self.client._lib.moed_client_release(self.client._handle, self.slot)
        self.released = True

    def __del__(self):
        if self.waited:
            self.release()


class Client:
    """One connection to a moed rank's front door. Not thread-safe."""

    def __init__(self, path, slots=4, max_rows=256, timeout_ms=60000, reconnect_ms=60000):
        self._handle = None
        self._lib = _library()
        error = ctypes.create_string_buffer(1024)
        self._handle = self._lib.moed_client_connect(os.fsencode(path), slots, max_rows, timeout_ms, error, 1024)
        if not self._handle:
            raise MoedError(error.value.decode(errors="replace"))
        self._check(self._lib.moed_client_set_reconnect(self._handle, reconnect_ms))
        info = _Info()
        self._lib.moed_client_get_info(self._handle, ctypes.byref(info))
        self.rank, self.ranks, self.hidden = info.rank, info.ranks, info.hidden
        self.layers, self.slots, self.max_rows = info.layers, info.slots, info.max_rows

    @property
    def reconnects(self):
        """Connections mended since this client connected."""
        return self._lib.moed_client_reconnects(self._handle)

    def close(self):
        if self._handle:
            self._lib.moed_client_close(self._handle)
            self._handle = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        self.close()

    # -- the C calls ---------------------------------------------------------

    def _check(self, result):
        if result < 0:
            raise MoedError(self._lib.moed_client_error(self._handle).decode(errors="replace"),
                            self._lib.moed_client_status(self._handle))
        return result

    def _view(self, getter, slot, count, dtype):
        address = getter(self._handle, slot)
        buffer = (ctypes.c_byte * (count * np.dtype(dtype).itemsize)).from_address(address)
        return np.frombuffer(buffer, dtype=dtype, count=count)

    def _rows(self, slot, n, dtype):
        store = np.uint16 if dtype == BF16 else np.float32
        return self._view(self._lib.moed_client_rows, slot, n * self.hidden, store).reshape(n, self.hidden)

    # -- staging, submit, wait -----------------------------------------------

    def stage(self, n, bf16=False):
        """A free slot's views for n rows, to write into without a copy; submit it with submit_staged().
        Fill them before the next submit or wait (a reconnect may move them)."""
        if not 0 < n <= self.max_rows:
            raise MoedError(f"{n} rows: a submit holds 1 to {self.max_rows} rows")
        return Staged(self, self._check(self._lib.moed_client_acquire(self._handle)), n, BF16 if bf16 else F32)

    def submit_staged(self, staged, layer, as_torch=False):
        try:
            self._check(self._lib.moed_client_submit(self._handle, staged.slot, layer, staged.n, staged.dtype))
        except MoedError:
            self._lib.moed_client_release(self._handle, staged.slot)
            raise
        return Handle(self, staged.slot, staged.n, staged.dtype, as_torch)

    def submit(self, layer, hidden, request_ids, positions):
        """Starts `layer` on hidden [n, H] (numpy float32, or torch float32/bfloat16); returns a Handle."""
        as_torch = torch is not None and isinstance(hidden, torch.Tensor)
        if as_torch:
            if hidden.dtype == torch.bfloat16:
                rows, bf16 = hidden.detach().contiguous().view(torch.int16).numpy().view(np.uint16), True
            elif hidden.dtype == torch.float32:
                rows, bf16 = hidden.detach().contiguous().numpy(), False
            else:
                raise MoedError(f"hidden is a torch {hidden.dtype} tensor: send float32 or bfloat16")
        else:
            rows = np.asarray(hidden)
            if rows.dtype != np.float32:
                raise MoedError(f"hidden is a numpy {rows.dtype} array: send float32")
            bf16 = False
        if rows.ndim != 2 or rows.shape[1] != self.hidden:
            raise MoedError(f"hidden has shape {tuple(rows.shape)}: expected [n, {self.hidden}]")
        n = rows.shape[0]
        ids, pos = np.asarray(request_ids), np.asarray(positions)
        if ids.shape != (n,) or pos.shape != (n,):
            raise MoedError(f"request_ids and positions must hold {n} values each")
        staged = self.stage(n, bf16)
        staged.rows[...] = rows
        staged.request_ids[...] = ids
        staged.positions[...] = pos
        return self.submit_staged(staged, layer, as_torch)

    def wait(self, handle, timeout_ms=-1, copy=True):
        """The layer's outputs for a submit: a copy, or (copy=False) a view of its slot, valid until
        handle.release() or the next submit or wait (a reconnect may move it)."""
        try:
            self._check(self._lib.moed_client_wait(self._handle, handle.slot, timeout_ms))
        except MoedError:
            handle.waited = True
            handle.release()
            raise
        handle.waited = True
        out = self._rows(handle.slot, handle.n, handle.dtype)
        if copy:
            out = out.copy()
            handle.release()
        if handle.as_torch:
            if handle.dtype == BF16:
                return torch.from_numpy(out.view(np.int16)).view(torch.bfloat16)
            return torch.from_numpy(out)
        return out

    def forward(self, layer, hidden, request_ids, positions):
        """h + MoE(RMSNorm(h)) for hidden [n, H], n <= max_rows; a copy in the input's kind and dtype."""
        return self.wait(self.submit(layer, hidden, request_ids, positions))
