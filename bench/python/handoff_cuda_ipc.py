"""Child of the Python-link benchmark (bench/python-link.ts), started with spawnPython. For each
message: read one value of what arrived and acknowledge with it, or hand a fresh tensor to Node.

  {op: 'host', buffer}    a HostBuffer: read the first uint32, close, ack
  {op: 'torch', buffer}   a device buffer: view it as a float32 torch tensor (zero-copy,
                          torch.as_tensor over __cuda_array_interface__; 'dlpack': true:
                          torch.from_dlpack), read t[0], close, ack
  {op: 'give'}            allocate a fresh 1 MiB float32 torch tensor and send it (Node reads one
                          value and releases it)
  {op: 'phases'}          -> the timestamps of the messages that asked for them ('stamp': true),
                          then forgets them
  'end'                   exit

Timestamps (time.monotonic_ns: CLOCK_MONOTONIC, the clock of Node's process.hrtime, so the parent
can line them up with its own) are taken only for messages with 'stamp': true:
  host: [received, viewed, read, closed, ack send started, ack send returned];
  torch: [received, viewed, read, closed, ack send started, ack send returned, mapped, tensor dropped]:
         'mapped' (after buf.ptr: the pool import or handle open) lies between received and viewed,
         'tensor dropped' (after `del t`: torch's deleter) between read and closed;
  give: [received, allocated, send returned].
"""
import sys
import time

from cuda_ipc import parent_link

link = parent_link()
torch = None
stamps = []
now = time.monotonic_ns

for msg in link:
    if msg == "end":
        break
    t0 = now()
    op = msg["op"]
    if op == "host":
        buf = msg["buffer"]
        mv = buf.memory
        t1 = now()
        value = mv[0] | mv[1] << 8 | mv[2] << 16 | mv[3] << 24
        mv.release()
        t2 = now()
        buf.close()
        t3 = now()
        t4 = now()
        link.send(value)
        if msg.get("stamp"):
            stamps.append([t0, t1, t2, t3, t4, now()])
    elif op == "torch":
        if torch is None:
            import torch
        buf = msg["buffer"]
        stamp = msg.get("stamp")
        if stamp:
            buf.ptr  # (maps it now, to time the import apart from torch's part)
        tm = now()
        if msg.get("dlpack"):
            t = torch.from_dlpack(buf.view("float32"))
        else:
            t = torch.as_tensor(buf.view("float32"), device="cuda")
        t1 = now()
        value = t[0].item()  # synchronizes: nothing of ours is queued on the memory after this
        t2 = now()
        del t
        td = now()
        buf.close(sync=False)
        t3 = now()
        t4 = now()
        link.send(value)
        if stamp:
            stamps.append([t0, t1, t2, t3, t4, now(), tm, td])
    elif op == "give":
        if torch is None:
            import torch
        t = torch.empty(262144, dtype=torch.float32, device="cuda")
        t1 = now()
        link.send(t)
        if msg.get("stamp"):
            stamps.append([t0, t1, now()])
        del t  # the lease keeps it until Node releases it
    elif op == "phases":
        link.send({"stamps": stamps})
        stamps = []
link.close()
sys.exit(0)
