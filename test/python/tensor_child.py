"""Python child for the tensor-set tests (test/cpu/python-tensors.test.ts), started with spawnPython. One
reply per command until the parent closes the link:

  {op: 'describe', weights}        -> {names, dtypes, shapes, strides, values: {name: flat values}} of a
                                      received set (host memory), then closes it
  {op: 'hold', weights}            keeps the set -> {held}
  {op: 'drop'}                     closes every held set -> {dropped}
  {op: 'echo', weights}            sends the received set back as it came -> {weights}, then closes ours
  {op: 'produce', count}           sends `count` float32 tensors of its own (tensor i: 16 values i*16+k,
                                      every third transposed) as one set -> {weights}
  {op: 'update', weights, shapes}  makes HostArrays of {name: [dtype, shape]}, update_in_place from the set,
                                      -> {values} or {error: code, message}
  {op: 'leases'}                   -> {count} of what it sent that Node still holds
"""
from cuda_ipc import HostArray, HostBuffer, IpcError, parent_link, share_tensors, update_in_place

link = parent_link()
held = []
own = []

for msg in link:
    op = msg["op"]
    if op == "describe":
        ts = msg["weights"]
        views = {n: ts.view(n) for n in ts}
        link.send({
            "memory": ts.memory, "allocations": len(ts.allocations), "names": list(ts),
            "dtypes": [v.dtype for v in views.values()], "shapes": [list(v.shape) for v in views.values()],
            "strides": [list(v.strides) for v in views.values()],
            "values": {n: v.tolist() for n, v in views.items()},
        })
        del views
        ts.close()
    elif op == "hold":
        held.append(msg["weights"])
        link.send({"held": len(held)})
    elif op == "drop":
        for ts in held:
            ts.close()
        n = len(held)
        held.clear()
        link.send({"dropped": n})
    elif op == "echo":
        ts = msg["weights"]
        link.send({"weights": ts})
        ts.close()
    elif op == "produce":
        count = msg["count"]
        buf = HostBuffer.allocate(count * 64)
        f = buf.memory.cast("f")
        for i in range(count * 16):
            f[i] = float(i)
        f.release()
        named = {}
        for i in range(count):
            if i % 3 == 2:
                named[f"block.{i}.w.T"] = HostArray(buf, "float32", (4, 4), strides=(4, 16), offset=64 * i)
            else:
                named[f"block.{i}.w"] = HostArray(buf, "float32", (4, 4), offset=64 * i)
        link.send({"weights": share_tensors(named)})
        for a in named.values():
            a.close()
        buf.close()
    elif op == "update":
        ts = msg["weights"]
        mine = {n: HostArray.allocate(d, s) for n, (d, s) in msg["shapes"].items()}
        try:
            r = update_in_place(mine, ts, strict=msg.get("strict", True))
            link.send({"copied": r.copied, "missing": r.missing, "unexpected": r.unexpected,
                       "values": {n: a.tolist() for n, a in mine.items()}})
        except IpcError as e:
            link.send({"error": e.code, "message": str(e)})
        for a in mine.values():
            a.close()
        ts.close()
    elif op == "leases":
        link.poll()
        link.send({"count": link.leases.count})
