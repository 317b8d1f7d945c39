"""Reference: hand a fresh 1 MiB CuPy allocation to a child as a raw legacy IPC handle through a
multiprocessing queue; the child opens it, reads one value, closes it and acknowledges. Prints
{"median_us", "p99_us", "n"} as JSON."""
import json
import multiprocessing as mp
import sys
import time


def child(q, ack):
    import cupy
    import numpy as np
    host = np.empty(1, dtype=np.uint32)
    while True:
        msg = q.get()
        if msg is None:
            break
        handle, offset = msg
        base = cupy.cuda.runtime.ipcOpenMemHandle(handle)
        cupy.cuda.runtime.memcpy(host.ctypes.data, base + offset, 4, cupy.cuda.runtime.memcpyDeviceToHost)
        cupy.cuda.runtime.ipcCloseMemHandle(base)
        ack.put(int(host[0]))


def main():
    import cupy
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    warmup = int(sys.argv[2]) if len(sys.argv) > 2 else 200
    ctx = mp.get_context("spawn")
    q, ack = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=child, args=(q, ack))
    p.start()
    times = []
    for i in range(warmup + n):
        t0 = time.perf_counter()
        ptr = cupy.cuda.runtime.malloc(1 << 20)
        q.put((cupy.cuda.runtime.ipcGetMemHandle(ptr), 0))
        ack.get()
        cupy.cuda.runtime.free(ptr)
        if i >= warmup:
            times.append((time.perf_counter() - t0) * 1e6)
    q.put(None)
    p.join()
    times.sort()
    print(json.dumps({"median_us": times[len(times) // 2], "p99_us": times[int(len(times) * 0.99) - 1], "n": len(times)}))


if __name__ == "__main__":
    main()
