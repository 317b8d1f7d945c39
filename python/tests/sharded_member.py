"""A sync group rank in a process of its own, for test_sharded_group.py and
test/cpu/sharded-interop.test.ts: argv[1] is a JSON spec {"join": address | "host": address,
"size": n, "token": ..., "layout": [fixture function, args...]}. It prints one JSON line per event
({"ready": ..., "address": ...}, then per command) and reads commands from stdin: "sync V" (fill
the sources with data version V, sync, check the destinations against V), "exit"."""
from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from cuda_ipc import IpcError  # noqa: E402
from cuda_ipc.tensors.sharded import ShardGroup  # noqa: E402
from tests.sharded_group_fixture import allocate, check_destinations, fill_sources, layout_by_name  # noqa: E402


def say(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


def main() -> None:
    spec = json.loads(sys.argv[1])
    layout = layout_by_name(spec["layout"])
    sources, destinations = allocate(layout)
    fill_sources(layout, sources, 0)
    token = spec.get("token")
    if "host" in spec:
        group = ShardGroup.host(listen=spec["host"], size=spec["size"], layout=layout, sources=sources, destinations=destinations,
                                token=token, timeout=0)
        say(listening=True, address=group.address)
        group.wait_ready(60)
    else:
        group = ShardGroup.join(connect=spec["join"], layout=layout, sources=sources, destinations=destinations, token=token, timeout=60)
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
            try:
                r = group.sync(timeout=30)
            except IpcError as e:
                say(error=e.code, detail=getattr(e, "detail", {}), message=str(e))
                continue
            say(version=r.version, problems=check_destinations(layout, destinations, v), paths=r.paths, epoch=group.epoch)
    group.close()
    say(closed=True)


if __name__ == "__main__":
    main()
