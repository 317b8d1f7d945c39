"""Python child of the GPU companion tests (test/gpu/python-companion.test.ts), started with spawnPython.
One reply per command; a library that is missing answers {"skipped": why}, a failure {"error": traceback}.

Node -> Python (values: float32 i * 0.5 + 1 for i in range(n), unless said otherwise):
  torch-cai {buffer, n}      torch.as_tensor through __cuda_array_interface__: check, double in place
  torch-dlpack {buffer, n}   torch.from_dlpack: check, add 1
  cupy {buffer, n}           cupy.asarray: check, negate
  numba {buffer, n}          numba.cuda.as_cuda_array: check, times 3
  cuda-core {buffer, n}      cuda.core's own IPC import (DeviceMemoryResource.from_allocation_handle +
                             Buffer.from_ipc_descriptor) of a Node pool buffer: check, write 7s
  cuda-core-wrap {buffer, n} buffer.to_cuda_core(): same pointer, size; check through it
  torch-format {handle, size, offset, n, device}  Node's legacy buffer in torch's own handle format
                             (torch.UntypedStorage._new_shared_cuda): check, write -1s
Python -> Node:
  send-torch {n, kind}       kind 'sub': a caching-allocator sub-allocation; 'view': a view with a
                             storage offset (t[5:]); replies {tensor, n, first} and keeps a handle to check
  churn {index}              drops its own reference to sent tensor #index, allocates and fills many
                             new tensors (would reuse the blocks if the leases did not hold them)
  check-sent {index, values} checks Node's writes into sent tensor #index (first len(values) elements)
  back {buffer, index}       a buffer Node sent back: does it map to sent tensor #index's memory?
  send-cupy {n}              a CuPy array (legacy handle)
  send-cuda-core {n}         a cuda.core buffer from an IPC-enabled memory resource (pool buffer)
  leases                     -> {count, received} after reading pending releases
"""
import os
import sys
import traceback

import cuda_ipc
from cuda_ipc import Device, parent_link, torch_storage_args
from cuda_ipc.ipc.descriptor import LegacyHandleDescriptor

link = parent_link()
sent = []  # (tensor kept alive by us for checking, its data_ptr)
keep = []


def expected(n, torch):
    return torch.arange(n, dtype=torch.float32, device="cuda") * 0.5 + 1


def need(name):
    try:
        return __import__(name)
    except ImportError as e:
        raise Skip(f"{name} is not installed: {e}")


class Skip(Exception):
    pass


def torch_cai(m):
    torch = need("torch")
    buf = m["buffer"]
    t = torch.as_tensor(buf.view("float32", (m["n"],)), device="cuda")
    ok = bool(torch.equal(t, expected(m["n"], torch)))
    same = t.data_ptr() == buf.ptr
    t.mul_(2)
    torch.cuda.synchronize()
    del t
    buf.close()
    return {"ok": ok and same, "zeroCopy": same}


def torch_dlpack(m):
    torch = need("torch")
    buf = m["buffer"]
    t = torch.from_dlpack(buf.view("float32", (m["n"],)))
    ok = bool(torch.equal(t, expected(m["n"], torch)))
    same = t.data_ptr() == buf.ptr
    t.add_(1)
    torch.cuda.synchronize()
    del t
    raw = torch.from_dlpack(buf)  # the bytes themselves
    ok_raw = raw.dtype == torch.uint8 and raw.numel() == buf.nbytes
    del raw
    buf.close()
    return {"ok": ok and same and ok_raw}


def cupy_view(m):
    cupy = need("cupy")
    buf = m["buffer"]
    a = cupy.asarray(buf.view("float32", (m["n"],)))
    ok = bool((a == cupy.arange(m["n"], dtype=cupy.float32) * 0.5 + 1).all())
    same = a.data.ptr == buf.ptr
    a *= -1
    cupy.cuda.runtime.deviceSynchronize()
    del a
    buf.close()
    return {"ok": ok and same}


def numba_view(m):
    need("numba")
    from numba import cuda
    import numpy as np
    buf = m["buffer"]
    a = cuda.as_cuda_array(buf.view("float32", (m["n"],)))
    host = a.copy_to_host()
    ok = bool(np.array_equal(host, np.arange(m["n"], dtype=np.float32) * np.float32(0.5) + np.float32(1)))
    a.copy_to_device(host * 3)
    cuda.synchronize()
    del a
    buf.close()
    return {"ok": ok}


def cuda_core_own(m):
    need("cuda.core")
    import cuda.core as cc
    import struct
    buf = m["buffer"]
    r = buf.cuda_core_ipc()
    dev = cc.Device(r.device_ordinal)
    dev.set_current()
    try:
        mr = cc.DeviceMemoryResource.from_allocation_handle(dev, r.allocation_handle)
    finally:
        os.close(r.allocation_handle)  # from_allocation_handle(int) duplicates it
    allow_access(mr, r.device_ordinal)
    stream = dev.create_stream()
    try:
        cb = cc.Buffer.from_ipc_descriptor(mr, r.descriptor, stream=stream)
    except TypeError:
        cb = cc.Buffer.from_ipc_descriptor(mr, r.descriptor, stream)
    n = m["n"]
    from cuda_ipc.cuda import driver as drv
    import ctypes
    host = bytearray(4 * n)
    with Device.by_uuid(buf.device_uuid).activate():
        drv.memcpy_dtoh(ctypes.addressof((ctypes.c_char * len(host)).from_buffer(host)), int(cb.handle) + r.offset, len(host))
    values = struct.unpack(f"<{n}f", host)
    ok = all(values[i] == i * 0.5 + 1 for i in range(n))
    sevens = struct.pack(f"<{n}f", *([7.0] * n))
    with Device.by_uuid(buf.device_uuid).activate():
        drv.memcpy_htod(int(cb.handle) + r.offset, ctypes.cast(ctypes.c_char_p(sevens), ctypes.c_void_p).value, len(sevens))
    size_ok = cb.size == buf.allocation_size
    cb.close()
    stream.sync()
    buf.close()
    return {"ok": ok and size_ok, "sizeOk": size_ok}


def allow_access(mr, ordinal):
    """Read-write access of this device to an imported pool, as the CUDA IPC sample sets it (the
    cuda.core source we read does not; setting it twice is harmless)."""
    from cuda_ipc.cuda import driver as drv
    with Device.get(ordinal).activate():
        drv.pool_set_access(int(mr.handle), ordinal)


def cuda_core_wrap(m):
    need("cuda.core")
    torch = need("torch")
    buf = m["buffer"]
    cb = buf.to_cuda_core()
    same = int(cb.handle) == buf.ptr and cb.size == buf.nbytes
    t = torch.as_tensor(buf.view("float32", (m["n"],)), device="cuda")
    ok = bool(torch.equal(t, expected(m["n"], torch)))
    del t, cb
    buf.close()
    return {"ok": ok and same}


def torch_format(m):
    torch = need("torch")
    desc = LegacyHandleDescriptor(bytes.fromhex(m["handle"])[2:], m["offset"], m["size"], Device.get(m["device"]).uuid, 1)
    args = torch_storage_args(desc, m["device"])
    assert args[1].hex() == m["handle"], "torch_storage_args rebuilds Node's torch handle"
    storage = torch.UntypedStorage._new_shared_cuda(*args)
    t = torch.empty(0, dtype=torch.float32, device="cuda").set_(storage, 0, (m["n"],), (1,))
    ok = bool(torch.equal(t, expected(m["n"], torch)))
    t.fill_(-1)
    torch.cuda.synchronize()
    del t, storage
    return {"ok": ok}


def send_torch(m):
    torch = need("torch")
    n = m["n"]
    pad = torch.empty(1000, device="cuda")  # so that the next tensor is a sub-allocation of a block
    t = torch.arange(n + 5, dtype=torch.float32, device="cuda") * 0.25
    keep.append(pad)
    v = t[5:] if m["kind"] == "view" else t
    if m["kind"] == "view":
        assert v.storage_offset() == 5
    sent.append((v, v.data_ptr()))
    link.send({"tensor": v, "n": v.numel(), "first": v[:4].tolist(), "offsetInBlock": v.data_ptr() - _base(v.data_ptr())})
    return None


def _base(ptr):
    from cuda_ipc.cuda import driver as drv
    with Device.get(0).activate():
        return drv.address_range(ptr)[0]


def churn(m):
    torch = need("torch")
    i = m["index"]
    ptrs = [sent[i][1]]
    sent[i] = (None, sent[i][1])  # only the lease holds the tensor now
    junk = [torch.full((4096,), 13.0, device="cuda") for _ in range(64)]
    torch.cuda.synchronize()
    reused = any(j.data_ptr() <= p < j.data_ptr() + j.numel() * 4 for j in junk for p in ptrs)
    keep.extend(junk)
    return {"reused": reused}


def check_sent(m):
    torch = need("torch")
    import ctypes
    import struct
    from cuda_ipc.cuda import driver as drv
    ptr = sent[m["index"]][1]
    want = m["values"]
    host = bytearray(4 * len(want))
    with Device.get(0).activate():
        drv.memcpy_dtoh(ctypes.addressof((ctypes.c_char * len(host)).from_buffer(host)), ptr, len(host))
    got = list(struct.unpack(f"<{len(want)}f", host))
    return {"ok": got == want, "got": got[:4]}


def back(m):
    buf = m["buffer"]
    same = buf.ptr == sent[m["index"]][1]
    buf.close()
    return {"ok": same}


def send_cupy(m):
    cupy = need("cupy")
    n = m["n"]
    a = cupy.arange(n, dtype=cupy.float32) * 2
    link.send({"array": a, "n": n})
    return None


def send_cuda_core(m):
    need("cuda.core")
    import cuda.core as cc
    import ctypes
    import struct
    from cuda_ipc.cuda import driver as drv
    dev = cc.Device(0)
    dev.set_current()
    mr = cc.DeviceMemoryResource(dev, cc.DeviceMemoryResourceOptions(ipc_enabled=True))
    stream = dev.create_stream()
    n = m["n"]
    cb = mr.allocate(4 * n, stream=stream)
    stream.sync()
    data = struct.pack(f"<{n}f", *[i * 1.5 for i in range(n)])
    with Device.get(0).activate():
        drv.memcpy_htod(int(cb.handle), ctypes.cast(ctypes.c_char_p(data), ctypes.c_void_p).value, len(data))
    keep.append(mr)
    link.send({"buffer": cb, "n": n})
    return None


def leases(m):
    link.poll()
    c = link.leases
    return {"count": c.count, "received": link.received_leases}


OPS = {"torch-cai": torch_cai, "torch-dlpack": torch_dlpack, "cupy": cupy_view, "numba": numba_view,
       "cuda-core": cuda_core_own, "cuda-core-wrap": cuda_core_wrap, "torch-format": torch_format,
       "send-torch": send_torch, "churn": churn, "check-sent": check_sent, "back": back, "send-cupy": send_cupy,
       "send-cuda-core": send_cuda_core, "leases": leases}

for msg in link:
    try:
        reply = OPS[msg["op"]](msg)
    except Skip as e:
        reply = {"skipped": str(e)}
        b = msg.get("buffer")
        if b is not None:
            b.close()
    except Exception:  # noqa: BLE001 - reported to the test
        reply = {"error": traceback.format_exc()}
    if reply is not None:
        link.send(reply)
sys.exit(0)
