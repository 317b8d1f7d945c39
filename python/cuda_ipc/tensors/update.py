"""update_in_place: copies received tensors into your own, matched by name, with as few GPU operations as
the driver allows: every pair that is one run of bytes on both sides in one launch of the copy_runs
kernel (kernels.py: a table of runs in device memory, chunks spread over every SM, 16-byte
loads), the other pairs with torch (``copy_``), all on one stream. Names, dtypes and shapes are
checked before anything is copied, and what does not match is named.

A repeated update of the same parameters from the same sender (the same tensor table) reuses its plan:
the destination pointers, the source offsets and the run table, uploaded once; the per-call cost is a
pointer check per parameter, one launch and one event record.
"""
from __future__ import annotations

import ctypes
import operator
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from ctypes import byref, c_size_t, c_uint64, c_void_p
from types import ModuleType
from typing import Any, NamedTuple, Optional

from . import kernels as copy_kernels
from ..cuda import driver as drv
from .kernels import CU_MEMCPY_SRC_ACCESS_ORDER_STREAM, CUmemcpyAttributes, DeviceTable, RunTable, plan_runs
from ..ipc.descriptor import DTYPES, dtype_name, numel
from ..cuda.device import Device
from ..errors import CudaError, IpcError
from ..host.host_buffer import host_address
from ..arrays.host_array import HostArray, c_offsets
from .tensor_set_transfer import TensorMap, torch_data_ptr
from ..arrays.buffer_array import is_c_order, is_dense, torch_contiguous


class UpdateResult(NamedTuple):
    #: tensors copied
    copied: int
    #: bytes copied (elements x itemsize)
    bytes: int
    #: parameters the received set does not have (strict=False only)
    missing: list[str]
    #: received tensors that are not parameters (strict=False only)
    unexpected: list[str]
    #: GPU operations queued (driver calls, torch copies); 0 for host memory
    operations: int
    #: 'kernel' (one copy_runs launch), 'batch' (cuMemcpyBatchAsync), 'copy' (one cuMemcpyDtoDAsync per pair),
    #: 'foreach' (torch._foreach_copy_), 'host', 'nccl' (a set from a TCP link received straight into the parameters:
    #: ``operations`` NCCL operations, one per chunk; returns once the bytes are there)
    method: str
    #: the stream the copies were queued on (0 for host memory); synchronize it (or pass sync=True) before reusing the sources
    stream: int
    #: where the call's time went, in microseconds: 'plan' (matching names, the plan or its reuse, source
    #: addresses), 'table' (building and uploading the run table), 'launch' (queueing the copies), 'sync'
    #: (waiting for them, sync=True only); and 'uploaded': the run table's bytes uploaded (0 when the
    #: plan's table was reused). Method 'nccl': 'plan', 'wait' (until the transfer's turn on its
    #: communicator), 'queue' (queueing its chunks), 'transfer' (until the bytes were there), 'uploaded'
    timings: Optional[dict[str, float]] = None


# ------------------------------------------------------------------------------------------------
# Driver entry points this module needs beyond driver.py's (resolved at their own ABI version).


_entry = copy_kernels.entry
_call = copy_kernels.call


def has_memcpy_batch() -> bool:
    """Whether the driver has cuMemcpyBatchAsync (CUDA 12.8+)."""
    return _entry("cuMemcpyBatchAsync") is not None


_streams: dict[int, int] = {}


def _blocking_stream(ordinal: int) -> int:
    """A stream of this module's own per device, created blocking: it is ordered with the legacy default
    stream both ways, which batched copies may not be queued on."""
    s = _streams.get(ordinal)
    if s is None:
        h = c_void_p()
        with Device.get(ordinal).activate():
            _call("cuStreamCreate", byref(h), 0)
        s = _streams[ordinal] = h.value or 0
    return s


def _stream_handle(stream: Any, ordinal: int) -> int:
    h: int
    if stream is None:
        torch = sys.modules.get("torch")
        h = torch.cuda.current_stream(ordinal).cuda_stream if torch is not None and torch.cuda.is_available() else 0
    elif isinstance(stream, int):
        h = stream
    else:
        cuda_stream = getattr(stream, "cuda_stream", None)
        h = int(getattr(stream, "handle", stream)) if cuda_stream is None else cuda_stream
    return _blocking_stream(ordinal) if h in (0, 1) else h  # 0 and 1: the legacy default stream


# ------------------------------------------------------------------------------------------------
# Tensors, wherever they live


class _Ref(NamedTuple):
    dtype: str
    shape: tuple[int, ...]
    strides: tuple[int, ...]  # bytes
    nbytes: int
    extent: int
    host: bool
    ordinal: int  # device (0 for host memory)
    c_order: bool | None = None  # C-contiguous (None: not known; worked out from shape and strides)


def _describe(obj: Any) -> tuple[_Ref, int]:
    """(_Ref, address) of a destination or source tensor: torch tensors, HostArray, CUDA arrays."""
    torch = sys.modules.get("torch")
    fast = torch_contiguous(obj) if torch is not None and isinstance(obj, torch.Tensor) else None
    if fast is not None:
        name, shape, strides, n = fast
        device = obj.get_device()
        return _Ref(name, shape, strides, n, n, device < 0, max(device, 0), True), obj.data_ptr()
    if type(obj) is HostArray:
        m = obj.meta
        n = m.itemsize * numel(m.shape)
        return _Ref(m.dtype, m.shape, m.strides, n, m.extent, True, 0), host_address(obj.buffer)
    if hasattr(obj, "data_ptr") and hasattr(obj, "element_size"):
        itemsize = obj.element_size()
        shape = tuple(obj.shape)
        strides = tuple(s * itemsize for s in obj.stride())
        n = obj.numel() * itemsize
        extent = (sum((d - 1) * s for d, s in zip(shape, strides)) + itemsize) if n else 0
        return _Ref(dtype_name(obj.dtype), shape, strides, n, extent, not obj.is_cuda, (obj.device.index or 0) if obj.is_cuda else 0), obj.data_ptr()
    cai = getattr(obj, "__cuda_array_interface__", None)
    if isinstance(cai, dict):
        dtype = dtype_name(cai["typestr"])
        itemsize = DTYPES[dtype][0]
        shape = tuple(cai["shape"])
        given = cai.get("strides")
        if given is None:
            c = []
            step = itemsize
            for d in reversed(shape):
                c.append(step)
                step *= d
            strides = tuple(reversed(c))
        else:
            strides = tuple(given)
        n = itemsize * numel(shape)
        extent = (sum((d - 1) * s for d, s in zip(shape, strides)) + itemsize) if n else 0
        return _Ref(dtype, shape, tuple(strides), n, extent, False, 0), cai["data"][0]
    raise IpcError("ERR_INVALID_ARG", f"update_in_place: cannot copy into or from a {type(obj).__qualname__}; use torch tensors, CUDA arrays or HostArray")


def _one_run(d: _Ref, s: _Ref) -> int | None:
    """Bytes of the single run that copies s into d, or None when the pair needs an element-wise copy."""
    itemsize = DTYPES[d.dtype][0]
    dc = d.c_order if d.c_order is not None else is_c_order(d.shape, d.strides, itemsize)
    if dc and (s.c_order if s.c_order is not None else is_c_order(s.shape, s.strides, itemsize)):
        return d.nbytes
    if d.strides == s.strides and is_dense(d.shape, d.strides, itemsize):
        return d.extent
    return None


def _targets(target: Any) -> Mapping[str, Any]:
    if isinstance(target, Mapping):
        return target
    if hasattr(target, "state_dict"):
        # A module: its parameters and persistent buffers, as torch's load_state_dict copies them.
        # (For repeated updates pass dict(module.state_dict(keep_vars=True)), made once.)
        sd: Mapping[str, Any] = target.state_dict(keep_vars=True)
        return sd
    raise IpcError("ERR_INVALID_ARG", f"update_in_place: the target must be a dict of tensors or a torch module, got {type(target).__qualname__}")


# ------------------------------------------------------------------------------------------------
# Plans


class _Plan:
    """What copying one received layout into one set of parameters takes, kept while both stay."""

    __slots__ = ("names", "dst_objs", "dst_ptrs", "dst_data_ptr", "src_index", "src_strides", "runs", "run_sizes", "strided", "host", "ordinal",
                 "bytes", "unexpected", "missing", "length", "keep", "_arrays", "_bases", "_table", "_device_table")
    names: list[str]
    dst_objs: list[Any]
    dst_ptrs: list[int]
    dst_data_ptr: Callable[[Any], int] | None  # torch.Tensor.data_ptr when every destination is a torch tensor
    src_index: list[Any]  # the source of each pair: its index in the layout (a TensorMap) or its name (a dict)
    src_strides: list[tuple[int, ...]]
    runs: list[int]  # pairs copied as one run of bytes
    run_sizes: list[int]
    strided: list[int]  # pairs copied element-wise
    host: bool
    ordinal: int
    bytes: int
    unexpected: list[str]
    missing: list[str]
    length: int
    keep: Any
    _arrays: tuple[list[int], Any, Any, Any] | None  # (source pointers, and the driver's arrays made from them)
    _bases: tuple[tuple[int, ...], list[int]] | None
    _table: tuple[list[int], RunTable] | None  # (source pointers, the copy_runs table made from them)
    _device_table: DeviceTable | None  # the table uploaded (freed with the plan)

    def __init__(self) -> None:
        self._arrays = None
        self._bases = None
        self._table = None
        self._device_table = None
        self.keep = None


def _mismatch(mismatched: list[str], missing: list[str], unexpected: list[str], strict: bool) -> None:
    if not mismatched and not (strict and (missing or unexpected)):
        return

    def listed(names: list[str]) -> str:
        shown = ", ".join(repr(n) for n in names[:8])
        return shown + (f" and {len(names) - 8} more" if len(names) > 8 else "")
    parts = []
    if mismatched:
        parts.append(f"{len(mismatched)} mismatched ({'; '.join(mismatched[:8])}{'; ...' if len(mismatched) > 8 else ''})")
    if strict and missing:
        parts.append(f"{len(missing)} missing from what was received ({listed(missing)})")
    if strict and unexpected:
        parts.append(f"{len(unexpected)} received that are not parameters ({listed(unexpected)})")
    tail = "" if mismatched else "; pass strict=False to copy the ones that match"
    raise IpcError("ERR_TENSOR_MISMATCH", f"update_in_place: the received tensors do not match the parameters: {'; '.join(parts)}. Nothing was copied{tail}")


def _plan(dst: Mapping[str, Any], names_of_src: Iterable[str], ref_of_src: Callable[[str], tuple[Any, _Ref | None]],
          strict: bool) -> _Plan:
    missing: list[str] = []
    mismatched: list[str] = []
    names: list[str] = []
    objs: list[Any] = []
    ptrs: list[int] = []
    src_index: list[Any] = []
    refs: list[tuple[_Ref, _Ref]] = []
    for name, obj in dst.items():
        i, s = ref_of_src(name)
        if s is None:
            missing.append(name)
            continue
        d, ptr = _describe(obj)
        if d.dtype != s.dtype:
            mismatched.append(f"{name!r}: dtype {s.dtype} received, {d.dtype} here")
        elif d.shape != s.shape:
            mismatched.append(f"{name!r}: shape {list(s.shape)} received, {list(d.shape)} here")
        else:
            names.append(name)
            objs.append(obj)
            ptrs.append(ptr)
            src_index.append(i)
            refs.append((d, s))
    unexpected = [n for n in names_of_src if n not in dst]
    _mismatch(mismatched, missing, unexpected, strict)
    p = _Plan()
    p.names, p.dst_objs, p.dst_ptrs, p.src_index = names, objs, ptrs, src_index
    p.dst_data_ptr = torch_data_ptr(objs)
    p.src_strides = [s.strides for _, s in refs]
    p.missing, p.unexpected = missing, unexpected
    p.length = len(dst)
    p.host = bool(refs) and refs[0][0].host
    for d, s in refs:
        if d.host != s.host or d.host != p.host:
            raise IpcError("ERR_UNSUPPORTED", "update_in_place copies device to device or host to host; these tensors mix device and host memory")
    p.ordinal = refs[0][0].ordinal if refs else 0
    p.runs, p.run_sizes, p.strided = [], [], []
    p.bytes = 0
    for k, (d, s) in enumerate(refs):
        p.bytes += d.nbytes
        n = _one_run(d, s)
        if n is None:
            p.strided.append(k)
        else:
            p.runs.append(k)
            p.run_sizes.append(n)
    return p


_plans: OrderedDict[tuple[int, int, bool], _Plan] = OrderedDict()
_plans_lock = threading.Lock()


def _plan_for_set(dst: Mapping[str, Any], ts: TensorMap, strict: bool) -> _Plan:
    """The plan of (these parameters, this layout), reused while each parameter is the same object
    at the same address."""
    layout = ts.layout
    key = (id(dst), id(layout), strict)
    with _plans_lock:
        p = _plans.get(key)
    if p is not None and p.length == len(dst):
        current = list(map(dst.get, p.names))
        # The same objects (so the same types: the plan's data_ptr applies), each where it was.
        if all(map(operator.is_, current, p.dst_objs)):
            f = p.dst_data_ptr
            if (list(map(f, current)) if f is not None else [_address(o) for o in current]) == p.dst_ptrs:
                return p
    index = layout.index
    strides, shapes, dtypes, nbytes, extents, contiguous = layout.strides, layout.shapes, layout.dtypes, layout.nbytes, layout.extents, layout.contiguous
    host, ordinals = ts._placement()

    def ref(name: str) -> tuple[int | None, _Ref | None]:
        i = index.get(name)
        if i is None:
            return None, None
        a = layout.allocations[i]
        return i, _Ref(dtypes[i], shapes[i], strides[i], nbytes[i], extents[i], host[a], ordinals[a], contiguous[i])
    p = _plan(dst, layout.names, ref, strict)
    p.keep = (dst, layout)  # the ids in the key stay theirs while the plan is cached
    with _plans_lock:
        _plans[key] = p
        _plans.move_to_end(key)
        while len(_plans) > 16:
            _plans.popitem(last=False)
    return p


def _addresses(objs: list[Any]) -> list[int]:
    """Where each tensor starts now."""
    f = torch_data_ptr(objs)
    return list(map(f, objs)) if f is not None else [_address(o) for o in objs]


def _address(obj: Any) -> int:
    if type(obj) is HostArray:
        return host_address(obj.buffer)
    dp = getattr(obj, "data_ptr", None)
    p: int = dp() if dp is not None else obj.__cuda_array_interface__["data"][0]
    return p


# ------------------------------------------------------------------------------------------------
# The update


def update_in_place(target: Any, received: TensorMap | Mapping[str, Any], *, stream: Any = None, strict: bool = True, method: str = "auto",
                    sync: bool = False) -> UpdateResult:  # noqa: C901 - one path per copy method
    """Copies each received tensor into the parameter of the same name.

    ``target``: a dict of tensors (torch tensors, CUDA arrays, HostArray) or a torch module (its
    state_dict). ``received``: a TensorMap (or a dict of tensors). ``strict`` (default): every parameter
    must be received and every received tensor must be a parameter; ``strict=False`` copies what
    matches and reports the rest. A dtype or shape mismatch fails either way, before anything is
    copied (ERR_TENSOR_MISMATCH, naming them). ``method``: 'auto' or 'kernel' (one copy_runs launch
    for the contiguous pairs), 'batch' (cuMemcpyBatchAsync), 'copy' (one cuMemcpyDtoDAsync per pair)
    or 'foreach' (torch._foreach_copy_). Device
    copies are queued on ``stream`` (a torch stream or a CUstream; default torch's current stream, or a
    stream of cuda_ipc's own ordered with the legacy default stream) and the call returns then, as
    torch's copies do: keep ``received`` open until the stream passed them (``sync=True`` waits here;
    ``TensorMap.close()`` waits for the device anyway)."""
    if method not in ("auto", "kernel", "batch", "copy", "foreach"):
        raise IpcError("ERR_INVALID_ARG", f"method must be 'auto', 'kernel', 'batch', 'copy' or 'foreach', got {method!r}")
    clock = time.perf_counter_ns
    t0 = clock()
    dst = _targets(target)
    if isinstance(received, TensorMap) and received.pending:
        # Came over a TCP link, its bytes still on the sender: received by NCCL straight into the
        # parameters where each takes it (method 'nccl'), else fetched first and copied as below.
        # Through the map (RemoteTensorSet overrides it), as Node's update.ts goes through the map's
        # RemoteTensors: update.py never imports nccl_transfer.py, which builds on it (no circle).
        remote: UpdateResult | None = received._update_from_remote(dst, stream=stream, strict=strict)
        if remote is not None:
            return remote
    if isinstance(received, TensorMap):
        received._check()
        p = _plan_for_set(dst, received, strict)
        src_ptrs = _source_pointers(p, received)
        src_obj: Callable[[str], Any] = received.tensor
    elif isinstance(received, Mapping):
        given = received
        p = _plan(dst, list(given), lambda n: (n, _describe(given[n])[0]) if n in given else (None, None), strict)
        src_ptrs = [_address(received[n]) for n in p.names]
        src_obj = received.__getitem__
    else:
        raise IpcError("ERR_INVALID_ARG", f"update_in_place: received must be a TensorMap or a dict of tensors, got {type(received).__qualname__}")
    missing = [] if strict else p.missing
    unexpected = [] if strict else p.unexpected
    t1 = clock()
    if not p.names:
        return UpdateResult(0, 0, missing, unexpected, 0, "host" if p.host else method, 0)
    if p.host:
        _copy_host(p, src_ptrs)
        return UpdateResult(len(p.names), p.bytes, missing, unexpected, 0, "host", 0)
    t2 = t1
    uploaded = 0
    with Device.get(p.ordinal).activate():
        handle = _stream_handle(stream, p.ordinal)
        if method == "foreach":
            t2 = clock()
            ops = _copy_foreach(p, src_obj, handle)
            used = "foreach"
        else:
            used = "kernel" if method == "auto" else method
            if used == "kernel":
                uploaded = _upload_table(p, src_ptrs, handle)
                t2 = clock()
                ops = _launch_table(p, handle)
            else:
                t2 = clock()
                ops = _copy_runs(p, src_ptrs, handle, used)
            ops += _copy_strided(p, src_obj, handle)
        t3 = clock()
        if sync:
            drv.driver().call("cuStreamSynchronize", c_void_p(handle))
        t4 = clock()
    timings = {"plan": (t1 - t0) / 1000, "table": (t2 - t1) / 1000, "launch": (t3 - t2) / 1000, "sync": (t4 - t3) / 1000, "uploaded": float(uploaded)}
    return UpdateResult(len(p.names), p.bytes, missing, unexpected, ops, used, handle, timings)


def _source_pointers(p: _Plan, ts: TensorMap) -> list[int]:
    """Source addresses of the plan's pairs in this message (cached while the allocations map to the
    same bases: a repeated send of the same segments)."""
    bases = tuple(ts.bases())
    if p._bases is not None and p._bases[0] == bases:
        return p._bases[1]
    L = ts.layout
    ptrs = [bases[L.allocations[i]] + L.offsets[i] for i in p.src_index]
    p._bases = (bases, ptrs)
    p._arrays = None
    return ptrs


def _upload_table(p: _Plan, src_ptrs: list[int], stream: int) -> int:
    """The plan's copy_runs table for these source addresses, on the device (built and uploaded only
    when the addresses changed: a repeated sync of the same mappings uploads nothing)."""
    if not p.runs:
        return 0
    made = p._table
    if made is None or made[0] is not src_ptrs:
        table = plan_runs([p.dst_ptrs[k] for k in p.runs], [src_ptrs[k] for k in p.runs], p.run_sizes)
        made = p._table = (src_ptrs, table)
    if p._device_table is None:
        p._device_table = DeviceTable(p.ordinal)
    return len(made[1].data) if p._device_table.upload(made[1], stream) else 0


def _launch_table(p: _Plan, stream: int) -> int:
    if not p.runs or p._table is None or p._device_table is None:
        return 0
    p._device_table.launch(p._table[1], stream)
    return 1


def _copy_runs(p: _Plan, src_ptrs: list[int], stream: int, method: str) -> int:
    if not p.runs:
        return 0
    arrays = p._arrays
    if arrays is None or arrays[0] is not src_ptrs:
        n = len(p.runs)
        dsts = (c_uint64 * n)(*[p.dst_ptrs[k] for k in p.runs])
        srcs = (c_uint64 * n)(*[src_ptrs[k] for k in p.runs])
        sizes = (c_size_t * n)(*p.run_sizes)
        arrays = p._arrays = (src_ptrs, dsts, srcs, sizes)
    _, dsts, srcs, sizes = arrays
    n = len(p.runs)
    if method == "batch":
        attrs = CUmemcpyAttributes()
        attrs.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM
        idx = (c_size_t * 1)(0)
        fail = c_size_t(~0 & 0xFFFFFFFFFFFFFFFF)
        try:
            _call("cuMemcpyBatchAsync", dsts, srcs, sizes, n, byref(attrs), idx, 1, byref(fail), c_void_p(stream))
        except CudaError as e:
            which = f" (copy #{fail.value}: {p.names[p.runs[fail.value]]!r})" if fail.value < n else ""
            raise CudaError(e.status, e.code, e.description, f"cuMemcpyBatchAsync{which}") from None
        return 1
    for k in range(n):
        _call("cuMemcpyDtoDAsync", dsts[k], srcs[k], sizes[k], c_void_p(stream))
    return n


def _torch_for(what: str) -> ModuleType:
    torch = sys.modules.get("torch")
    if torch is None:
        raise IpcError("ERR_UNSUPPORTED", f"update_in_place needs torch for {what}")
    return torch


def _copy_strided(p: _Plan, src_obj: Callable[[str], Any], stream: int) -> int:
    """Pairs that are not one run of bytes: torch's copy_ on the same stream."""
    if not p.strided:
        return 0
    torch = _torch_for(f"the {len(p.strided)} pairs whose layouts differ (e.g. {p.names[p.strided[0]]!r})")
    with torch.no_grad(), torch.cuda.stream(torch.cuda.ExternalStream(stream)):
        for k in p.strided:
            _as_torch(p.dst_objs[k], torch).copy_(_as_torch(src_obj(p.names[k]), torch))
    return len(p.strided)


def _copy_foreach(p: _Plan, src_obj: Callable[[str], Any], stream: int) -> int:
    torch = _torch_for("method='foreach'")
    dsts = [_as_torch(o, torch) for o in p.dst_objs]
    srcs = [_as_torch(src_obj(n), torch) for n in p.names]
    with torch.no_grad(), torch.cuda.stream(torch.cuda.ExternalStream(stream)):
        torch._foreach_copy_(dsts, srcs)
    return 1


def _as_torch(obj: Any, torch: ModuleType) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj
    return torch.as_tensor(obj, device="cuda")


def _copy_host(p: _Plan, src_ptrs: list[int]) -> None:
    memmove = ctypes.memmove
    for k, n in zip(p.runs, p.run_sizes):
        memmove(p.dst_ptrs[k], src_ptrs[k], n)
    for k in p.strided:
        d, _ = _describe(p.dst_objs[k])
        dst_off = c_offsets(d.shape, d.strides)
        src_off = c_offsets(d.shape, p.src_strides[k])
        itemsize = DTYPES[d.dtype][0]
        for a, b in zip(dst_off, src_off):
            memmove(p.dst_ptrs[k] + a, src_ptrs[k] + b, itemsize)

