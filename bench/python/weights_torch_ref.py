"""References of the weights benchmark (bench/weights.ts): the same synthetic state dict from a trainer
process to a receiver process that ends with the values in its own parameters, the ways RL stacks do
it with PyTorch alone, over a torch.multiprocessing queue:

  per-tensor  reduce_tensor of every tensor (verl, vime): the receiver rebuilds each one
              (rebuild_cuda_tensor), copies it into its parameter, and drops it
  packed      1 GiB buckets (vLLM's pack_tensors, slime's FlattenedTensorBucket): the trainer
              concatenates a bucket's tensors into one flat buffer (a copy of every byte), shares it
              (one handle), the receiver slices it and copies the slices, bucket by bucket

  python3 weights_torch_ref.py MODE TENSORS GIB SYNCS
Prints one JSON line: {times_us, handles, sender_copied, receiver_copied, checksum_ok}.
"""
import json
import sys
import time

import torch
import torch.multiprocessing as mp
from torch.multiprocessing.reductions import reduce_tensor

import weights_model as wm


def receiver(mode, tensors, gib, q, ack):
    torch.cuda.init()
    sd = wm.build(torch, tensors, gib, 2)
    ack.put("ready")
    with torch.no_grad():
        while True:
            item = q.get()
            if item is None:
                break
            if item == "checksum":
                ack.put(wm.checksum(torch, sd))
                continue
            if mode == "per-tensor":
                rebuilt = [(n, fn(*args)) for n, (fn, args) in item]
                for n, t in rebuilt:
                    sd[n].copy_(t)
                torch.cuda.synchronize()
                del rebuilt
            else:
                (fn, args), meta = item
                flat = fn(*args)
                views = [flat[o:o + k].view(shape) for _, o, k, shape in meta]
                torch._foreach_copy_([sd[n] for n, *_ in meta], views)
                torch.cuda.synchronize()
                del views, flat
            ack.put("done")


def main():
    mode, tensors, gib, syncs = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
    ctx = mp.get_context("spawn")
    q, ack = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=receiver, args=(mode, tensors, gib, q, ack))
    p.start()
    sd = wm.build(torch, tensors, gib, 1)
    assert ack.get(timeout=600) == "ready"
    plan = wm.buckets(sd)
    times, handles = [], []
    sender_copied = 0
    with torch.no_grad():
        for i in range(syncs + 1):  # the first warms both sides up and is not counted
            names = list(sd)
            sd[names[0]].add_(1)
            sd[names[-1]].add_(1)
            torch.cuda.synchronize()
            t0 = time.perf_counter_ns()
            if mode == "per-tensor":
                items = [(n, reduce_tensor(t)) for n, t in sd.items()]
                shared = {args[7] for _, (_fn, args) in items}  # distinct cudaIpcMemHandles
                q.put(items)
                assert ack.get(timeout=600) == "done"
                del items
                copied = 0
            else:
                shared = set()
                copied = 0
                for bucket in plan:
                    flat = torch.cat([sd[n].reshape(-1) for n in bucket])
                    copied += flat.numel() * flat.element_size()
                    meta, o = [], 0
                    for n in bucket:
                        k = sd[n].numel()
                        meta.append((n, o, k, tuple(sd[n].shape)))
                        o += k
                    fn, args = reduce_tensor(flat)
                    shared.add(args[7])
                    torch.cuda.synchronize()
                    q.put(((fn, args), meta))
                    assert ack.get(timeout=600) == "done"
                    del flat
            t1 = time.perf_counter_ns()
            if i:
                times.append((t1 - t0) / 1000)
                handles.append(len(shared))
                sender_copied = copied
            torch.cuda.ipc_collect()
    q.put("checksum")
    theirs = ack.get(timeout=600)
    ok = abs(theirs - wm.checksum(torch, sd)) <= 1e-6 * max(1.0, abs(theirs))
    q.put(None)
    p.join(60)
    print(json.dumps({"times_us": times, "handles": handles, "sender_copied": sender_copied, "receiver_copied": wm.nbytes(sd),
                      "checksum_ok": ok, "tensors": len(sd)}))


if __name__ == "__main__":
    main()
