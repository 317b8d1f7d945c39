"""The trainer of examples/weights (spawned by main.ts): makes new weights (the example's formula with
another seed, standing in for a training step) and sends them to the server as one tensor set
(share_tensors); the server copies them in place into the memory its workers use. argv[1]: 'device'
(CUDA tensors) or 'host' (HostArray)."""
import math
import sys

from cuda_ipc import HostArray, parent_link, share_tensors

memory = sys.argv[1]
link = parent_link()
kept = None


def weight(rows, cols, seed):
    return [math.sin(seed + 0.37 * i + 0.11 * j) / math.sqrt(rows) for i in range(rows) for j in range(cols)]


def bias(n, seed):
    return [math.cos(seed + 0.23 * j) / 10 for j in range(n)]


for msg in link:
    if msg["op"] == "train":
        s, d_in, hidden, d_out = msg["seed"], msg["d_in"], msg["hidden"], msg["d_out"]
        values = {"w1": (weight(d_in, hidden, s), (d_in, hidden)), "b1": (bias(hidden, s), (hidden,)),
                  "w2": (weight(hidden, d_out, s + 1), (hidden, d_out)), "b2": (bias(d_out, s + 1), (d_out,))}
        if memory == "device":
            import torch
            kept = {n: torch.tensor(v, dtype=torch.float32, device="cuda").view(shape) for n, (v, shape) in values.items()}
        else:
            kept = {}
            for n, (v, shape) in values.items():
                a = HostArray.allocate("float32", shape)
                mv = a.values().cast("B").cast("f")
                for k, x in enumerate(v):
                    mv[k] = x
                kept[n] = a
        link.send({"weights": share_tensors(kept)})
