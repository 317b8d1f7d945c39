"""References of the remote weights benchmark (bench/weights-remote.ts): the same state dict from rank 0
(GPU 0) to rank 1 (GPU 1) with torch.distributed's NCCL, ending with the values in the receiver's own
parameters, the ways RL stacks write it by hand:

  flat        one send of a flat buffer of the same bytes into a flat buffer (no copies: the limit)
  packed      1 GiB buckets: the sender concatenates a bucket (torch.cat, a copy of every byte), sends it,
              the receiver slices it and copies the slices into its parameters (torch._foreach_copy_)
  per-tensor  one send per tensor, received into a new tensor and copied into the parameter

Each sync is timed on rank 0 from the start of its sends to the receiver's acknowledgement (a 4-byte
NCCL send once its copies finished), after one warm-up sync; the NCCL environment (NVLink or the
socket path) is the caller's.

  python3 weights_dist_ref.py TENSORS GIB SYNCS MODES(comma-separated)
Prints one JSON line: {mode: {times_us: [...], checksum_ok}}.
"""
import json
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import weights_model as wm


def run(rank, port, tensors, gib, syncs, modes, out):
    torch.cuda.set_device(rank)
    dev = f"cuda:{rank}"
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2, device_id=torch.device(dev))
    sd = wm.build(torch, tensors, gib, 1 + rank, device=dev)
    total = wm.nbytes(sd)
    names = list(sd)
    plan = wm.buckets(sd)
    ack = torch.zeros(1, dtype=torch.int32, device=dev)
    flat_in = torch.empty(total, dtype=torch.uint8, device=dev) if "flat" in modes and rank == 1 else None
    flat_out = torch.empty(total, dtype=torch.uint8, device=dev) if "flat" in modes and rank == 0 else None
    result = {}
    with torch.no_grad():
        for mode in modes:
            times = []
            for i in range(syncs + 1):  # the first warms NCCL's connections up
                if rank == 0:
                    sd[names[0]].add_(1)
                    sd[names[-1]].add_(1)
                torch.cuda.synchronize()
                dist.barrier()
                t0 = time.perf_counter_ns()
                if rank == 0:
                    if mode == "flat":
                        dist.send(flat_out, 1)
                    elif mode == "packed":
                        for bucket in plan:
                            dist.send(torch.cat([sd[n].reshape(-1) for n in bucket]), 1)
                    else:
                        for n in names:
                            dist.send(sd[n], 1)
                    dist.recv(ack, 1)
                    torch.cuda.synchronize()
                    if i:
                        times.append((time.perf_counter_ns() - t0) / 1000)
                else:
                    if mode == "flat":
                        dist.recv(flat_in, 0)
                    elif mode == "packed":
                        for bucket in plan:
                            flat = torch.empty(sum(sd[n].numel() for n in bucket), dtype=sd[bucket[0]].dtype, device=dev)
                            dist.recv(flat, 0)
                            views, at = [], 0
                            for n in bucket:
                                k = sd[n].numel()
                                views.append(flat[at:at + k].view(sd[n].shape))
                                at += k
                            torch._foreach_copy_([sd[n] for n in bucket], views)
                    else:
                        for n in names:
                            tmp = torch.empty_like(sd[n])
                            dist.recv(tmp, 0)
                            sd[n].copy_(tmp)
                    torch.cuda.synchronize()
                    dist.send(ack, 0)
            ok = True
            if mode != "flat":  # the receiver's parameters hold the sender's values
                mine = torch.tensor([wm.checksum(torch, sd)], dtype=torch.float64, device=dev)
                both = [torch.zeros_like(mine), torch.zeros_like(mine)]
                dist.all_gather(both, mine)
                a, b = both[0].item(), both[1].item()
                ok = bool(abs(a - b) <= 1e-6 * max(1.0, abs(a)))
            result[mode] = {"times_us": times, "checksum_ok": ok}
            torch.cuda.empty_cache()
    if rank == 0:
        out.put(result)
    dist.barrier()
    dist.destroy_process_group()


def main():
    tensors, gib, syncs, modes = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), sys.argv[4].split(",")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=run, args=(r, port, tensors, gib, syncs, modes, out)) for r in range(2)]
    for p in procs:
        p.start()
    result = out.get(timeout=900)
    for p in procs:
        p.join(120)
    print(json.dumps(result))
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
