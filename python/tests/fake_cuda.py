"""A stand-in for libcuda, so that the device-memory paths of cuda_ipc (sending arrays as legacy
handles or pool buffers, receiving, mapping lazily, views, unmapping, leases) run without a GPU.
"Device memory" is host memory here, so copies and reads are real; handles, pools and mappings are
bookkept so that tests can check what was opened, imported, freed and synchronized."""
import ctypes
import os
import threading

from cuda_ipc.arrays import buffer_array
from cuda_ipc.cuda import device as device_mod
from cuda_ipc.cuda import driver as drv
from cuda_ipc.link.transfers import device_transfers as transfers_mod
from cuda_ipc.ipc import cache as memory_mod

UUID_RAW = bytes(range(16, 32))
#: Device k's UUID (device 0 has UUID_RAW). Device 1's begins with a zero byte, as real ones may
#: (an H200's GPU-001e4106-...): read as a C string it would come out empty.
UUIDS = [UUID_RAW, bytes([0]) + bytes(range(33, 48)), bytes(range(48, 64))]


class FakeDriver:
    def __init__(self):
        self.allocs = {}  # base -> (ctypes buffer, size, pool or 0)
        self.handles = {}  # legacy handle -> base
        self.opened = {}  # base -> open count (cuIpcOpenMemHandle)
        self.pools = {}  # pool handle -> {"inode": ..., "imported": bool}
        self.pool_fds = {}  # inode of the pool's memfd -> owning pool handle
        self.exports = {}  # export data -> base
        self.imported = {}  # base -> import count (cuMemPoolImportPointer)
        self.freed = []
        self.destroyed = []
        self.syncs = 0
        self.stream_syncs = []
        self._threads = threading.local()  # each thread's context stack, as the driver keeps them
        self.calls = []
        self._next_pool = 0x5000
        self.buffer_ids = {}  # base -> CU_POINTER_ATTRIBUTE_BUFFER_ID (unique per allocation)
        self._next_buffer_id = 0
        self.registered = {}  # host address -> bytes (cuMemHostRegister)
        self.busy_streams = set()  # streams whose cuStreamQuery answers NOT_READY
        self.stream_ops = []  # ("wait" | "write", stream, device address, value)
        self.devices = 1  # visible devices (all peers of each other)
        self.access = []  # (pool handle, device ordinal) granted by cuMemPoolSetAccess
        self.mapped_in = {}  # base -> the context current when it was imported or opened
        self.peer_enabled = []  # (current context, peer context)
        self.batches = []  # copies per cuMemcpyBatchAsync
        self.created_streams = []  # (stream, flags)
        self.own_allocs = set()  # cuMemAlloc'ed here (the copy kernels' tables)
        self.uploads = []  # bytes per cuMemcpyHtoDAsync
        self.launches = []  # (kernel name, grid, block, runs, chunks) per cuLaunchKernel
        self.events = 0
        self.destroyed_streams = []
        self.stream_waits = []  # (stream, event) per cuStreamWaitEvent
        self.recorded = []  # (event, stream) per cuEventRecord

    @property
    def ctx_stack(self) -> list:
        """The calling thread's stack of current contexts."""
        stack = self._threads.__dict__.get("stack")
        if stack is None:
            stack = self._threads.stack = []
        return stack

    # -- what tests use --

    def alloc(self, size: int, pool: int = 0) -> int:
        buf = ctypes.create_string_buffer(size)
        base = ctypes.addressof(buf)
        self.allocs[base] = (buf, size, pool)
        self._next_buffer_id += 1
        self.buffer_ids[base] = self._next_buffer_id
        return base

    def create_pool(self) -> int:
        self._next_pool += 1
        h = self._next_pool
        fd = os.memfd_create("fake-pool")
        inode = os.fstat(fd).st_ino
        self.pools[h] = {"fd": fd, "inode": inode, "imported": False}
        self.pool_fds[inode] = h
        return h

    def close(self):
        for p in self.pools.values():
            if "fd" in p:
                os.close(p["fd"])

    # -- the driver interface cuda_ipc uses --

    def call(self, name, *args):
        self.calls.append(name)
        getattr(self, name)(*args)

    def status(self, name, *args):
        self.call(name, *args)
        return 0

    def _raw(self, name):
        """A raw entry point (returns the status), as the real driver's _raw."""
        own = getattr(self, "raw_" + name, None)
        if own is not None:
            return own

        def fn(*args):
            self.call(name, *args)
            return 0
        return fn

    def raw_cuStreamQuery(self, stream):
        self.calls.append("cuStreamQuery")
        return drv.CUDA_ERROR_NOT_READY if (stream or 0) in self.busy_streams else 0

    def raw_cuStreamWaitValue32(self, stream, addr, value, flags):
        self.calls.append("cuStreamWaitValue32")
        assert flags == drv.CU_STREAM_WAIT_VALUE_GEQ
        self.stream_ops.append(("wait", stream or 0, addr, value))
        return 0

    def raw_cuStreamWriteValue32(self, stream, addr, value, flags):
        self.calls.append("cuStreamWriteValue32")
        self.stream_ops.append(("write", stream or 0, addr, value))
        return 0

    def raw_cuMemcpyBatchAsync(self, dsts, srcs, sizes, count, attrs, idxs, nattrs, fail, stream):
        self.calls.append("cuMemcpyBatchAsync")
        assert stream and stream.value, "batched copies are refused on the legacy default stream"
        assert nattrs == 1 and idxs[0] == 0 and attrs._obj.srcAccessOrder == 1
        for i in range(count):
            self._find(dsts[i])
            self._find(srcs[i])
            ctypes.memmove(dsts[i], srcs[i], sizes[i])
        self.batches.append(count)
        return 0

    def raw_cuStreamCreate(self, out, flags):
        self.calls.append("cuStreamCreate")
        self._next_stream = getattr(self, "_next_stream", 0x5700) + 1
        out._obj.value = self._next_stream
        self.created_streams.append((self._next_stream, flags))
        return 0

    def raw_cuMemcpyDtoDAsync(self, dst, src, n, stream):
        self.calls.append("cuMemcpyDtoDAsync")
        ctypes.memmove(dst, src, n)
        return 0

    def run_stream_writes(self):
        """Performs the queued fence writes (as the GPU would once the streams got there)."""
        for op, _s, addr, value in self.stream_ops:
            if op == "write":
                ctypes.c_uint32.from_address(addr).value = value

    def cuMemHostRegister(self, p, n, flags):
        assert flags == drv.CU_MEMHOSTREGISTER_PORTABLE | drv.CU_MEMHOSTREGISTER_DEVICEMAP
        assert p.value not in self.registered, "registered twice"
        self.registered[p.value] = n

    def cuMemHostGetDevicePointer(self, out, p, flags):
        assert p.value in self.registered
        self._out(out).value = p.value  # unified addressing: the same address

    def cuMemHostUnregister(self, p):
        assert p.value in self.registered, "unregistering memory that is not registered"
        del self.registered[p.value]

    def error(self, status, call, hint=None):
        from cuda_ipc.errors import CudaError
        return CudaError(status, "CUDA_ERROR_INVALID_VALUE", "fake", call)

    @staticmethod
    def _out(ref):
        return ref._obj

    def cuDeviceGetCount(self, n):
        self._out(n).value = self.devices

    def cuDeviceGet(self, h, i):
        self._out(h).value = i

    def cuDeviceGetUuid(self, u, h):
        ctypes.memmove(ctypes.addressof(self._out(u)), UUIDS[h.value if hasattr(h, "value") else h], 16)

    def cuDeviceCanAccessPeer(self, out, a, b):
        self._out(out).value = 1

    def cuCtxEnablePeerAccess(self, ctx, flags):
        self.peer_enabled.append((self.ctx_stack[-1] if self.ctx_stack else None, ctx.value))

    def cuDeviceGetName(self, buf, n, h):
        ctypes.memmove(buf, b"Fake GPU\0", 9)

    def cuDevicePrimaryCtxRetain(self, ctx, h):
        self._out(ctx).value = 0xC0 + h

    def cuCtxGetCurrent(self, ctx):
        self._out(ctx).value = self.ctx_stack[-1] if self.ctx_stack else None

    def cuCtxPushCurrent(self, ctx):
        self.ctx_stack.append(ctx.value)

    def cuCtxPopCurrent(self, ctx):
        self._out(ctx).value = self.ctx_stack.pop()

    def cuCtxSynchronize(self):
        assert self.ctx_stack, "cuCtxSynchronize without a current context"
        self.syncs += 1

    def cuStreamSynchronize(self, s):
        self.stream_syncs.append(s.value)

    def cuStreamDestroy(self, s):
        self.destroyed_streams.append(s.value)

    def cuStreamWaitEvent(self, s, ev, flags):
        assert flags == 0
        self.stream_waits.append((s.value, ev.value))

    def cuEventQuery(self, ev):
        pass

    def _find(self, ptr):
        for base, (_, size, pool) in self.allocs.items():
            if base <= ptr < base + size:
                return base, size, pool
        raise drv.CudaError(1, "CUDA_ERROR_INVALID_VALUE", "not device memory", "fake")

    def cuPointerGetAttribute(self, out, attr, ptr):
        base, size, pool = self._find(ptr)
        v = {drv.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: 0, drv.CU_POINTER_ATTRIBUTE_MEMORY_TYPE: drv.CU_MEMORYTYPE_DEVICE,
             drv.CU_POINTER_ATTRIBUTE_IS_MANAGED: 0, drv.CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE: pool}[attr]
        self._out(out).value = v

    def cuPointerGetAttributes(self, n, attrs, data, ptr):
        try:
            base, size, pool = self._find(ptr)
        except drv.CudaError:
            base = None  # not device memory: every answer zero, and success (as the driver does)
        for i in range(n):
            a = attrs[i]
            v = 0 if base is None else {
                drv.CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE: pool, drv.CU_POINTER_ATTRIBUTE_IS_MANAGED: 0,
                drv.CU_POINTER_ATTRIBUTE_MEMORY_TYPE: drv.CU_MEMORYTYPE_DEVICE, drv.CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: base,
                drv.CU_POINTER_ATTRIBUTE_RANGE_SIZE: size, drv.CU_POINTER_ATTRIBUTE_BUFFER_ID: self.buffer_ids[base],
            }[a]
            ctypes.c_uint64.from_address(data[i]).value = v

    def cuMemGetAddressRange(self, base_out, size_out, ptr):
        base, size, _ = self._find(ptr)
        self._out(base_out).value = base
        self._out(size_out).value = size

    def cuIpcGetMemHandle(self, h_out, base):
        _, _, pool = self._find(base)
        assert not pool, "pool memory has no legacy handle"
        handle = b"H" + base.to_bytes(8, "little") + bytes(55)
        self.handles[handle] = base
        ctypes.memmove(ctypes.addressof(self._out(h_out)), handle, 64)

    def cuIpcOpenMemHandle(self, p_out, h, flags):
        handle = ctypes.string_at(ctypes.addressof(h), 64)
        if handle not in self.handles:
            raise drv.CudaError(1, "CUDA_ERROR_INVALID_VALUE", "unknown handle", "cuIpcOpenMemHandle")
        base = self.handles[handle]
        self.opened[base] = self.opened.get(base, 0) + 1
        self.mapped_in[base] = self.ctx_stack[-1] if self.ctx_stack else None
        self._out(p_out).value = base

    def cuIpcCloseMemHandle(self, base):
        assert self.opened.get(base, 0) > 0, "closing a handle that is not open"
        self.opened[base] -= 1

    def cuMemcpyDtoH(self, dst, src, n):
        self._find(src)
        ctypes.memmove(dst.value, src, n)

    def cuMemcpyHtoD(self, dst, src, n):
        self._find(dst)
        ctypes.memmove(dst, src.value, n)

    def cuMemPoolExportToShareableHandle(self, fd_out, pool, t, flags):
        self._out(fd_out).value = os.dup(self.pools[pool.value]["fd"])

    def cuMemPoolImportFromShareableHandle(self, pool_out, fd, t, flags):
        owner = self.pool_fds[os.fstat(fd.value).st_ino]
        self._next_pool += 1
        self.pools[self._next_pool] = {"imported": True, "of": owner}
        self._out(pool_out).value = self._next_pool

    def cuMemPoolSetAccess(self, pool, desc, n):
        assert self.pools[pool.value]["imported"]
        self.access.append((pool.value, self._out(desc).location.id))

    def cuMemPoolExportPointer(self, data_out, base):
        b, _, pool = self._find(base)
        assert pool and b == base
        data = b"E" + base.to_bytes(8, "little") + bytes(55)
        self.exports[data] = base
        ctypes.memmove(ctypes.addressof(self._out(data_out)), data, 64)

    def cuMemPoolImportPointer(self, p_out, pool, data_ref):
        data = ctypes.string_at(ctypes.addressof(self._out(data_ref)), 64)
        base = self.exports[data]
        assert self.pools[pool.value]["of"] == self.allocs[base][2], "export data of another pool"
        self.imported[base] = self.imported.get(base, 0) + 1
        self.mapped_in[base] = self.ctx_stack[-1] if self.ctx_stack else None
        self._out(p_out).value = base

    def cuMemAlloc(self, out, size):
        base = self.alloc(size)
        self.own_allocs.add(base)
        out._obj.value = base

    def cuDeviceGetAttribute(self, out, attr, dev):
        out._obj.value = 4 if attr == 16 else 0  # 4 SMs

    def cuEventSynchronize(self, ev):
        pass

    def cuEventDestroy(self, ev):
        self.events -= 1

    def raw_cuMemcpyHtoDAsync(self, dst, src, n, stream):
        self.calls.append("cuMemcpyHtoDAsync")
        self._find(dst.value)
        ctypes.memmove(dst.value, src, n.value)
        self.uploads.append(n.value)
        return 0

    def raw_cuModuleLoadData(self, out, image):
        self.calls.append("cuModuleLoadData")
        assert b".entry copy_runs(" in ctypes.string_at(image), "the tensors PTX"
        out._obj.value = 0x6D00
        return 0

    def raw_cuModuleGetFunction(self, out, module, name):
        self.calls.append("cuModuleGetFunction")
        assert module.value == 0x6D00 and name == b"copy_runs", name
        out._obj.value = 0x6E00
        return 0

    def raw_cuEventCreate(self, out, flags):
        self.calls.append("cuEventCreate")
        self.events += 1
        self._next_event = getattr(self, "_next_event", 0x6F00) + 1
        out._obj.value = self._next_event
        return 0

    def raw_cuEventRecord(self, ev, stream):
        self.calls.append("cuEventRecord")
        self.recorded.append((ev.value, stream.value))
        return 0

    def raw_cuLaunchKernel(self, f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra):
        """Runs copy_runs as the GPU would, block by block in the kernel's order (kernels/tensors.cu)."""
        self.calls.append("cuLaunchKernel")
        assert f.value == 0x6E00 and gy == gz == by == bz == 1 and stream and stream.value
        table = ctypes.c_uint64.from_address(params[0]).value
        runs = ctypes.c_uint32.from_address(params[1]).value
        chunks = ctypes.c_uint64.from_address(params[2]).value
        chunk_bytes = ctypes.c_uint64.from_address(params[3]).value
        self._find(table)
        rows = [tuple((ctypes.c_uint64 * 4).from_address(table + 32 * i)) for i in range(runs)]
        for block in range(gx):
            r = 0
            for c in range(block, chunks, gx):
                lo, hi = r, runs - 1
                while lo < hi:
                    mid = lo + (hi - lo + 1) // 2
                    if rows[mid][3] <= c:
                        lo = mid
                    else:
                        hi = mid - 1
                r = lo
                dst, src, n, first = rows[r]
                begin = (c - first) * chunk_bytes
                assert begin < n, "a chunk past its run"
                end = min(begin + chunk_bytes, n)
                self._find(dst + begin)
                self._find(src + begin)
                ctypes.memmove(dst + begin, src + begin, end - begin)
        self.launches.append(("copy_runs", gx, bx, runs, chunks))
        return 0

    def cuMemFree(self, ptr):
        if getattr(ptr, "value", ptr) in self.own_allocs:
            self.own_allocs.discard(ptr.value)
            self.freed.append(ptr.value)
            return
        assert self.imported.get(ptr, 0) > 0, "freeing a pointer that was not imported"
        self.imported[ptr] -= 1
        self.freed.append(ptr)

    def cuMemPoolDestroy(self, pool):
        self.destroyed.append(pool.value)


class FakeArray:
    """A CuPy-like array in fake device memory: __cuda_array_interface__ v3."""

    def __init__(self, ptr, shape, typestr="<f4", strides=None, stream=None):
        self.ptr = ptr
        self.shape = shape
        self.typestr = typestr
        self.strides = strides
        self.stream = stream

    @property
    def __cuda_array_interface__(self):
        return {"data": (self.ptr, False), "shape": self.shape, "typestr": self.typestr, "strides": self.strides,
                "version": 3, "stream": self.stream}


def _forget_driver_state() -> None:
    """What the package keeps per driver (streams, loaded kernels, plans holding device tables): a new
    fake starts without them."""
    from cuda_ipc.tensors import kernels as copy_kernels
    from cuda_ipc.tensors import nccl_transfer as nccl_tensor_set
    from cuda_ipc.tensors import update
    update._streams.clear()
    update._plans.clear()
    copy_kernels._functions.clear()
    copy_kernels._sms.clear()
    nccl_tensor_set._remote_plans.clear()


def install() -> FakeDriver:
    """Routes cuda_ipc's driver calls to a new FakeDriver (undo with uninstall())."""
    _forget_driver_state()
    fake = FakeDriver()
    drv._driver = fake
    # Received device memory is a torch tensor where torch imports (a GPU machine): torch's allocator
    # would hand out real device memory that the fakes (host memory standing in) then write to.
    fake.torch_was = (buffer_array._torch_checked, buffer_array._torch)
    buffer_array._torch_checked, buffer_array._torch = True, None
    device_mod._devices = None
    device_mod._by_uuid.clear()
    transfers_mod._check_pool_fd_real = transfers_mod._check_pool_fd
    transfers_mod._check_pool_fd = lambda fd: None  # a memfd stands in for /dev/nvidiactl
    memory_mod._local_exports.clear()
    memory_mod._local_pool_exports.clear()
    memory_mod._local_pools.clear()
    memory_mod._reset_legacy()
    memory_mod._export_handles.clear()
    return fake


def uninstall(fake: FakeDriver) -> None:
    _forget_driver_state()
    fake.close()
    drv._driver = None
    buffer_array._torch_checked, buffer_array._torch = fake.torch_was
    device_mod._devices = None
    device_mod._by_uuid.clear()
    transfers_mod._check_pool_fd = transfers_mod._check_pool_fd_real
    memory_mod._local_exports.clear()
    memory_mod._local_pool_exports.clear()
    for _, fd in memory_mod._local_pools.values():
        os.close(fd)
    memory_mod._local_pools.clear()
    memory_mod._reset_legacy()
    memory_mod._export_handles.clear()
