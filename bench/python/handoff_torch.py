"""Reference: hand a fresh 1 MiB CUDA tensor to a child through torch.multiprocessing queues; the
child reads one value and acknowledges. Prints {"median_us", "p99_us", "n"} as JSON."""
import json
import sys
import time

import torch
import torch.multiprocessing as mp


def child(q, ack):
    torch.cuda.init()
    while True:
        t = q.get()
        if t is None:
            break
        v = t[0].item()
        del t
        ack.put(v)


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    warmup = int(sys.argv[2]) if len(sys.argv) > 2 else 200
    ctx = mp.get_context("spawn")
    q, ack = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=child, args=(q, ack))
    p.start()
    times = []
    for i in range(warmup + n):
        t0 = time.perf_counter()
        t = torch.empty(262144, dtype=torch.float32, device="cuda")
        q.put(t)
        ack.get()
        del t
        if i >= warmup:
            times.append((time.perf_counter() - t0) * 1e6)
    q.put(None)
    p.join()
    times.sort()
    print(json.dumps({"median_us": times[len(times) // 2], "p99_us": times[int(len(times) * 0.99) - 1], "n": len(times)}))


if __name__ == "__main__":
    main()
