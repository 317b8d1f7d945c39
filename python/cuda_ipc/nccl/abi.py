"""The NCCL ABI subset cuda-ipc uses, declared once for ctypes (vLLM's pynccl_wrapper.py is the
model): the structs, a table of (name, result type, argument types) resolved once per library file,
and ``open_library``. It matches native/nccl_abi.h. Standard library only and free of the rest of
the package: the probe process (library.py) loads this file alone.
"""
from __future__ import annotations

import ctypes
import os
from ctypes import POINTER, c_char, c_char_p, c_int, c_size_t, c_uint, c_void_p
from typing import Any

SUCCESS = 0
NCCL_UNIQUE_ID_BYTES = 128

ncclComm_t = c_void_p
cudaStream_t = c_void_p


class NcclUniqueIdStruct(ctypes.Structure):
    """ncclUniqueId: passed by value to ncclCommInitRankConfig."""

    _fields_ = [("internal", c_char * NCCL_UNIQUE_ID_BYTES)]


class NcclConfig(ctypes.Structure):
    """ncclConfig_t as NCCL 2.17 declared it (native/nccl_abi.h says why an older layout stays valid:
    NCCL reads ``size`` bytes and gives every later field its default)."""

    _fields_ = [("size", c_size_t), ("magic", c_uint), ("version", c_uint), ("blocking", c_int), ("cgaClusterSize", c_int),
                ("minCTAs", c_int), ("maxCTAs", c_int), ("netName", c_char_p)]


API_MAGIC = 0xCAFEBEEF
CONFIG_VERSION = 21700  # NCCL_VERSION(2, 17, 0)
CONFIG_UNDEF_INT = -2147483648
DATATYPE_UINT8 = 1

# (name, result type, argument types): every entry point used, all present from NCCL 2.14 on.
_FUNCTIONS: list[tuple[str, Any, list[Any]]] = [
    ("ncclGetVersion", c_int, [POINTER(c_int)]),
    ("ncclGetUniqueId", c_int, [POINTER(NcclUniqueIdStruct)]),
    ("ncclCommInitRankConfig", c_int, [POINTER(ncclComm_t), c_int, NcclUniqueIdStruct, c_int, POINTER(NcclConfig)]),
    ("ncclCommGetAsyncError", c_int, [ncclComm_t, POINTER(c_int)]),
    ("ncclCommAbort", c_int, [ncclComm_t]),
    ("ncclCommFinalize", c_int, [ncclComm_t]),
    ("ncclCommDestroy", c_int, [ncclComm_t]),
    ("ncclGetErrorString", c_char_p, [c_int]),
    ("ncclGetLastError", c_char_p, [ncclComm_t]),
    ("ncclCommCount", c_int, [ncclComm_t, POINTER(c_int)]),
    ("ncclCommCuDevice", c_int, [ncclComm_t, POINTER(c_int)]),
    ("ncclCommUserRank", c_int, [ncclComm_t, POINTER(c_int)]),
    ("ncclSend", c_int, [c_void_p, c_size_t, c_int, c_int, ncclComm_t, cudaStream_t]),
    ("ncclRecv", c_int, [c_void_p, c_size_t, c_int, c_int, ncclComm_t, cudaStream_t]),
    ("ncclBroadcast", c_int, [c_void_p, c_void_p, c_size_t, c_int, c_int, ncclComm_t, cudaStream_t]),
    ("ncclGroupStart", c_int, []),
    ("ncclGroupEnd", c_int, []),
]

#: Called keeping Python's GIL (ctypes.PYFUNCTYPE, as PyTorch makes its CUDA and NCCL calls): on the
#: non-blocking communicators cuda-ipc makes, these return within microseconds and NCCL's own threads
#: do the work. A call that gives the GIL away waits for it again a whole switch interval (5 ms) when
#: another Python thread is busy: 16 operations queued took 6.8 ms each instead of 10 us (one H200).
#: Init, finalize, destroy and abort may wait on other ranks or threads, so they release it.
KEEPS_GIL = frozenset({"ncclSend", "ncclRecv", "ncclBroadcast", "ncclGroupStart", "ncclGroupEnd", "ncclCommGetAsyncError"})


class LoadError(Exception):
    """A file that is not a usable NCCL: ``code`` ERR_DLOPEN, ERR_NCCL_SYMBOLS or ERR_NCCL_VERSION."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


class _DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", c_char_p), ("dli_fbase", c_void_p), ("dli_sname", c_char_p), ("dli_saddr", c_void_p)]


def _loaded_file(fn: Any, fallback: str) -> str:
    """The file a symbol was loaded from (dladdr), or ``fallback``."""
    for libname in (None, "libdl.so.2"):
        try:
            dladdr = ctypes.CDLL(libname).dladdr
        except (OSError, AttributeError):
            continue
        dladdr.argtypes = [c_void_p, POINTER(_DlInfo)]
        dladdr.restype = c_int
        info = _DlInfo()
        if dladdr(ctypes.cast(fn, c_void_p), ctypes.byref(info)) and info.dli_fname:
            return os.fsdecode(info.dli_fname)
        break
    return fallback


def open_library(path: str) -> tuple[ctypes.CDLL, dict[str, Any], int, str]:
    """dlopen(RTLD_NOW | RTLD_LOCAL), every entry point, the version and the file; raises LoadError."""
    try:
        lib = ctypes.CDLL(path, mode=os.RTLD_NOW | os.RTLD_LOCAL)
    except OSError as e:
        raise LoadError("ERR_DLOPEN", str(e)) from None
    fns: dict[str, Any] = {}
    missing = []
    for name, restype, argtypes in _FUNCTIONS:
        try:
            fn = getattr(lib, name)
        except AttributeError:
            missing.append(name)
            continue
        if name in KEEPS_GIL:
            fn = ctypes.PYFUNCTYPE(restype, *argtypes)(ctypes.cast(fn, c_void_p).value or 0)
        else:
            fn.restype = restype
            fn.argtypes = argtypes
        fns[name] = fn
    if missing:
        raise LoadError("ERR_NCCL_SYMBOLS", f"it does not export {', '.join(missing)} (not NCCL, or NCCL older than 2.14)")
    version = c_int()
    r = fns["ncclGetVersion"](ctypes.byref(version))
    if r != SUCCESS:
        raise LoadError("ERR_NCCL_VERSION", f"ncclGetVersion returned {r}")
    return lib, fns, version.value, _loaded_file(fns["ncclGetVersion"], path)
