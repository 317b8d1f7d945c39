"""The host time to queue NCCL work from Python, with the process otherwise idle and with another
Python thread busy (an inference engine's scheduler, a data loader): bench/nccl-queue.ts prints it.
One GPU, a one-rank communicator (its broadcasts are queued and run like any other operation), 16
operations of 64 MiB (argument 3) per sample, timed from the first call to the last return (the
GPU's work is waited for outside the timing); a row's idle and busy samples alternate, so that a
round's ratio of the two compares moments a millisecond apart. Rows, taking turns round by round:

  broadcast              cuda_ipc's NcclCommunicator.broadcast, 16 in a row
  chunk pipeline         cuda_ipc's ChunkMover.queue: 16 staged chunks, each a gather launch, its
                         events and stream waits, and a broadcast (what a remote weight sync queues)
  raw, GIL kept          the same broadcasts through ctypes.PYFUNCTYPE entry points and a poll that
                         keeps the GIL: the floor of any Python caller
  raw, GIL given away    the same through ctypes.CFUNCTYPE (each call releases the GIL) and a poll that
                         yields: how cuda_ipc called NCCL and the driver before

Arguments: rounds (5), samples per round (100), MiB per operation (64), and where to run (optional:
"Q,B,LIST": the queueing thread on CPU Q, the busy thread on CPU B, every other thread, NCCL's
included, on the CPUs of LIST, "0-3,8"). Prints one JSON object: {rows: {name: {idle: [[us per op per sample] per round], busy: [...]}}}.
"""
import ctypes
import json
import os
import sys
import threading
import time
from ctypes import byref, c_int, c_size_t, c_void_p

from cuda_ipc.cuda import driver as drv
from cuda_ipc.cuda.device import Device
from cuda_ipc.cuda.stream import Stream
from cuda_ipc.nccl import NcclCommunicator, load_nccl
from cuda_ipc.nccl.errors import IN_PROGRESS
from cuda_ipc.tensors.chunk_pipeline import ChunkMover, ChunkOperation
from cuda_ipc.tensors.packed_stream import ChunkRoute

OPS = 16
PIECES = 4
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
samples = int(sys.argv[2]) if len(sys.argv) > 2 else 100
SIZE = (int(sys.argv[3]) if len(sys.argv) > 3 else 64) << 20


def cpu_list(text):
    cpus = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


queue_cpu = busy_cpu = None
if len(sys.argv) > 4:
    q, b, others = sys.argv[4].split(",", 2)
    queue_cpu, busy_cpu = int(q), int(b)
    os.sched_setaffinity(0, cpu_list(others))  # threads made from here on (NCCL's) inherit it

dev = Device.get(0)
lib = load_nccl()
with dev.activate():
    p = drv.CUdeviceptr()
    drv.driver().call("cuMemAlloc", byref(p), 2 * SIZE * OPS)
buf = p.value
src = buf + SIZE * OPS
stream = Stream(dev)
comm = NcclCommunicator.init(lib.unique_id(), 1, 0, dev)
mover = ChunkMover(dev, stream)
if queue_cpu is not None:
    os.sched_setaffinity(0, {queue_cpu})  # this thread only
piece = SIZE // PIECES
routes = [ChunkRoute(False, SIZE, 0, tuple((j * piece, src + (k * PIECES + j) * piece, piece) for j in range(PIECES))) for k in range(OPS)]
how = ChunkOperation("broadcast", 0)


def raw(kind):
    """ncclBroadcast and ncclCommGetAsyncError through ``kind`` (PYFUNCTYPE or CFUNCTYPE)."""
    bcast = kind(c_int, c_void_p, c_void_p, c_size_t, c_int, c_int, c_void_p, c_void_p)(ctypes.cast(lib.fn("ncclBroadcast"), c_void_p).value)
    state_fn = kind(c_int, c_void_p, ctypes.POINTER(c_int))(ctypes.cast(lib.fn("ncclCommGetAsyncError"), c_void_p).value)
    keeps = kind is ctypes.PYFUNCTYPE
    h = comm._handle
    st = c_int()

    def run():
        with dev.activate():
            for k in range(OPS):
                r = bcast(buf + k * SIZE, buf + k * SIZE, SIZE, 1, 0, h, stream.handle)
                if r == IN_PROGRESS:
                    while True:
                        state_fn(h, byref(st))
                        if st.value != IN_PROGRESS:
                            break
                        if not keeps:
                            time.sleep(0)
                    r = st.value
                if r != 0:
                    raise RuntimeError(f"ncclBroadcast: {r}")
    return run


ROWS = {
    "broadcast": lambda: [comm.broadcast(buf + k * SIZE, SIZE, 0, stream=stream.handle) for k in range(OPS)],
    "chunk pipeline": lambda: mover.queue(comm, how, routes),
    "raw, GIL kept": raw(ctypes.PYFUNCTYPE),
    "raw, GIL given away": raw(ctypes.CFUNCTYPE),
}


class Busy:
    """Another Python thread that never waits while it runs (it gives the GIL up only when asked to),
    started and parked between samples, so that a round's idle and busy samples alternate."""

    def __init__(self):
        self.go, self.parked, self.running, self.stop = threading.Event(), threading.Event(), threading.Event(), False
        self.thread = threading.Thread(target=self._spin, daemon=True)
        self.thread.start()
        self.parked.wait()

    def _spin(self):
        if busy_cpu is not None:
            os.sched_setaffinity(0, {busy_cpu})
        while not self.stop:
            self.running.clear()
            self.parked.set()
            self.go.wait()
            self.running.set()
            x = 0
            while self.go.is_set() and not self.stop:
                x += 1

    def on(self):
        self.parked.clear()
        self.go.set()
        self.running.wait()

    def off(self):
        self.go.clear()
        self.parked.wait()

    def close(self):
        self.stop = True
        self.go.set()
        self.thread.join()


def sample(fn):
    stream.synchronize()
    mover.copy_stream.synchronize()
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e6 / OPS


busy = Busy()
for fn in ROWS.values():  # warm-up: the kernels loaded, the table uploaded, NCCL's first launches
    for _ in range(samples):
        sample(fn)
result = {name: {"idle": [], "busy": []} for name in ROWS}
for r in range(rounds):
    names = list(ROWS)
    names = names[r % len(names):] + names[:r % len(names)]  # each round starts with another row
    for name in names:
        idle, loaded = [], []
        for _ in range(samples):
            idle.append(sample(ROWS[name]))
            busy.on()
            loaded.append(sample(ROWS[name]))
            busy.off()
        result[name]["idle"].append(idle)
        result[name]["busy"].append(loaded)
busy.close()
stream.synchronize()
mover.copy_stream.synchronize()
mover.close()
comm.close()
with dev.activate():
    drv.driver().call("cuMemFree", drv.CUdeviceptr(buf))
print(json.dumps({"ops": OPS, "bytes": SIZE, "rows": result}))
