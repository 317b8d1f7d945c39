"""Python child for the link tests (test/cpu/python-link.test.ts), started with spawnPython. Answers one
reply per command until the parent closes the link:

  {op: 'whoami'}                         -> {pid, peer: {pid, uid, gid}}
  {op: 'echo', value}                    -> {value} (whatever arrived, sent back)
  {op: 'types', value}                   -> {types: {key: python type name}} of a dict's values
  {op: 'verify-and-fill', buffer, expect, fill}   checks every byte == expect, fills with fill,
                                            closes the buffer -> {ok}
  {op: 'float32-double', buffer}         -> {sum} of its float32 values, then doubles them in place
  {op: 'take', buffer}                   keeps it -> {held}
  {op: 'drop'}                           closes every held buffer -> {dropped}
  {op: 'produce', bytes, fill}           allocates a HostBuffer, fills it, sends {buffer}, closes its own handle
  {op: 'produce-view', bytes, offset, length}  sends a view (bytes i & 255 at position i)
  {op: 'check', index, expect}           -> {ok}: every byte of the produced buffer #index == expect
  {op: 'leases'}                         -> {count, bytes, received} (after reading pending releases)
  {op: 'exit', code}                     exits at once without closing the link
"""
import os
import sys

from cuda_ipc import HostBuffer, parent_link

link = parent_link()
held = []
produced = []

for msg in link:
    op = msg["op"]
    if op == "whoami":
        p = link.peer
        link.send({"pid": os.getpid(), "peer": {"pid": p.pid, "uid": p.uid, "gid": p.gid}})
    elif op == "echo":
        link.send({"value": msg["value"]})
    elif op == "types":
        link.send({"types": {k: type(v).__name__ for k, v in msg["value"].items()}})
    elif op == "verify-and-fill":
        buf = msg["buffer"]
        mem = buf.memory
        ok = all(b == msg["expect"] for b in mem)
        buf.fill(msg["fill"])
        del mem
        buf.close()
        link.send({"ok": ok})
    elif op == "float32-double":
        buf = msg["buffer"]
        values = buf.memory.cast("f")
        total = sum(values)
        for i in range(len(values)):
            values[i] *= 2
        values.release()
        buf.close()
        link.send({"sum": total})
    elif op == "take":
        held.append(msg["buffer"])
        link.send({"held": len(held)})
    elif op == "drop":
        n = len(held)
        for b in held:
            b.close()
        held.clear()
        link.send({"dropped": n})
    elif op == "produce":
        b = HostBuffer.allocate(msg["bytes"])
        b.fill(msg["fill"])
        link.send({"buffer": b})
        produced.append(b.view(0, msg["bytes"]))  # our own view, to check what the parent wrote
        b.close()
    elif op == "produce-view":
        b = HostBuffer.allocate(msg["bytes"])
        b.write(bytes(i & 255 for i in range(msg["bytes"])))
        v = b.view(msg["offset"], msg["length"])
        link.send({"buffer": v})
        v.close()
        b.close()
    elif op == "check":
        b = produced[msg["index"]]
        link.send({"ok": all(x == msg["expect"] for x in b.memory)})
    elif op == "leases":
        link.poll()
        c = link.leases
        link.send({"count": c.count, "bytes": c.bytes, "received": link.received_leases})
    elif op == "exit":
        os._exit(msg.get("code", 0))
    else:
        link.send({"error": f"unknown op {op}"})

for b in held + produced:
    b.close()
sys.exit(0)
