"""An NCCL communicator through ctypes: the same operations as the Node side's NcclCommunicator
(src/nccl/communicator.ts). Calls here wait, but the communicator is created non-blocking
(ncclConfig_t.blocking = 0) and polled, so that a timeout is honoured and a hung init can be
aborted. Queueing an operation keeps the GIL (abi.KEEPS_GIL) and so does the first half
millisecond of polling for NCCL to take it; longer waits give it away (sleeping)."""
from __future__ import annotations

import atexit
import contextlib
import ctypes
import math
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Sequence
from ctypes import byref, c_int, c_void_p
from typing import Any, Literal, TypedDict, Union

from ..cuda.device import Device
from ..cuda.stream import stream_handle  # the stream forms every cuda_ipc call accepts
from ..errors import IpcError
from .errors import IN_PROGRESS, SUCCESS, result_name
from .abi import API_MAGIC, CONFIG_UNDEF_INT, CONFIG_VERSION, DATATYPE_UINT8, NCCL_UNIQUE_ID_BYTES, NcclConfig, NcclUniqueIdStruct
from .library import NcclLibrary, load_nccl

_HELD_S = 0.0005
_SPIN_S = 0.002
_FIRST_DELAY_S = 0.001
_MAX_DELAY_S = 0.010
# How long exit waits for another thread to let go of a communicator before leaving it be.
_EXIT_LOCK_S = 2.0


class SendOp(TypedDict):
    op: Literal["send"]
    buffer: Any
    bytes: int
    peer: int


class RecvOp(TypedDict):
    op: Literal["recv"]
    buffer: Any
    bytes: int
    peer: int


class BroadcastOp(TypedDict):
    op: Literal["broadcast"]
    buffer: Any
    bytes: int
    root: int


#: One operation of ``group()``: byte counts; a broadcast is in place.
NcclOperation = Union[SendOp, RecvOp, BroadcastOp]


def _pointer(buffer: Any, nbytes: int, name: str) -> int:
    """The device address of ``buffer`` (an int, or anything with ``__cuda_array_interface__``),
    checking that ``nbytes`` fit in it where its size is known (a contiguous array)."""
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
        raise ValueError(f"bytes must be a non-negative int, got {nbytes!r}")
    if isinstance(buffer, int) and not isinstance(buffer, bool):
        if not 0 <= buffer < 1 << 64:
            raise ValueError(f"{name} must be a 64-bit device address")
        return buffer
    cai = getattr(buffer, "__cuda_array_interface__", None)
    if not isinstance(cai, dict):
        raise TypeError(f"{name} must be a device address (int) or have __cuda_array_interface__, got {type(buffer).__qualname__}")
    ptr = int(cai["data"][0])
    if cai.get("strides") is None:
        size = math.prod(int(n) for n in cai["shape"]) * int(str(cai["typestr"])[2:])
        if nbytes > size:
            raise ValueError(f"{nbytes} bytes do not fit in the {size}-byte {name}")
    return ptr


def _wait(read: Callable[[], int], timeout: float | None, what: str, stop: threading.Event | None = None) -> int:
    """Calls ``read`` (ncclCommGetAsyncError's state) until it is not ncclInProgress; returns that.
    Reads back to back keeping the GIL for the first _HELD_S, then yielding it for the rest of
    _SPIN_S, then sleeps between reads (1 ms, doubling to 10 ms): queueing one operation takes
    NCCL's thread tens of microseconds, a 1 ms sleep per operation made a 32-chunk transfer spend 38
    ms queueing (two H200s), and a yield costs a whole switch interval (5 ms) when another Python
    thread is busy.
    Raises ERR_TIMEOUT past ``timeout`` seconds, and ERR_CLOSED once ``stop`` is set (another
    thread gave up on it)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    delay = _FIRST_DELAY_S
    start = time.monotonic()
    held_until, spin_until = start + _HELD_S, start + _SPIN_S
    while True:
        state = read()
        if state != IN_PROGRESS:
            return state
        now = time.monotonic()
        if now < held_until:
            continue
        if now < spin_until:
            time.sleep(0)
            continue
        if stop is not None and stop.is_set():
            raise IpcError("ERR_CLOSED", f"{what} was given up: the communicator was aborted from another thread")
        if deadline is not None and time.monotonic() >= deadline:
            raise IpcError("ERR_TIMEOUT", f"{what} did not finish within {timeout:g} s (the timeout); wait longer, or find out "
                                          "why the other side is stuck")
        time.sleep(delay if deadline is None else max(0.0, min(delay, deadline - time.monotonic())))
        delay = min(delay * 2, _MAX_DELAY_S)


class NcclCommunicator:
    """One rank of an NCCL communicator, on one GPU: ``NcclCommunicator.init(unique_id, nranks, rank,
    device)`` in every rank. ``send``, ``recv``, ``broadcast`` and ``group`` queue work on a stream
    and return once NCCL took it (synchronize the stream to know it finished); each rank makes the
    matching calls in the same order.

    End it with ``close()`` on every rank (collective), or ``abort()`` (local: for a communicator whose
    peer died, or may have). ``with`` closes on a normal exit and aborts on an exception. One that is
    garbage-collected while open is aborted, with a ResourceWarning, and so is one still open when the
    interpreter exits (a daemon thread's, say)."""

    def __init__(self, library: NcclLibrary, handle: int, device: Device | None, rank: int, nranks: int, cuda_device: int):
        """Use ``NcclCommunicator.init``."""
        self.library = library
        self.device = device
        self.rank = rank
        self.nranks = nranks
        #: The CUDA device ordinal NCCL uses (ncclCommCuDevice).
        self.cuda_device = cuda_device
        self._handle: int | None = handle
        self._lock = threading.RLock()
        # Set by abort() before it takes the lock: a call of another thread polling a half-taken
        # operation (ncclInProgress) gives up and aborts, instead of holding the lock forever.
        self._aborting = threading.Event()
        _open_communicators.add(self)

    @classmethod
    def init(cls, unique_id: bytes, nranks: int, rank: int, device: Device | int | None = None, *,
             library: NcclLibrary | None = None, timeout: float | None = None, cancel: threading.Event | None = None) -> "NcclCommunicator":
        """Creates this rank's communicator (ncclCommInitRankConfig, non-blocking, polled); returns once
        every rank joined. ``device``: a Device or ordinal, whose primary context is made current around
        each NCCL call (None: the thread's current device, e.g. torch.cuda.set_device's). ``library``:
        default ``load_nccl()``. Past ``timeout`` seconds it aborts and raises ERR_TIMEOUT; once
        ``cancel`` is set (by another thread) it aborts and raises ERR_CLOSED; NCCL's failures raise
        NcclError (ERR_NCCL)."""
        uid = bytes(unique_id)
        if len(uid) != NCCL_UNIQUE_ID_BYTES:
            raise ValueError(f"an NCCL unique id is {NCCL_UNIQUE_ID_BYTES} bytes; got {len(uid)}")
        if isinstance(nranks, bool) or not isinstance(nranks, int) or nranks < 1:
            raise ValueError(f"nranks must be a positive int, got {nranks!r}")
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < nranks:
            raise ValueError(f"rank must be an int in 0..{nranks - 1}, got {rank!r}")
        dev = Device.get(device) if isinstance(device, int) else device
        if dev is not None and not isinstance(dev, Device):
            raise TypeError(f"device must be a cuda_ipc Device, an ordinal or None, got {type(device).__qualname__}")
        lib = library if library is not None else load_nccl()
        config = NcclConfig(ctypes.sizeof(NcclConfig), API_MAGIC, CONFIG_VERSION, 0, CONFIG_UNDEF_INT, CONFIG_UNDEF_INT,
                            CONFIG_UNDEF_INT, None)
        id_struct = NcclUniqueIdStruct()
        ctypes.memmove(ctypes.addressof(id_struct), uid, NCCL_UNIQUE_ID_BYTES)
        comm = c_void_p()
        with _active(dev):
            r = lib.fn("ncclCommInitRankConfig")(byref(comm), nranks, id_struct, rank, byref(config))
        handle = comm.value or 0
        if r not in (SUCCESS, IN_PROGRESS):
            error = lib.error(r, "ncclCommInitRankConfig", handle or None)
            if handle:
                _abort(lib, handle, dev)
            raise error
        try:
            state = _wait(lambda: _async_state(lib, handle), timeout, "NcclCommunicator.init", cancel)
            lib.check(state, "ncclCommInitRankConfig", handle)
            facts = [_query(lib, handle, name) for name in ("ncclCommUserRank", "ncclCommCount", "ncclCommCuDevice")]
        except BaseException:
            _abort(lib, handle, dev)
            raise
        return cls(lib, handle, dev, facts[0], facts[1], facts[2])

    @property
    def closed(self) -> bool:
        """True once close() or abort() ended it."""
        return self._handle is None

    def _open_handle(self, what: str) -> int:
        h = self._handle
        if h is None:
            raise IpcError("ERR_CLOSED", f"{what}: this NcclCommunicator was closed or aborted; create a new one")
        return h

    def _rank(self, value: Any, name: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < self.nranks:
            raise ValueError(f"{name} must be an int in 0..{self.nranks - 1}, got {value!r}")
        return value

    def send(self, buffer: Any, nbytes: int, peer: int, *, stream: Any = None, timeout: float | None = None) -> None:
        """Queues sending ``nbytes`` bytes of ``buffer`` to rank ``peer`` on ``stream`` (ncclSend: an int
        CUstream, a PyTorch, CuPy or cuda.core stream, or None for the legacy default stream). Returns
        once NCCL took it; past ``timeout`` seconds the communicator is aborted and ERR_TIMEOUT raised."""
        ptr, p, s = _pointer(buffer, nbytes, "buffer"), self._rank(peer, "peer"), stream_handle(stream)
        self._submit("ncclSend", timeout, self._p2p("ncclSend", ptr, nbytes, p, s))

    def recv(self, buffer: Any, nbytes: int, peer: int, *, stream: Any = None, timeout: float | None = None) -> None:
        """Queues receiving ``nbytes`` bytes from rank ``peer`` into ``buffer`` (ncclRecv); as send() otherwise."""
        ptr, p, s = _pointer(buffer, nbytes, "buffer"), self._rank(peer, "peer"), stream_handle(stream)
        self._submit("ncclRecv", timeout, self._p2p("ncclRecv", ptr, nbytes, p, s))

    def broadcast(self, buffer: Any, nbytes: int, root: int, *, stream: Any = None, timeout: float | None = None) -> None:
        """Queues an in-place broadcast (ncclBroadcast): rank ``root`` sends ``nbytes`` bytes of its
        ``buffer``, every other rank receives into its own. Every rank calls it."""
        ptr, r, s = _pointer(buffer, nbytes, "buffer"), self._rank(root, "root"), stream_handle(stream)
        self._submit("ncclBroadcast", timeout, self._bcast(ptr, nbytes, r, s))

    def group(self, operations: Sequence[NcclOperation], *, stream: Any = None, timeout: float | None = None) -> None:
        """Queues several operations as one NCCL group (ncclGroupStart ... ncclGroupEnd), so that a rank
        may send to and receive from another at once. All are checked before any is queued."""
        s = stream_handle(stream)
        issue: list[tuple[str, Callable[[int], int]]] = []
        for i, o in enumerate(operations):
            if not isinstance(o, dict) or o.get("op") not in ("send", "recv", "broadcast"):
                raise ValueError(f"operations[{i}] must be a dict whose 'op' is 'send', 'recv' or 'broadcast'")
            ptr, n = _pointer(o["buffer"], o["bytes"], f"operations[{i}].buffer"), o["bytes"]
            if o["op"] == "broadcast":
                issue.append(("ncclBroadcast", self._bcast(ptr, n, self._rank(o["root"], f"operations[{i}].root"), s)))
            else:
                call = "ncclSend" if o["op"] == "send" else "ncclRecv"
                issue.append((call, self._p2p(call, ptr, n, self._rank(o["peer"], f"operations[{i}].peer"), s)))

        def run(h: int) -> int:
            self.library.check(self.library.fn("ncclGroupStart")(), "ncclGroupStart", h)
            failed = None
            for call, fn in issue:
                r = fn(h)
                if r != SUCCESS:
                    failed = self.library.error(r, call, h)
                    break
            ended = int(self.library.fn("ncclGroupEnd")())  # closed whatever happened inside
            if failed is not None:
                raise failed
            return ended

        self._submit("ncclGroupEnd", timeout, run)

    def _p2p(self, call: str, ptr: int, nbytes: int, peer: int, stream: int) -> Callable[[int], int]:
        fn = self.library.fn(call)
        return lambda h: int(fn(ptr, nbytes, DATATYPE_UINT8, peer, h, stream))

    def _bcast(self, ptr: int, nbytes: int, root: int, stream: int) -> Callable[[int], int]:
        fn = self.library.fn("ncclBroadcast")
        return lambda h: int(fn(ptr, ptr, nbytes, DATATYPE_UINT8, root, h, stream))

    def _submit(self, call: str, timeout: float | None, issue: Callable[[int], int]) -> None:
        with self._lock:
            h = self._open_handle(f"NcclCommunicator.{call}")
            with _active(self.device):
                r = issue(h)
            if r == SUCCESS:
                return
            if r != IN_PROGRESS:
                raise self.library.error(r, call, h)
            try:
                state = _wait(lambda: _async_state(self.library, h), timeout, f"NcclCommunicator: {call}", self._aborting)
            except BaseException:
                self.abort()  # NCCL holds half-taken work: nothing but abort ends it safely
                raise
            self.library.check(state, call, h)

    def async_error(self) -> str:
        """NCCL's asynchronous state (ncclCommGetAsyncError): 'ncclSuccess' while healthy, an error name
        (e.g. 'ncclRemoteError': a peer died or the network failed) once it broke; then abort() it."""
        with self._lock:
            return result_name(_async_state(self.library, self._open_handle("NcclCommunicator.async_error")))

    def poll_async_error(self) -> str | None:
        """async_error() without waiting: None while another thread is in a call of this communicator
        (which reports NCCL's errors itself)."""
        if not self._lock.acquire(blocking=False):
            return None
        try:
            return result_name(_async_state(self.library, self._open_handle("NcclCommunicator.poll_async_error")))
        finally:
            self._lock.release()

    def abort(self) -> None:
        """Aborts the communicator (ncclCommAbort): local, never waits for another rank; stops NCCL's
        kernels and threads and frees what it holds. For a communicator whose peer died or may have.
        Idempotent. A call of another thread still waiting for NCCL to take an operation gives up
        first (ERR_CLOSED)."""
        self._aborting.set()
        with self._lock:
            h, self._handle = self._handle, None
            if h is not None:
                _abort(self.library, h, self.device, check=True)

    def close(self, timeout: float | None = None) -> None:
        """Closes the communicator: ncclCommFinalize (waits for queued work and every rank), then
        ncclCommDestroy. Collective: call it on every rank. A communicator with an asynchronous error is
        aborted instead, as is one whose close passes ``timeout`` seconds (then ERR_TIMEOUT). Idempotent."""
        with self._lock:
            if self._handle is None:
                return
            h: int = self._handle
            if _async_state(self.library, h) not in (SUCCESS, IN_PROGRESS):
                self.abort()
                return
            try:
                with _active(self.device):
                    r = self.library.fn("ncclCommFinalize")(h)
                if r not in (SUCCESS, IN_PROGRESS):
                    raise self.library.error(r, "ncclCommFinalize", h)
                self.library.check(_wait(lambda: _async_state(self.library, h), timeout, "NcclCommunicator.close"), "ncclCommFinalize", h)
            except BaseException:
                self.abort()
                raise
            self._handle = None
            with _active(self.device):
                r = self.library.fn("ncclCommDestroy")(h)
            self.library.check(r, "ncclCommDestroy")

    def __enter__(self) -> "NcclCommunicator":
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

    def __del__(self) -> None:
        if getattr(self, "_handle", None) is None:
            return
        with contextlib.suppress(Exception):
            warnings.warn("An NcclCommunicator was garbage-collected without close(); it was aborted. Close it, or use `with`.",
                          ResourceWarning, stacklevel=2)
            self.abort()

    def _abort_at_exit(self) -> None:
        """abort() for interpreter exit: a thread still inside a call of this communicator that does
        not give up within _EXIT_LOCK_S keeps it (aborting under it would free what it uses)."""
        self._aborting.set()
        if not self._lock.acquire(timeout=_EXIT_LOCK_S):
            return
        try:
            h, self._handle = self._handle, None
            if h is not None:
                _abort(self.library, h, self.device)
        finally:
            self._lock.release()

    def __repr__(self) -> str:
        return f"<cuda_ipc.nccl.NcclCommunicator rank {self.rank} of {self.nranks}{' (closed)' if self.closed else ''}>"


# Communicators not yet garbage-collected; those still open at interpreter exit are aborted.
_open_communicators: "weakref.WeakSet[NcclCommunicator]" = weakref.WeakSet()


@atexit.register
def _abort_open_communicators() -> None:
    """Aborts every communicator still open when the interpreter exits. One held by a daemon thread
    (a link's) is never collected, and exit() tears CUDA and NCCL down under NCCL's own threads,
    which can crash the process instead of letting it exit with its code. Registered on import,
    so it runs after the atexit handlers of what imports this module (a link's close)."""
    for comm in list(_open_communicators):
        with contextlib.suppress(Exception):
            comm._abort_at_exit()


def _active(device: Device | None) -> Any:
    return device.activate() if device is not None else contextlib.nullcontext()


def _async_state(lib: NcclLibrary, handle: int) -> int:
    state = c_int()
    lib.check(int(lib.fn("ncclCommGetAsyncError")(handle, byref(state))), "ncclCommGetAsyncError", handle)
    return state.value


def _query(lib: NcclLibrary, handle: int, call: str) -> int:
    v = c_int()
    lib.check(lib.fn(call)(handle, byref(v)), call, handle)
    return v.value


def _abort(lib: NcclLibrary, handle: int, device: Device | None, check: bool = False) -> None:
    with _active(device):
        r = lib.fn("ncclCommAbort")(handle)
    if check:
        lib.check(r, "ncclCommAbort")
