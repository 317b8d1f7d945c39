"""Reference: PyTorch's peer copy of BYTES bytes from one GPU to another in one process
(dst.copy_(src), src on the first GPU, dst on the second), timed in batches of BATCH copies.
The GPUs are picked by UUID (arguments 4 and 5) where torch reports UUIDs, else by ordinal.
Prints {"median_us", "p99_us", "n"} (per copy) as JSON on the last line."""
import json
import sys
import time

import torch


def pick(uuid, fallback):
    for i in range(torch.cuda.device_count()):
        u = getattr(torch.cuda.get_device_properties(i), "uuid", None)
        if u is not None and "GPU-" + str(u) == uuid:
            return i
    return fallback


def main():
    nbytes, reps, batch = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    src_uuid, dst_uuid = sys.argv[4], sys.argv[5]
    s, d = pick(src_uuid, 0), pick(dst_uuid, 1)
    src = torch.full((nbytes,), 7, dtype=torch.uint8, device=f"cuda:{s}")
    dst = torch.empty((nbytes,), dtype=torch.uint8, device=f"cuda:{d}")

    def sync():
        torch.cuda.synchronize(s)
        torch.cuda.synchronize(d)

    def run():
        sync()
        t0 = time.perf_counter()
        for _ in range(batch):
            dst.copy_(src)
        sync()
        return (time.perf_counter() - t0) * 1e6 / batch

    run()  # warm-up (enables peer access)
    times = sorted(run() for _ in range(reps * 3))
    if not torch.equal(dst[:16].cpu(), src[:16].cpu()):
        raise SystemExit("the copy did not arrive")
    print(json.dumps({"median_us": times[len(times) // 2], "p99_us": times[max(0, -(-len(times) * 99 // 100) - 1)], "n": len(times),
                      "src": s, "dst": d}))


if __name__ == "__main__":
    main()
