"""Python client of moed's front door: hand one MoE layer's tokens to the moed
rank on this host and get the layer's outputs back.

    from moed_client import Client
    c = Client("/run/moed/moed-ingress-0.sock")
    y = c.forward(layer, hidden, request_ids, positions)   # hidden: [n, H], any n
    h = c.submit(layer, hidden, request_ids, positions)   # several in flight
    y = c.wait(h)

What a layer returns, for each row h: h + MoE(RMSNorm(h)), as in Mixtral's
decoder layer (RMSNorm with the layer's post_attention_layernorm weight, the
router, the SwiGLU experts, the gate-weighted sum and the residual add). A
row's output bits depend only on the row, the layer and the weights, not on
which other rows, clients or ranks share its step.

`hidden` is a numpy array (float32) or a CPU torch tensor (float32 or
bfloat16); the output has the same kind and dtype. `request_ids` are integers
in [0, 2^64), `positions` integers in [0, 2^32), one per row; `layer` is the
model's own layer number, an integer >= 0. Rows travel in shared memory:
submit copies them into a slot once (stage() gives views of a slot to write
into without that copy), and wait(..., copy=False) returns a view of the
slot, valid until the handle is released.

Client(path, slots=4, max_rows=1024, ...) asks the daemon for `slots` slots
of `max_rows` rows each; the daemon grants at most its [ingress].max_slots
and max_rows (and fewer slots past max_client_mb of shared memory): the
grant is `c.slots` and `c.max_rows`. A submit holds 1 to c.max_rows rows;
forward() takes any number and splits them over slots itself, several in
flight, keeping their order and bits.

A wait() that times out leaves its submit in flight: the handle stays
waitable, and a later wait() returns the outputs (the error's `in_flight` is
True). A submit the daemon refused frees its slot. A handle dropped before
its wait gives its slot back once its answer has come.

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

import collections
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
    """A failure reported by the daemon (status set) or by this side. `in_flight` is True for a wait()
    that failed with its submit still in flight (a timeout): its handle can be waited for again."""

    def __init__(self, message, status=0, in_flight=False):
        super().__init__(message)
        self.status = STATUS.get(status)
        self.in_flight = in_flight


def _is_integer(value):
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _integer(name, value, low, high, what):
    """value when it is an integer in [low, high), else a MoedError naming it."""
    if not _is_integer(value) or not low <= value < high:
        raise MoedError(f"{name} = {value!r}: {what}")
    return int(value)


def _per_row(values, name, n, high, what, dtype):
    """values (a sequence, numpy array or torch tensor of n integers in [0, high)) as a numpy array of
    dtype, else a MoedError naming the first bad value and its row."""
    if torch is not None and isinstance(values, torch.Tensor):
        values = values.detach().cpu().numpy()
    a = np.asarray(values)
    if a.shape != (n,):
        raise MoedError(f"{name} has shape {a.shape}: expected ({n},), one value per row")
    if a.dtype.kind in "iu":
        bad = np.zeros(n, bool)
        if a.dtype.kind == "i":
            bad |= a < 0
        if np.iinfo(a.dtype).max >= high:
            bad |= a >= high
        if bad.any():
            row = int(np.argmax(bad))
            raise MoedError(f"{name}: row {row} holds {a[row]}: {what}")
        return a.astype(dtype, copy=False)
    if not isinstance(values, np.ndarray):  # a list whose ints numpy made floats or objects: each as given
        a = np.array(values, dtype=object)
    for row, v in enumerate(a):
        if not _is_integer(v) or not 0 <= v < high:
            raise MoedError(f"{name}: row {row} holds {v}" +
                            ("" if _is_integer(v) else f" (a {type(v).__name__})") + f": {what}")
    return a.astype(dtype)


class _Options(ctypes.Structure):
    _fields_ = [("slots", ctypes.c_uint32), ("max_rows", ctypes.c_uint32), ("timeout_ms", ctypes.c_int32),
                ("reconnect_ms", ctypes.c_int32), ("key_file", ctypes.c_char_p), ("spread", ctypes.c_int32)]


SPREADS = {"round_robin": 0, "least_loaded": 1}


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
        lib.moed_client_open.restype = p
        lib.moed_client_open.argtypes = [ctypes.POINTER(ctypes.c_char_p), ctypes.c_size_t, ctypes.POINTER(_Options),
                                         ctypes.c_char_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_int)]
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
        lib.moed_client_set_home_silence.argtypes = [p, i32]
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
    """A submit in flight: wait() for it; a copy=False wait's view lasts until release().

    A wait that times out leaves the submit in flight and the handle waitable. release() before the
    wait is refused (the daemon may still write the slot); a handle dropped before its wait gives its
    slot back once the answer has come (the client collects it when it needs a slot)."""

    def __init__(self, client, slot, n, dtype, as_torch):
        self.client, self.slot, self.n, self.dtype, self.as_torch = client, slot, n, dtype, as_torch
        self.waited = False
        self.released = False

    def release(self):
        if self.released:
            return
        if not self.waited:
            raise MoedError(f"slot {self.slot} is in flight: wait() for its handle before releasing it "
                            "(or drop the handle: its slot comes back once the answer has come)")
        if self.client._handle:
            self.client._check(self.client._lib.moed_client_release(self.client._handle, self.slot))
        self.released = True

    def __del__(self):
        if self.released or not self.client._handle:
            return
        if self.waited:
            self.client._lib.moed_client_release(self.client._handle, self.slot)
            self.released = True
        else:
            self.client._orphans.append(self.slot)


class Client:
    """One connection to a moed rank's front door, or to several home ranks. Not thread-safe.

    address: the rank's socket on this host (a path, or "unix:///PATH"), its network door
    ("ucx://HOST:PORT", with key_file), or a list of ucx:// homes: each submit then goes to the
    home `spread` picks ("round_robin" or "least_loaded"), with the same bits whichever serves it,
    and a home that is lost is failed over to the others.
    slots: submits in flight at once; max_rows: rows per submit. The daemon grants at most its
    [ingress].max_slots and max_rows (and fewer slots past max_client_mb): the grant is .slots and
    .max_rows. timeout_ms: for connecting and for each wait (< 0: none); reconnect_ms: how long to
    keep trying to connect (again) when no daemon answers (0: fail at once). key_file: the
    cluster's key (a file of mode 0600), for ucx:// addresses. home_silence_ms (several homes): a
    home that holds this client's rows and is silent this long is pinged, and failed over when it
    answers nothing for as long again (0: only a broken connection fails a home over)."""

    def __init__(self, address, slots=4, max_rows=1024, timeout_ms=60000, reconnect_ms=60000, key_file=None,
                 spread="round_robin", home_silence_ms=3000):
        self._handle = None
        self._orphans = []  # slots of handles dropped in flight
        slots = _integer("slots", slots, 1, 1 << 32, "ask for 1 or more slots (submits in flight at once)")
        max_rows = _integer("max_rows", max_rows, 1, 1 << 32, "ask for 1 or more rows per submit")
        timeout_ms = _integer("timeout_ms", timeout_ms, -(1 << 31), 1 << 31,
                              "an integer number of milliseconds (< 0: no timeout)")
        reconnect_ms = _integer("reconnect_ms", reconnect_ms, 0, 1 << 31,
                                "an integer number of milliseconds >= 0 (0: do not reconnect)")
        if spread not in SPREADS:
            raise MoedError(f"spread = {spread!r}: one of {', '.join(SPREADS)}")
        home_silence_ms = _integer("home_silence_ms", home_silence_ms, 0, 1 << 31,
                                   "an integer number of milliseconds >= 0 (0: only a broken connection)")
        addresses = [address] if isinstance(address, (str, bytes, os.PathLike)) else list(address)
        if not addresses:
            raise MoedError("no address to connect to")
        self._lib = _library()
        error = ctypes.create_string_buffer(1024)
        encoded = (ctypes.c_char_p * len(addresses))(*[os.fsencode(a) for a in addresses])
        options = _Options(slots, max_rows, timeout_ms, reconnect_ms,
                           os.fsencode(key_file) if key_file is not None else None, SPREADS[spread])
        status = ctypes.c_int(0)
        self._handle = self._lib.moed_client_open(encoded, len(addresses), ctypes.byref(options), error, 1024,
                                                  ctypes.byref(status))
        if not self._handle:
            raise MoedError(error.value.decode(errors="replace"), status.value)
        self._lib.moed_client_set_home_silence(self._handle, home_silence_ms)
        self.home_silence_ms = home_silence_ms
        info = _Info()
        self._lib.moed_client_get_info(self._handle, ctypes.byref(info))
        self.address = addresses[0] if len(addresses) == 1 else addresses
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

    def _error(self, in_flight=False):
        return MoedError(self._lib.moed_client_error(self._handle).decode(errors="replace"),
                         self._lib.moed_client_status(self._handle), in_flight)

    def _check(self, result):
        if result < 0:
            raise self._error()
        return result

    def _view(self, getter, slot, count, dtype):
        address = getter(self._handle, slot)
        buffer = (ctypes.c_byte * (count * np.dtype(dtype).itemsize)).from_address(address)
        return np.frombuffer(buffer, dtype=dtype, count=count)

    def _rows(self, slot, n, dtype):
        store = np.uint16 if dtype == BF16 else np.float32
        return self._view(self._lib.moed_client_rows, slot, n * self.hidden, store).reshape(n, self.hidden)

    def _collect_orphans(self, timeout_ms):
        """Frees the slots of dropped handles whose answers have come (waiting up to timeout_ms for
        each); True when one was freed."""
        freed = False
        for slot in list(self._orphans):
            self._lib.moed_client_wait(self._handle, slot, timeout_ms)
            if self._lib.moed_client_release(self._handle, slot) == 0:  # refused while still in flight
                self._orphans.remove(slot)
                freed = True
                if timeout_ms != 0:
                    break
        return freed

    def _acquire(self, wait_for_orphans=True):
        if self._orphans:
            self._collect_orphans(0)
        slot = self._lib.moed_client_acquire(self._handle)
        if slot < 0 and wait_for_orphans and self._orphans and self._collect_orphans(-1):
            slot = self._lib.moed_client_acquire(self._handle)
        return self._check(slot)

    def _layer(self, layer):
        if not _is_integer(layer) or layer < 0:
            raise MoedError(f"layer {layer!r}: a layer is the model's own layer number, an integer >= 0")
        if layer >= 1 << 31:
            raise MoedError(f"layer {layer} is out of range: the model has {self.layers} layers")
        return int(layer)

    def _inputs(self, hidden, request_ids, positions):
        """hidden, request_ids and positions checked: (rows as numpy, bf16, as_torch, ids, positions)."""
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
        ids = _per_row(request_ids, "request_ids", n, 1 << 64, "request ids are integers in [0, 2^64)", np.uint64)
        pos = _per_row(positions, "positions", n, 1 << 32, "positions are integers in [0, 2^32)", np.uint32)
        return rows, bf16, as_torch, ids, pos

    @staticmethod
    def _as_given(out, dtype, as_torch):
        if as_torch:
            if dtype == BF16:
                return torch.from_numpy(out.view(np.int16)).view(torch.bfloat16)
            return torch.from_numpy(out)
        return out

    # -- staging, submit, wait -----------------------------------------------

    def stage(self, n, bf16=False):
        """A free slot's views for n rows, to write into without a copy; submit it with submit_staged().
        Fill them before the next submit or wait (a reconnect may move them)."""
        if not _is_integer(n) or not 0 < n <= self.max_rows:
            raise MoedError(f"{n!r} rows: a submit holds 1 to {self.max_rows} rows (forward() splits more)")
        return Staged(self, self._acquire(), int(n), BF16 if bf16 else F32)

    def submit_staged(self, staged, layer, as_torch=False):
        try:
            layer = self._layer(layer)
            self._check(self._lib.moed_client_submit(self._handle, staged.slot, layer, staged.n, staged.dtype))
        except MoedError:
            self._lib.moed_client_release(self._handle, staged.slot)
            raise
        return Handle(self, staged.slot, staged.n, staged.dtype, as_torch)

    def _submit(self, layer, rows, bf16, as_torch, ids, pos, wait_for_orphans=True):
        n = rows.shape[0]
        if not 0 < n <= self.max_rows:
            raise MoedError(f"{n} rows: a submit holds 1 to {self.max_rows} rows (forward() splits more)")
        staged = Staged(self, self._acquire(wait_for_orphans), n, BF16 if bf16 else F32)
        staged.rows[...] = rows
        staged.request_ids[...] = ids
        staged.positions[...] = pos
        return self.submit_staged(staged, layer, as_torch)

    def submit(self, layer, hidden, request_ids, positions):
        """Starts `layer` on hidden [n, H] (numpy float32, or torch float32/bfloat16), 1 <= n <= max_rows,
        with a request id and a position per row; returns a Handle."""
        layer = self._layer(layer)
        return self._submit(layer, *self._inputs(hidden, request_ids, positions))

    def wait(self, handle, timeout_ms=-1, copy=True):
        """The layer's outputs for a submit: a copy, or (copy=False) a view of its slot, valid until
        handle.release() or the next submit or wait (a reconnect may move it). timeout_ms < 0: the
        client's timeout_ms. A wait that times out raises a MoedError with in_flight True and leaves the
        handle waitable; a submit the daemon refused raises with its status and frees its slot."""
        if handle.client is not self:
            raise MoedError("this handle belongs to another client")
        if handle.released:
            raise MoedError(f"slot {handle.slot}'s handle was released: wait() gives a submit's outputs once "
                            "(copy=False keeps them until release())")
        timeout_ms = _integer("timeout_ms", timeout_ms, -(1 << 31), 1 << 31,
                              "an integer number of milliseconds (< 0: the client's timeout_ms)")
        if not handle.waited:
            if self._lib.moed_client_wait(self._handle, handle.slot, timeout_ms) < 0:
                error = self._error()
                # A failed submit's slot is released; one still in flight (a timeout) is refused, and
                # stays the handle's to wait for again.
                if self._lib.moed_client_release(self._handle, handle.slot) == 0:
                    handle.waited = handle.released = True
                else:
                    error.in_flight = True
                raise error
            handle.waited = True
        out = self._rows(handle.slot, handle.n, handle.dtype)
        if copy:
            out = out.copy()
            handle.release()
        return self._as_given(out, handle.dtype, handle.as_torch)

    def forward(self, layer, hidden, request_ids, positions):
        """h + MoE(RMSNorm(h)) for hidden [n, H], any n: a copy in the input's kind and dtype. More than
        max_rows rows are split into submits of max_rows, as many in flight as there are free slots;
        a row's bits do not depend on the split."""
        layer = self._layer(layer)
        rows, bf16, as_torch, ids, pos = self._inputs(hidden, request_ids, positions)
        n, per = rows.shape[0], self.max_rows
        out = np.empty(rows.shape, rows.dtype)
        pending = collections.deque()  # (first row, handle), oldest first
        first = 0

        def wait_oldest():
            at, handle = pending.popleft()
            try:
                out[at:at + handle.n] = self.wait(handle, copy=False)
            except MoedError as e:
                if n <= per:
                    raise
                error = MoedError(f"rows {at} to {at + handle.n - 1} of {n} (the daemon numbers them from 0): {e}",
                                  0, e.in_flight)
                error.status = e.status
                raise error from e
            handle.release()

        while first < n or pending:
            if first < n and len(pending) < self.slots:
                try:
                    handle = self._submit(layer, rows[first:first + per], bf16, False, ids[first:first + per],
                                          pos[first:first + per], wait_for_orphans=not pending)
                except MoedError:
                    if not pending:  # no slot of this call's to wait for
                        raise
                    wait_oldest()
                    continue
                pending.append((first, handle))
                first += handle.n
            else:
                wait_oldest()
        return self._as_given(out, BF16 if bf16 else F32, as_torch)
