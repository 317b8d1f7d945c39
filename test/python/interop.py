"""Python side of the interop test: opens cuda-ipc descriptors with Numba and CuPy, and exports a
CuPy allocation as a cuda-ipc descriptor for Node to open.

  interop.py numba-double FILE   open FILE with numba.cuda.open_ipc_array, check arange*0.5+1, double it
  interop.py cupy-double FILE    the same with cupy.cuda.runtime.ipcOpenMemHandle
  interop.py cupy-export N       allocate N float32 = 3*i+1, print a descriptor line, wait for a stdin
                                 line, then check that Node negated every value
Each prints one JSON line with "ok".
"""
import json
import sys

import numpy as np


def expected(n):
    return np.arange(n, dtype=np.float32) * np.float32(0.5) + np.float32(1)


def numba_double(path):
    from numba import cuda
    d = json.load(open(path))
    a = d["array"]
    with cuda.open_ipc_array(bytes.fromhex(d["handle"]), shape=tuple(a["shape"]), dtype=np.dtype(a["typestr"]),
                             strides=tuple(a["strides"]), offset=d["offset"]) as arr:
        host = arr.copy_to_host()
        ok = bool(np.array_equal(host.ravel(), expected(host.size)))
        arr.copy_to_device(host * 2)
        cuda.synchronize()
    return {"ok": ok, "first": host.ravel()[:5].tolist()}


def cupy_double(path):
    import cupy
    d = json.load(open(path))
    a = d["array"]
    ptr = cupy.cuda.runtime.ipcOpenMemHandle(bytes.fromhex(d["handle"]))
    try:
        mem = cupy.cuda.UnownedMemory(ptr, d["offset"] + d["byteLength"], owner=None)
        arr = cupy.ndarray(tuple(a["shape"]), np.dtype(a["typestr"]), cupy.cuda.MemoryPointer(mem, d["offset"]),
                           strides=tuple(a["strides"]))
        host = cupy.asnumpy(arr)
        ok = bool(np.array_equal(host.ravel(), expected(host.size)))
        arr *= 2
        cupy.cuda.runtime.deviceSynchronize()
    finally:
        cupy.cuda.runtime.ipcCloseMemHandle(ptr)
    return {"ok": ok, "first": host.ravel()[:5].tolist()}


def device_uuid(ordinal):
    # From the driver (cuDeviceGetUuid): CuPy's getDeviceProperties()["uuid"] is the 16 bytes read as
    # a C string, cut at the first zero byte (a GPU whose UUID holds one got a 10-byte UUID).
    import ctypes
    cuda = ctypes.CDLL("libcuda.so.1")
    dev = ctypes.c_int()
    raw = (ctypes.c_char * 16)()
    for call, args in (("cuInit", (0,)), ("cuDeviceGet", (ctypes.byref(dev), ordinal)), ("cuDeviceGetUuid", (raw, dev))):
        rc = getattr(cuda, call)(*args)
        if rc != 0:
            raise RuntimeError(f"{call} failed with CUresult {rc}")
    h = bytes(raw).hex()  # (bytes() of the array: all 16, zeros included)
    return f"GPU-{h[0:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def cupy_export(n):
    import os
    import cupy
    nbytes = n * 4
    ptr = cupy.cuda.runtime.malloc(nbytes)  # a whole allocation, so its handle's offset is 0
    arr = cupy.ndarray((n,), np.float32, cupy.cuda.MemoryPointer(cupy.cuda.UnownedMemory(ptr, nbytes, owner=None), 0))
    arr[...] = cupy.arange(n, dtype=cupy.float32) * 3 + 1
    cupy.cuda.runtime.deviceSynchronize()
    desc = {
        "kind": "cuda-legacy-handle", "version": 1,
        "handle": bytes(cupy.cuda.runtime.ipcGetMemHandle(ptr)).hex(),
        "offset": 0, "byteLength": nbytes, "deviceUuid": device_uuid(0), "pid": os.getpid(),
        "array": {"dtype": "float32", "typestr": "<f4", "shape": [n], "strides": [4]},
    }
    print(json.dumps(desc), flush=True)
    sys.stdin.readline()  # Node has written
    host = cupy.asnumpy(arr)
    ok = bool(np.array_equal(host, -(np.arange(n, dtype=np.float32) * 3 + 1)))
    cupy.cuda.runtime.free(ptr)
    return {"ok": ok, "first": host[:5].tolist()}


if __name__ == "__main__":
    mode = sys.argv[1]
    try:
        if mode == "numba-double":
            result = numba_double(sys.argv[2])
        elif mode == "cupy-double":
            result = cupy_double(sys.argv[2])
        elif mode == "cupy-export":
            result = cupy_export(int(sys.argv[2]))
        else:
            raise SystemExit(f"unknown mode {mode}")
    except Exception as e:  # reported as data so the Node test can show it
        result = {"ok": False, "error": f"{type(e).__name__}: {e}"}
    print(json.dumps(result), flush=True)
