"""DLPack capsules made with ctypes, so that ``torch.from_dlpack(buf)``, ``cupy.from_dlpack(buf)`` and
``numpy.from_dlpack(buf)`` view cuda-ipc memory without a copy and without any compiled code.

The capsule holds a legacy (unversioned, v0.x ABI) ``DLManagedTensor`` named "dltensor", which every
consumer accepts. The managed tensor keeps its owner (the cuda-ipc buffer) alive until the consumer
calls its deleter, or until the capsule is destroyed unconsumed.
"""
from __future__ import annotations

import ctypes
import threading
from collections.abc import Sequence
from typing import Any

DL_CPU = 1
DL_CUDA = 2

_DTYPE_CODES = {"i": 0, "u": 1, "f": 2, "V": 4, "b": 6}  # kDLInt, kDLUInt, kDLFloat, kDLBfloat (V2), kDLBool


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    # shape and strides are int64_t* in the ABI; held as plain addresses here so that they can be
    # pointed into the same allocation as the struct (see _holder) without ctypes casts.
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.c_void_p),
        ("strides", ctypes.c_void_p),
        ("byte_offset", ctypes.c_uint64),
    ]


class DLManagedTensor(ctypes.Structure):
    pass


_Deleter = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensor))
DLManagedTensor._fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", _Deleter)]

# Everything a live managed tensor needs, by the address of its struct; the deleter drops it.
_live: dict[int, tuple[Any, Any]] = {}
_live_lock = threading.Lock()


def _delete(managed_ptr: Any) -> None:
    addr = ctypes.cast(managed_ptr, ctypes.c_void_p).value
    with _live_lock:
        _live.pop(addr or 0, None)


_deleter = _Deleter(_delete)

_NAME = ctypes.create_string_buffer(b"dltensor")
_api = ctypes.pythonapi
_api.PyCapsule_New.restype = ctypes.py_object
_api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
# The destructor runs while the capsule is being destroyed: it must not touch the capsule's
# reference count, so it sees the capsule as a plain address.
_is_valid = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)(("PyCapsule_IsValid", _api))
_get_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)(("PyCapsule_GetPointer", _api))
_Destructor = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


def _destroy_capsule(capsule_addr: int) -> None:
    # A consumer renames the capsule ("used_dltensor") and owns the tensor; only an unconsumed
    # capsule still holds it.
    if _is_valid(capsule_addr, _NAME.value):
        ptr = _get_pointer(capsule_addr, _NAME.value)
        if ptr:
            _delete(ctypes.cast(ptr, ctypes.POINTER(DLManagedTensor)))


_destructor = _Destructor(_destroy_capsule)
_DESTRUCTOR_ADDR = ctypes.cast(_destructor, ctypes.c_void_p).value


_DTYPES: dict[str, tuple[int, int, int]] = {}


def dl_dtype(typestr: str) -> DLDataType:
    """The DLPack dtype of a NumPy typestr ('<f4', '|u1', '<V2' = bfloat16, '|b1')."""
    kind = typestr[1]
    size = int(typestr[2:])
    if kind not in _DTYPE_CODES or (kind == "V" and size != 2):
        raise BufferError(f"DLPack cannot describe the dtype {typestr}")
    return DLDataType(_DTYPE_CODES[kind], size * 8, 1)


_holders: dict[int, Any] = {}


def _holder(ndim: int) -> Any:
    """A struct holding a managed tensor and its shape and strides, in one allocation."""
    cls = _holders.get(ndim)
    if cls is None:
        cls = type(f"_DLHolder{ndim}", (ctypes.Structure,), {"_fields_": [
            ("managed", DLManagedTensor), ("shape", ctypes.c_int64 * max(ndim, 1)), ("strides", ctypes.c_int64 * max(ndim, 1))]})
        _holders[ndim] = cls
    return cls


def make_capsule(ptr: int, device: tuple[int, int], typestr: str, shape: Sequence[int], strides_bytes: Sequence[int] | None,
                 owner: object) -> object:
    """A "dltensor" capsule for memory at ``ptr`` (shape in elements, strides in bytes or None for
    C-contiguous); ``owner`` stays referenced until the consumer is done with the memory."""
    dt = _DTYPES.get(typestr)
    if dt is None:
        d = dl_dtype(typestr)
        dt = _DTYPES[typestr] = (d.code, d.bits, d.bits // 8)
    code, bits, itemsize = dt
    ndim = len(shape)
    cls = _holder(ndim)
    h = cls()
    addr = ctypes.addressof(h)
    h.shape[:ndim] = shape
    t = h.managed.dl_tensor
    t.data = ptr
    t.device.device_type = device[0]
    t.device.device_id = device[1]
    t.ndim = ndim
    t.dtype.code = code
    t.dtype.bits = bits
    t.dtype.lanes = 1
    t.shape = addr + cls.shape.offset
    if strides_bytes is not None:
        for s in strides_bytes:
            if s % itemsize:
                raise BufferError("DLPack strides are in elements: a byte stride must be a multiple of the item size")
        h.strides[:ndim] = [s // itemsize for s in strides_bytes]
        t.strides = addr + cls.strides.offset
    h.managed.deleter = _deleter
    with _live_lock:
        _live[addr] = (h, owner)
    try:
        return _api.PyCapsule_New(addr, ctypes.addressof(_NAME), _DESTRUCTOR_ADDR)
    except BaseException:
        with _live_lock:
            _live.pop(addr, None)
        raise


def live_tensors() -> int:
    """Managed tensors handed out and not deleted yet (for tests)."""
    return len(_live)
