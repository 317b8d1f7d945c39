"""A sync group rank in a process of its own, for test_sharded_group.py, test/cpu/sharded-interop.test.ts
and test/gpu/python-sharded.test.ts: argv[1] is a JSON spec {"join": address | "host": address,
"size": n, "token": ..., "layout": [fixture function, args...], "device": false}. It prints one JSON
line per event ({"ready": ..., "address": ...}, then per command) and reads commands from stdin:
"sync V" (fill the sources with data version V, sync, check the destinations against V), "exit".
With "device": true the rank's tensors are torch CUDA tensors on its layout's GPU, filled from and
checked through host arrays of the same values."""
from __future__ import annotations

import json
import os
import sys
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from cuda_ipc import IpcError  # noqa: E402
from cuda_ipc.tensors.sharded import ShardGroup  # noqa: E402
from tests.sharded_group_fixture import allocate, check_destinations, fill_sources, layout_by_name  # noqa: E402


def say(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


def to_device(torch: Any, a: Any, gpu: int) -> Any:
    """A CUDA copy of a C-contiguous int32 HostArray."""
    return torch.frombuffer(a.memory, dtype=torch.int32).view(a.shape).to(f"cuda:{gpu}")


def main() -> None:
    spec = json.loads(sys.argv[1])
    layout = layout_by_name(spec["layout"])
    sources, destinations = allocate(layout)
    fill_sources(layout, sources, 0)
    given_sources: list[Any] = list(sources)
    given_destinations: list[Any] = list(destinations)
    device = bool(spec.get("device"))
    if device:
        import torch
        torch.cuda.set_device(layout.gpu)
        given_sources = [to_device(torch, a, layout.gpu) for a in sources]
        given_destinations = [to_device(torch, a, layout.gpu) for a in destinations]
    token = spec.get("token")
    if "host" in spec:
        group = ShardGroup.host(listen=spec["host"], size=spec["size"], layout=layout, sources=given_sources,
                                destinations=given_destinations, token=token, timeout=0)
        say(listening=True, address=group.address)
        group.wait_ready(60)
    else:
        group = ShardGroup.join(connect=spec["join"], layout=layout, sources=given_sources, destinations=given_destinations,
                                token=token, timeout=60)
    say(ready=True, rank=group.rank, epoch=group.epoch)
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        if words[0] == "exit":
            break
        if words[0] == "sync":
            v = int(words[1])
            fill_sources(layout, sources, v)
            if device:
                for host, dev in zip(sources, given_sources):
                    dev.copy_(to_device(torch, host, layout.gpu))
            try:
                # The sources were written on torch's current stream: the sync waits for it.
                r = group.sync(timeout=30, stream=torch.cuda.current_stream() if device else None)
            except IpcError as e:
                say(error=e.code, detail=getattr(e, "detail", {}), message=str(e))
                continue
            if device:
                for host, dev in zip(destinations, given_destinations):
                    torch.frombuffer(host.memory, dtype=torch.int32).view(dev.shape).copy_(dev.cpu())
            say(version=r.version, problems=check_destinations(layout, destinations, v), paths=r.paths, epoch=group.epoch)
    group.close()
    say(closed=True)


if __name__ == "__main__":
    main()
