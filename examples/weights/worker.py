"""A worker of examples/weights (spawned by main.ts): maps the weights the server loaded (one message,
no copy) and answers requests with them: y = relu(x W1 + b1) W2 + b2. It reads the weights at every
request, so it sees what the server copies into them in place. argv[1]: 'device' (PyTorch on the GPU)
or 'host' (pure Python over host shared memory)."""
import array
import sys

from cuda_ipc import parent_link

memory = sys.argv[1]
link = parent_link()
weights = None

if memory == "device":
    import torch


def infer_device(x):
    t = {n: weights[n] for n in ("w1", "b1", "w2", "b2")}  # torch tensors over the server's memory
    xs = torch.tensor(x, dtype=torch.float32, device=t["w1"].device).view(-1, t["w1"].shape[0])
    y = torch.relu(xs @ t["w1"] + t["b1"]) @ t["w2"] + t["b2"]
    return array.array("f", y.reshape(-1).tolist())


def infer_host(x):
    v = {n: weights.view(n) for n in ("w1", "b1", "w2", "b2")}
    d_in, hidden = v["w1"].shape
    d_out = v["w2"].shape[1]
    w1, b1, w2, b2 = (v[n].tolist() for n in ("w1", "b1", "w2", "b2"))
    out = array.array("f")
    for r in range(len(x) // d_in):
        row = x[r * d_in:(r + 1) * d_in]
        h = [max(0.0, b1[j] + sum(row[k] * w1[k * hidden + j] for k in range(d_in))) for j in range(hidden)]
        out.extend(b2[j] + sum(h[k] * w2[k * d_out + j] for k in range(hidden)) for j in range(d_out))
    return out


for msg in link:
    if msg["op"] == "load":
        weights = msg["weights"]  # a TensorMap: views into the server's allocation
        kind = "torch tensors" if memory == "device" else "HostArray views"
        link.send({"tensors": len(weights), "kind": kind})
    elif msg["op"] == "infer":
        link.send({"y": infer_device(msg["x"]) if memory == "device" else infer_host(msg["x"])})
if weights is not None:
    weights.close()
