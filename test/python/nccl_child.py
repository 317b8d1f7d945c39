"""Python rank of an NCCL communicator with Node (test/gpu/nccl-python.test.ts), with PyTorch: tensors
are torch's, the stream torch's current stream, NCCL the library CUDA_IPC_NCCL_LIBRARY names (the
same file as Node's: NCCL refuses ranks of different versions). One reply per command:

  {op: 'init', id, nranks, rank, ordinal}   -> {version, path, rank, nranks, cuda_device}
  {op: 'recv', bytes, peer, seed}           an int32 tensor received, compared with seed + i -> {mismatches}
  {op: 'send', bytes, peer, seed}           seed + i sent -> {}
  {op: 'close'}                             -> {}
Errors come back as {error: traceback}.
"""
import traceback

import torch

from cuda_ipc import parent_link
from cuda_ipc.nccl import NcclCommunicator, load_nccl

link = parent_link()
comm = None
ordinal = 0

for msg in link:
    try:
        op = msg["op"]
        if op == "exit":
            break
        if op == "init":
            ordinal = msg["ordinal"]
            torch.cuda.set_device(ordinal)
            lib = load_nccl()
            comm = NcclCommunicator.init(bytes(msg["id"]), msg["nranks"], msg["rank"], device=ordinal, library=lib, timeout=120)
            link.send({"version": lib.version, "path": lib.path, "rank": comm.rank, "nranks": comm.nranks, "cuda_device": comm.cuda_device})
        elif op in ("recv", "send"):
            assert comm is not None
            n = msg["bytes"] // 4
            stream = torch.cuda.current_stream(ordinal)
            expected = torch.arange(msg["seed"], msg["seed"] + n, dtype=torch.int32, device=f"cuda:{ordinal}")
            if op == "recv":
                t = torch.zeros(n, dtype=torch.int32, device=f"cuda:{ordinal}")
                comm.recv(t.data_ptr(), msg["bytes"], msg["peer"], stream=stream, timeout=120)
                stream.synchronize()
                link.send({"mismatches": int((t != expected).sum().item())})
            else:
                comm.send(expected.data_ptr(), msg["bytes"], msg["peer"], stream=stream, timeout=120)
                stream.synchronize()
                link.send({})
        elif op == "close":
            assert comm is not None
            comm.close(timeout=120)
            link.send({})
        else:
            link.send({"error": f"unknown op {op}"})
    except Exception:
        link.send({"error": traceback.format_exc()})
if comm is not None and not comm.closed:
    comm.abort()
