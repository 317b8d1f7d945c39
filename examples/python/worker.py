"""A PyTorch worker of the Python example (examples/python/server.ts), started with spawnPython.

It builds a small fixed-weight MLP on the GPU (y = relu(x W1 + b1) W2 + b2, weights from a formula
and a seed, so that the server can compute the same model), takes request batches from a
work-sharing channel whose slots are device memory, runs the model on each slot in place (a tensor
view, no copy) and writes the answer straight into a slot of the answer channel. GPU work is ordered
by the channels' fences on the worker's stream: no CPU wait per request.

    python3 worker.py <index> <batch> <d_in> <hidden> <d_out> <seed>
"""
import math
import sys

import torch

from cuda_ipc import accept_channel, parent_link


def weights(rows: int, cols: int, seed: float) -> torch.Tensor:
    """W[i, j] = sin(seed + 0.37 i + 0.11 j) / sqrt(rows), rounded to float32 (server.ts: weight())."""
    i = torch.arange(rows, dtype=torch.float64).unsqueeze(1)
    j = torch.arange(cols, dtype=torch.float64).unsqueeze(0)
    return (torch.sin(seed + 0.37 * i + 0.11 * j) / math.sqrt(rows)).float().cuda()


def bias(n: int, seed: float) -> torch.Tensor:
    """b[j] = cos(seed + 0.23 j) / 10, rounded to float32 (server.ts: biasOf())."""
    return (torch.cos(seed + 0.23 * torch.arange(n, dtype=torch.float64)) / 10).float().cuda()


def main() -> None:
    index, batch, d_in, hidden, d_out = (int(a) for a in sys.argv[1:6])
    seed = float(sys.argv[6])
    link = parent_link()
    requests = accept_channel(link, role="consumer", memory="device")
    answers = accept_channel(link, role="producer", memory="device")
    w1, b1 = weights(d_in, hidden, seed), bias(hidden, seed)
    w2, b2 = weights(hidden, d_out, seed + 1), bias(d_out, seed + 1)
    stream = torch.cuda.Stream()
    served = 0
    with torch.cuda.stream(stream), torch.no_grad():
        for msg in requests:
            msg.wait_on(stream)  # after the server's upload, on the GPU
            x = torch.as_tensor(msg.view("float32", (batch, d_in)), device="cuda")  # the slot itself
            slot = answers.acquire(stream=stream)  # after the server read the slot's last answer
            y = torch.as_tensor(slot.view("float32", (batch, d_out)), device="cuda")
            torch.addmm(b2, torch.relu(torch.addmm(b1, x, w1)), w2, out=y)
            answers.publish(slot, stream=stream, meta={**msg.meta, "worker": index})
            msg.release(stream=stream)  # the server's next upload into this slot waits for our read
            del x, y
            served += 1
    answers.end(timeout=120)
    link.send({"served": served})
    requests.close()
    link.close()


if __name__ == "__main__":
    main()
