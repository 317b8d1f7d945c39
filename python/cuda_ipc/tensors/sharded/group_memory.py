"""The memories of a sync group's rank (src/tensors/sharded/group-memory.ts): its own source and
destination tensors checked against its layout (HostArray for host memory; torch CUDA tensors, a
DTensor's local tensor, or anything with ``__cuda_array_interface__`` for device memory), and a
source rank's tensor set as received here checked against that rank's layout."""
from __future__ import annotations

import sys
from typing import Any, Sequence

from ...errors import IpcError
from ...arrays.host_array import HostArray
from ...arrays.device_array import DeviceArray
from .host_copy import DeviceMemory, HostMemory, RunMemory
from .layout import LocalTensor


def _extent(shape: Sequence[int], strides: Sequence[int], size: int) -> int:
    return sum((n - 1) * s for n, s in zip(shape, strides)) + size


def _facts(obj: Any) -> tuple[str, tuple[int, ...], tuple[int, ...], RunMemory]:
    """dtype, shape, byte strides and memory of a tensor given by the user or received."""
    if isinstance(obj, HostArray):
        return obj.dtype, obj.shape, obj.strides, HostMemory(obj.memory)
    if isinstance(obj, DeviceArray):  # a received tensor set's view: its own dtype names bfloat16 and float8 exactly
        return obj.dtype, obj.shape, obj.meta.strides, DeviceMemory(int(obj.__dlpack_device__()[1]), obj.ptr, obj.meta.extent)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor):
        to_local = getattr(obj, "to_local", None)
        if callable(to_local):  # a DTensor: its local shard is the memory
            obj = to_local()
        if not obj.is_cuda:
            raise IpcError("ERR_INVALID_ARG", "a sync group takes CUDA tensors or HostArrays; a CPU torch tensor is neither "
                           "(put host weights in a HostArray: HostArray.allocate)")
        dtype = str(obj.dtype).replace("torch.", "")
        size = obj.element_size()
        strides = tuple(int(s) * size for s in obj.stride())
        shape = tuple(int(n) for n in obj.shape)
        return dtype, shape, strides, DeviceMemory(obj.device.index or 0, int(obj.data_ptr()), _extent(shape, strides, size))
    cai = getattr(obj, "__cuda_array_interface__", None)
    if isinstance(cai, dict):
        from ...ipc.descriptor import ArrayMeta, dtype_name
        shape = tuple(int(n) for n in cai["shape"])
        meta = ArrayMeta.make(dtype_name(cai["typestr"]), shape, cai.get("strides"))
        where = getattr(obj, "__dlpack_device__", None)
        device = getattr(obj, "device", None)
        ordinal = int(where()[1]) if callable(where) else device if isinstance(device, int) else \
            int(getattr(device, "ordinal", getattr(device, "index", 0)) or 0)
        return meta.dtype, meta.shape, meta.strides, DeviceMemory(ordinal, int(cai["data"][0]), meta.extent)
    raise IpcError("ERR_INVALID_ARG", f"a sync group takes HostArrays (host memory) or CUDA tensors/arrays, not a {type(obj).__qualname__}")


def local_memories(locals_: Sequence[LocalTensor], given: Sequence[Any], role: str, gpu: int) -> list[RunMemory]:
    """The memories of a rank's ``role`` tensors ('sources' / 'destinations'), in layout order, each
    checked against its local tensor (dtype, shape, byte strides). All host, or all on ``gpu``."""
    if len(given) != len(locals_):
        raise IpcError("ERR_INVALID_ARG", f"the layout has {len(locals_)} {role} ({', '.join(t.name for t in locals_) or 'none'}) "
                       f"and {len(given)} tensors were given for them; give one per {role[:-1]}, in layout order")
    out: list[RunMemory] = []
    for local, obj in zip(locals_, given):
        dtype, shape, strides, memory = _facts(obj)
        _match(local, dtype, shape, strides, f"the tensor given for {role[:-1]} {local.name!r}")
        if isinstance(memory, DeviceMemory) and memory.device != gpu:
            raise IpcError("ERR_INVALID_ARG", f"{role[:-1]} {local.name!r} is on GPU {memory.device} but the layout says GPU {gpu}")
        out.append(memory)
    kinds = {type(m) for m in out}
    if len(kinds) > 1:
        raise IpcError("ERR_SHARD_MEMORY", f"the {role} mix host and device memory; a rank's tensors are all HostArrays or all on its GPU")
    return out


def received_memories(locals_: Sequence[LocalTensor], tensors: Any, rank: int) -> tuple[list[RunMemory], list[Any]]:
    """The memories of source rank ``rank``'s tensor set as received (views by layout name), checked
    against that rank's layout; and the views (closed with the set)."""
    out: list[RunMemory] = []
    views: list[Any] = []
    for local in locals_:
        if local.name not in tensors:
            raise IpcError("ERR_SHARD_PROTOCOL", f"rank {rank}'s tensor set has no {local.name!r}, a source of its layout")
        view = tensors.view(local.name)
        views.append(view)
        dtype, shape, strides, memory = _facts(view)
        _match(local, dtype, shape, strides, f"rank {rank}'s shared tensor {local.name!r}", code="ERR_SHARD_PROTOCOL")
        out.append(memory)
    return out, views


def _match(local: LocalTensor, dtype: str, shape: tuple[int, ...], strides: tuple[int, ...], what: str, code: str = "ERR_INVALID_ARG") -> None:
    same_strides = all(a == b for n, a, b in zip(shape, strides, local.strides) if n > 1)  # a length-1 dimension's stride is free
    if dtype != local.dtype or shape != local.shape or not same_strides:
        raise IpcError(code, f"{what} is {dtype} {list(shape)} with byte strides {list(strides)}, but the layout says {local.dtype} "
                       f"{list(local.shape)} with byte strides {list(local.strides)}")


def memory_kind(memories: Sequence[RunMemory]) -> str | None:
    """'host', 'device' or None (no tensors)."""
    if not memories:
        return None
    return "host" if isinstance(memories[0], HostMemory) else "device"



def rank_kind(sources: Sequence[RunMemory], destinations: Sequence[RunMemory]) -> str:
    """'host' or 'device' for a rank's memories (host when it has none); mixed is refused."""
    kinds = {k for k in (memory_kind(sources), memory_kind(destinations)) if k is not None}
    if len(kinds) > 1:
        raise IpcError("ERR_SHARD_MEMORY", "a rank's sources and destinations are all HostArrays or all on its GPU, not both")
    return kinds.pop() if kinds else "host"
