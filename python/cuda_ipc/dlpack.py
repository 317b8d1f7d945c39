"""DLPack capsules made with ctypes, so that ``torch.from_dlpack(buf)``, ``cupy.from_dlpack(buf)`` and
``numpy.from_dlpack(buf)`` view cuda-ipc memory without a copy and without any compiled code.

The capsule holds a legacy (unversioned, v0.x ABI) ``DLManagedTensor`` named "dltensor", which every
consumer accepts. The managed tensor keeps its owner (the cuda-ipc buffer) alive until the consumer
calls its deleter, or until the capsule is destroyed unconsumed.
"""
from __future__ import annotations

import ctypes
import threading

DL_CPU = 1
DL_CUDA = 2

_DTYPE_CODES = {"i": 0, "u": 1, "f": 2, "V": 4, "b": 6}  # kDLInt, kDLUInt, kDLFloat, kDLBfloat (V2), kDLBool


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class DLManagedTensor(ctypes.Structure):
    pass


_Deleter = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensor))
DLManagedTensor._fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", _Deleter)]

# Everything a live managed tensor needs, by the address of its struct; the deleter drops it.
_live: dict[int, tuple] = {}
_live_lock = threading.Lock()


def _delete(managed_ptr) -> None:
    addr = ctypes.cast(managed_ptr, ctypes.c_void_p).value
    with _live_lock:
        _live.pop(addr, None)


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


def _destroy_capsule(capsule_addr) -> None:
    # A consumer renames the capsule ("used_dltensor") and owns the tensor; only an unconsumed
    # capsule still holds it.
    if _is_valid(capsule_addr, _NAME.value):
        ptr = _get_pointer(capsule_addr, _NAME.value)
        if ptr:
            _delete(ctypes.cast(ptr, ctypes.POINTER(DLManagedTensor)))


_destructor = _Destructor(_destroy_capsule)
_DESTRUCTOR_ADDR = ctypes.cast(_destructor, ctypes.c_void_p).value


def dl_dtype(typestr: str) -> DLDataType:
    """The DLPack dtype of a NumPy typestr ('<f4', '|u1', '<V2' = bfloat16, '|b1')."""
    kind = typestr[1]
    size = int(typestr[2:])
    if kind not in _DTYPE_CODES or (kind == "V" and size != 2):
        raise BufferError(f"DLPack cannot describe the dtype {typestr}")
    return DLDataType(_DTYPE_CODES[kind], size * 8, 1)


def make_capsule(ptr: int, device: tuple[int, int], typestr: str, shape, strides_bytes, owner) -> object:
    """A "dltensor" capsule for memory at ``ptr`` (shape in elements, strides in bytes or None for
    C-contiguous); ``owner`` stays referenced until the consumer is done with the memory."""
    dtype = dl_dtype(typestr)
    itemsize = dtype.bits // 8
    ndim = len(shape)
    shape_arr = (ctypes.c_int64 * max(ndim, 1))(*shape)
    strides_arr = None
    if strides_bytes is not None:
        for s in strides_bytes:
            if s % itemsize:
                raise BufferError("DLPack strides are in elements: a byte stride must be a multiple of the item size")
        strides_arr = (ctypes.c_int64 * max(ndim, 1))(*[s // itemsize for s in strides_bytes])
    managed = DLManagedTensor()
    t = managed.dl_tensor
    t.data = ptr
    t.device = DLDevice(*device)
    t.ndim = ndim
    t.dtype = dtype
    t.shape = ctypes.cast(shape_arr, ctypes.POINTER(ctypes.c_int64))
    t.strides = ctypes.cast(strides_arr, ctypes.POINTER(ctypes.c_int64)) if strides_arr is not None else None
    t.byte_offset = 0
    managed.manager_ctx = None
    managed.deleter = _deleter
    addr = ctypes.addressof(managed)
    with _live_lock:
        _live[addr] = (managed, shape_arr, strides_arr, owner)
    try:
        return _api.PyCapsule_New(addr, ctypes.addressof(_NAME), _DESTRUCTOR_ADDR)
    except BaseException:
        with _live_lock:
            _live.pop(addr, None)
        raise


def live_tensors() -> int:
    """Managed tensors handed out and not deleted yet (for tests)."""
    return len(_live)
