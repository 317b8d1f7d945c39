"""Child of the Python-link benchmark (bench/python-link.ts), started with spawnPython. For each
message: read one value of what arrived and acknowledge with it, or hand a fresh tensor to Node.

  {op: 'host', buffer}    a HostBuffer: read the first uint32, close, ack
  {op: 'torch', buffer}   a device buffer: view it as a float32 torch tensor (zero-copy), read t[0],
                          close, ack
  {op: 'give'}            allocate a fresh 1 MiB float32 torch tensor and send it (Node reads one
                          value and releases it)
  'end'                   exit
"""
import sys

from cuda_ipc import parent_link

link = parent_link()
torch = None

for msg in link:
    if msg == "end":
        break
    op = msg["op"]
    if op == "host":
        buf = msg["buffer"]
        mv = buf.memory
        value = mv[0] | mv[1] << 8 | mv[2] << 16 | mv[3] << 24
        mv.release()
        buf.close()
        link.send(value)
    elif op == "torch":
        if torch is None:
            import torch
        buf = msg["buffer"]
        t = torch.as_tensor(buf.view("float32"), device="cuda")
        value = t[0].item()  # synchronizes: nothing of ours is queued on the memory after this
        del t
        buf.close(sync=False)
        link.send(value)
    elif op == "give":
        if torch is None:
            import torch
        t = torch.empty(262144, dtype=torch.float32, device="cuda")
        link.send(t)
        del t  # the lease keeps it until Node releases it
link.close()
sys.exit(0)
