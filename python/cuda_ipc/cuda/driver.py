"""The CUDA driver through ctypes: libcuda.so.1 is loaded on first use (importing cuda_ipc needs no
driver), entry points are resolved with cuGetProcAddress for the same ABI version as the Node addon
(12000), and every call is checked: a failure raises CudaError with the driver's code name.
"""
from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable
from ctypes import POINTER, byref, c_char, c_int, c_size_t, c_uint, c_uint64, c_ulonglong, c_void_p

from typing import Any, Optional

from ..errors import CudaError

ABI_VERSION = 12000

CUresult = c_int
CUdevice = c_int
CUdeviceptr = c_uint64
CUcontext = c_void_p
CUstream = c_void_p
CUevent = c_void_p
CUmemoryPool = c_void_p


class CUuuid(ctypes.Structure):
    # Unsigned bytes, not c_char: a c_char array field reads as a C string, cut at the first zero
    # byte (an H200's GPU-001e4106-... read as 'GPU----', hidden from every Python process).
    _fields_ = [("bytes", ctypes.c_ubyte * 16)]


class CUipcMemHandle(ctypes.Structure):
    _fields_ = [("reserved", c_char * 64)]


class CUipcEventHandle(ctypes.Structure):
    _fields_ = [("reserved", c_char * 64)]


class CUmemPoolPtrExportData(ctypes.Structure):
    _fields_ = [("reserved", c_char * 64)]


class CUmemLocation(ctypes.Structure):
    _fields_ = [("type", c_int), ("id", c_int)]


class CUmemAccessDesc(ctypes.Structure):
    _fields_ = [("location", CUmemLocation), ("flags", c_int)]


CU_POINTER_ATTRIBUTE_CONTEXT = 1
CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2
CU_POINTER_ATTRIBUTE_IS_MANAGED = 8
CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9
CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE = 17
CU_POINTER_ATTRIBUTE_BUFFER_ID = 7
CU_POINTER_ATTRIBUTE_RANGE_START_ADDR = 11
CU_POINTER_ATTRIBUTE_RANGE_SIZE = 12
CU_MEMORYTYPE_HOST = 1
CU_MEMORYTYPE_DEVICE = 2
CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS = 1
CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 1
CU_MEM_LOCATION_TYPE_DEVICE = 1
CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3
CUDA_ERROR_INVALID_VALUE = 1
CUDA_ERROR_NOT_READY = 600
CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED = 704
CU_MEMHOSTREGISTER_PORTABLE = 1
CU_MEMHOSTREGISTER_DEVICEMAP = 2
CU_STREAM_WAIT_VALUE_GEQ = 0
CU_STREAM_WRITE_VALUE_DEFAULT = 0

# name: (argtypes); every entry point returns CUresult.
_SIGNATURES: dict[str, tuple[Any, ...]] = {
    "cuGetErrorName": (CUresult, POINTER(ctypes.c_char_p)),
    "cuGetErrorString": (CUresult, POINTER(ctypes.c_char_p)),
    "cuInit": (c_uint,),
    "cuDriverGetVersion": (POINTER(c_int),),
    "cuDeviceGetCount": (POINTER(c_int),),
    "cuDeviceGet": (POINTER(CUdevice), c_int),
    "cuDeviceGetUuid": (POINTER(CUuuid), CUdevice),
    "cuDeviceGetName": (ctypes.c_char_p, c_int, CUdevice),
    "cuDeviceGetAttribute": (POINTER(c_int), c_int, CUdevice),
    "cuDevicePrimaryCtxRetain": (POINTER(CUcontext), CUdevice),
    "cuCtxGetCurrent": (POINTER(CUcontext),),
    "cuCtxPushCurrent": (CUcontext,),
    "cuCtxPopCurrent": (POINTER(CUcontext),),
    "cuCtxSynchronize": (),
    "cuMemGetAddressRange": (POINTER(CUdeviceptr), POINTER(c_size_t), CUdeviceptr),
    "cuPointerGetAttribute": (c_void_p, c_int, CUdeviceptr),
    "cuMemcpyHtoD": (CUdeviceptr, c_void_p, c_size_t),
    "cuMemcpyDtoH": (c_void_p, CUdeviceptr, c_size_t),
    "cuMemAlloc": (POINTER(CUdeviceptr), c_size_t),
    "cuMemFree": (CUdeviceptr,),
    "cuIpcGetMemHandle": (POINTER(CUipcMemHandle), CUdeviceptr),
    "cuIpcOpenMemHandle": (POINTER(CUdeviceptr), CUipcMemHandle, c_uint),
    "cuIpcCloseMemHandle": (CUdeviceptr,),
    "cuIpcOpenEventHandle": (POINTER(CUevent), CUipcEventHandle),
    "cuEventDestroy": (CUevent,),
    "cuEventSynchronize": (CUevent,),
    "cuEventQuery": (CUevent,),
    "cuStreamWaitEvent": (CUstream, CUevent, c_uint),
    "cuStreamSynchronize": (CUstream,),
    "cuStreamDestroy": (CUstream,),
    "cuMemPoolImportFromShareableHandle": (POINTER(CUmemoryPool), c_void_p, c_int, c_ulonglong),
    "cuMemPoolExportToShareableHandle": (c_void_p, CUmemoryPool, c_int, c_ulonglong),
    "cuMemPoolSetAccess": (CUmemoryPool, POINTER(CUmemAccessDesc), c_size_t),
    "cuMemPoolImportPointer": (POINTER(CUdeviceptr), CUmemoryPool, POINTER(CUmemPoolPtrExportData)),
    "cuMemPoolExportPointer": (POINTER(CUmemPoolPtrExportData), CUdeviceptr),
    "cuMemPoolDestroy": (CUmemoryPool,),
    "cuMemHostRegister": (c_void_p, c_size_t, c_uint),
    "cuMemHostUnregister": (c_void_p,),
    "cuMemHostGetDevicePointer": (POINTER(CUdeviceptr), c_void_p, c_uint),
    "cuStreamQuery": (CUstream,),
    "cuStreamWaitValue32": (CUstream, CUdeviceptr, ctypes.c_uint32, c_uint),
    "cuStreamWriteValue32": (CUstream, CUdeviceptr, ctypes.c_uint32, c_uint),
    "cuCtxSetCurrent": (CUcontext,),
    "cuPointerGetAttributes": (c_uint, POINTER(c_int), POINTER(c_void_p), CUdeviceptr),
    "cuDeviceCanAccessPeer": (POINTER(c_int), CUdevice, CUdevice),
    "cuCtxEnablePeerAccess": (CUcontext, c_uint),
}

#: An entry point: called with its arguments, returns the CUresult.
DriverFunction = Callable[..., int]

#: Entry points called keeping Python's GIL (ctypes.PYFUNCTYPE, as PyTorch makes its CUDA calls):
#: each returns within microseconds and waits for no other thread, while a call that gives the GIL
#: away waits a whole switch interval (5 ms) to get it back when another Python thread is busy.
#: Everything that may wait (synchronize, allocate, map, open, copy from host memory) gives it away.
KEEPS_GIL = frozenset({
    "cuGetErrorName", "cuGetErrorString", "cuDeviceGet", "cuDeviceGetAttribute", "cuCtxGetCurrent", "cuCtxPushCurrent",
    "cuCtxPopCurrent", "cuCtxSetCurrent", "cuPointerGetAttribute", "cuPointerGetAttributes", "cuMemGetAddressRange",
    "cuEventQuery", "cuStreamQuery", "cuStreamWaitEvent", "cuStreamWaitValue32", "cuStreamWriteValue32",
    # resolved on first use (_EXTRA):
    "cuEventRecord", "cuLaunchKernel", "cuMemcpyDtoDAsync",
})


def _entry(name: str, restype: Any, argtypes: tuple[Any, ...], address: int) -> DriverFunction:
    """The function at ``address``, called keeping the GIL where KEEPS_GIL says so."""
    prototype = ctypes.PYFUNCTYPE(restype, *argtypes) if name in KEEPS_GIL else ctypes.CFUNCTYPE(restype, *argtypes)
    fn: DriverFunction = prototype(address)
    return fn


_lock = threading.Lock()
_driver: "_Driver | None" = None
_load_error: CudaError | None = None


class _Driver:
    def __init__(self) -> None:
        try:
            lib = ctypes.CDLL("libcuda.so.1")
        except OSError as e:
            raise CudaError(-1, "CUDA_DRIVER_NOT_FOUND",
                            f"the NVIDIA driver library libcuda.so.1 could not be loaded ({e}). Install the NVIDIA driver, or run where a GPU is visible",
                            "dlopen(libcuda.so.1)") from None
        try:
            get_proc = lib.cuGetProcAddress_v2
        except AttributeError:
            raise CudaError(-1, "CUDA_DRIVER_NOT_FOUND",
                            "libcuda.so.1 has no cuGetProcAddress_v2: the NVIDIA driver is older than CUDA 12.0; update the driver",
                            "dlsym(cuGetProcAddress_v2)") from None
        get_proc.restype = CUresult
        get_proc.argtypes = [ctypes.c_char_p, POINTER(c_void_p), c_int, c_uint64, POINTER(c_int)]
        self._fns: dict[str, DriverFunction] = {}
        for name, argtypes in _SIGNATURES.items():
            pfn = c_void_p()
            status = c_int()
            if get_proc(name.encode(), byref(pfn), ABI_VERSION, 0, byref(status)) == 0 and pfn.value:
                self._fns[name] = _entry(name, CUresult, argtypes, pfn.value)
        r = self._raw("cuInit")(0)
        if r != 0:
            raise self.error(r, "cuInit")

    def _raw(self, name: str) -> DriverFunction:
        fn = self._fns.get(name)
        if fn is None:
            raise CudaError(-2, "CUDA_SYMBOL_NOT_FOUND", f"the installed driver does not provide {name}: update the NVIDIA driver",
                            f"cuGetProcAddress({name})")
        return fn

    def error(self, status: int, call: str, hint: str | None = None) -> CudaError:
        name = ctypes.c_char_p()
        desc = ctypes.c_char_p()
        n = self._fns.get("cuGetErrorName")
        d = self._fns.get("cuGetErrorString")
        code = name.value.decode() if n and n(status, byref(name)) == 0 and name.value else "CUDA_ERROR_UNKNOWN_STATUS"
        text = desc.value.decode() if d and d(status, byref(desc)) == 0 and desc.value else "unrecognized error code"
        return CudaError(status, code, text, call, hint)

    def call(self, name: str, *args: Any) -> None:
        r = self._raw(name)(*args)
        if r != 0:
            raise self.error(r, name)

    def status(self, name: str, *args: Any) -> int:
        """Calls and returns the status, for queries that answer NOT_READY."""
        return self._raw(name)(*args)


def driver() -> _Driver:
    """The loaded, initialised driver; raises CudaError (CUDA_DRIVER_NOT_FOUND, ...) otherwise."""
    global _driver, _load_error
    d = _driver
    if d is not None:
        return d
    with _lock:
        if _driver is None:
            if _load_error is not None:
                raise CudaError(_load_error.status, _load_error.code, _load_error.description, _load_error.call)
            try:
                _driver = _Driver()
            except CudaError as e:
                _load_error = e
                raise
        return _driver


def available() -> str | None:
    """None where the driver loads and sees a device, else the reason."""
    try:
        d = driver()
        n = c_int()
        d.call("cuDeviceGetCount", byref(n))
        return None if n.value > 0 else "the CUDA driver sees no device"
    except CudaError as e:
        return str(e)


# Small typed wrappers, used by device.py and memory.py.

def ptr_attribute_int(attr: int, ptr: int) -> int:
    v = c_uint()
    driver().call("cuPointerGetAttribute", byref(v), attr, ptr)
    return v.value


def ptr_attribute_u64(attr: int, ptr: int) -> int:
    v = c_uint64()
    driver().call("cuPointerGetAttribute", byref(v), attr, ptr)
    return v.value


_FACTS = (CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, CU_POINTER_ATTRIBUTE_IS_MANAGED, CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
          CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, CU_POINTER_ATTRIBUTE_RANGE_SIZE, CU_POINTER_ATTRIBUTE_BUFFER_ID)
_FACT_ATTRS = (c_int * len(_FACTS))(*_FACTS)


class PointerFacts(ctypes.Structure):
    """What cuPointerGetAttributes tells about a pointer, in one driver call (each field 8 bytes, zeroed:
    the 4-byte answers land in the low half)."""

    _fields_ = [("pool", c_uint64), ("managed", c_uint64), ("memory_type", c_uint64), ("base", c_uint64), ("size", c_uint64),
                ("buffer_id", c_uint64)]


def pointer_facts(ptr: int) -> PointerFacts:
    """Pool handle (0: not pool memory), managed, memory type, allocation base and size, and the
    allocation's process-wide unique id, of a device pointer (a context must be current)."""
    facts = PointerFacts()
    at = ctypes.addressof(facts)
    slots = (c_void_p * len(_FACTS))(*(at + 8 * i for i in range(len(_FACTS))))
    driver().call("cuPointerGetAttributes", len(_FACTS), _FACT_ATTRS, slots, ptr)
    return facts


def address_range(ptr: int) -> tuple[int, int]:
    base = CUdeviceptr()
    size = c_size_t()
    driver().call("cuMemGetAddressRange", byref(base), byref(size), ptr)
    return base.value, size.value


def ipc_get_mem_handle(base: int) -> bytes:
    h = CUipcMemHandle()
    driver().call("cuIpcGetMemHandle", byref(h), base)
    return ctypes.string_at(ctypes.addressof(h), 64)


def ipc_open_mem_handle(handle: bytes) -> int:
    h = CUipcMemHandle()
    ctypes.memmove(ctypes.addressof(h), handle, 64)
    p = CUdeviceptr()
    driver().call("cuIpcOpenMemHandle", byref(p), h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)
    return p.value


def pool_export_pointer(base: int) -> bytes:
    d = CUmemPoolPtrExportData()
    driver().call("cuMemPoolExportPointer", byref(d), base)
    return ctypes.string_at(ctypes.addressof(d), 64)


def pool_import_pointer(pool: int, export_data: bytes) -> int:
    d = CUmemPoolPtrExportData()
    ctypes.memmove(ctypes.addressof(d), export_data, 64)
    p = CUdeviceptr()
    driver().call("cuMemPoolImportPointer", byref(p), c_void_p(pool), byref(d))
    return p.value


def pool_import_from_fd(fd: int) -> int:
    pool = CUmemoryPool()
    driver().call("cuMemPoolImportFromShareableHandle", byref(pool), c_void_p(fd), CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0)
    return pool.value or 0


def pool_export_fd(pool: int) -> int:
    fd = c_int(-1)
    driver().call("cuMemPoolExportToShareableHandle", byref(fd), c_void_p(pool), CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0)
    return fd.value


def pool_set_access(pool: int, ordinal: int) -> None:
    desc = CUmemAccessDesc(CUmemLocation(CU_MEM_LOCATION_TYPE_DEVICE, ordinal), CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
    driver().call("cuMemPoolSetAccess", c_void_p(pool), byref(desc), 1)


def memcpy_dtoh(dst_addr: int, src: int, nbytes: int) -> None:
    driver().call("cuMemcpyDtoH", c_void_p(dst_addr), src, nbytes)


def memcpy_htod(dst: int, src_addr: int, nbytes: int) -> None:
    driver().call("cuMemcpyHtoD", dst, c_void_p(src_addr), nbytes)


# ------------------------------------------------------------------------------------------------
# Entry points beyond the table above (batch copies, streams, events, modules and launches), each resolved
# at its own ABI version on first use: the copy kernels (tensors/kernels.py) and cuda/stream.py call them.


class CUmemcpyAttributes(ctypes.Structure):
    _fields_ = [("srcAccessOrder", c_int), ("srcLocHint", CUmemLocation), ("dstLocHint", CUmemLocation), ("flags", c_uint)]


CU_MEMCPY_SRC_ACCESS_ORDER_STREAM = 1

_EXTRA: dict[str, tuple[int, tuple[Any, ...]]] = {
    # The CUDA 12.8 form (with failIdx), which CUDA 13 drivers serve too.
    "cuMemcpyBatchAsync": (12080, (POINTER(c_uint64), POINTER(c_uint64), POINTER(c_size_t), c_size_t, POINTER(CUmemcpyAttributes),
                                   POINTER(c_size_t), c_size_t, POINTER(c_size_t), c_void_p)),
    "cuStreamCreate": (12000, (POINTER(c_void_p), c_uint)),
    "cuMemcpyDtoDAsync": (12000, (c_uint64, c_uint64, c_size_t, c_void_p)),
    "cuMemcpyHtoDAsync": (12000, (c_uint64, c_void_p, c_size_t, c_void_p)),
    "cuModuleLoadData": (12000, (POINTER(c_void_p), c_void_p)),
    "cuModuleGetFunction": (12000, (POINTER(c_void_p), c_void_p, ctypes.c_char_p)),
    "cuLaunchKernel": (12000, (c_void_p, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_void_p, POINTER(c_void_p), POINTER(c_void_p))),
    "cuEventCreate": (12000, (POINTER(c_void_p), c_uint)),
    "cuEventRecord": (12000, (c_void_p, c_void_p)),
}
_entries: dict[str, Optional[DriverFunction]] = {}
_entries_lock = threading.Lock()


def extra_entry(name: str) -> DriverFunction | None:
    """The driver's entry point ``name``, or None where the driver lacks it."""
    d = driver()
    if not isinstance(d, _Driver):  # a stand-in driver (tests): its own raw entry, if it has one
        return d._raw(name) if hasattr(d, "raw_" + name) else None
    with _entries_lock:
        if name in _entries:
            return _entries[name]
        version, argtypes = _EXTRA[name]
        lib = ctypes.CDLL("libcuda.so.1")
        get_proc = lib.cuGetProcAddress_v2
        get_proc.restype = c_int
        get_proc.argtypes = [ctypes.c_char_p, POINTER(c_void_p), c_int, c_uint64, POINTER(c_int)]
        pfn = c_void_p()
        status = c_int()
        fn: DriverFunction | None = None
        if get_proc(name.encode(), byref(pfn), version, 0, byref(status)) == 0 and pfn.value:
            fn = _entry(name, c_int, argtypes, pfn.value)
        _entries[name] = fn
        return fn


def entry_point(name: str) -> DriverFunction:
    """The entry point ``name`` of either table, unchecked (it returns the CUresult: pass it to
    ``check``), for a loop that makes many calls in a context it made current once."""
    if name not in _EXTRA:
        return driver()._raw(name)
    fn = extra_entry(name)
    if fn is None:
        raise CudaError(-2, "CUDA_SYMBOL_NOT_FOUND", f"the installed driver does not provide {name}: update the NVIDIA driver", f"cuGetProcAddress({name})")
    return fn


def check(status: int, name: str) -> None:
    """Raises the CudaError of ``status`` (from entry point ``name``) unless it is CUDA_SUCCESS."""
    if status != 0:
        raise driver().error(status, name)


def call_extra(name: str, *args: Any) -> None:
    check(entry_point(name)(*args), name)
