"""Connects to the Node listener named argv[1], sends {hello, pid, buffer} (a HostBuffer of argv[2]
bytes filled with 7), waits for {fill}, checks that the buffer now holds that byte, replies {ok},
then waits for the listener's goodbye."""
import os
import sys

from cuda_ipc import HostBuffer, connect

with connect(sys.argv[1]) as link:
    buf = HostBuffer.allocate(int(sys.argv[2]))
    buf.fill(7)
    link.send({"hello": "from python", "pid": os.getpid(), "peerPid": link.peer.pid, "buffer": buf})
    reply = link.receive(timeout=10)
    link.send({"ok": all(b == reply["fill"] for b in buf.memory)})
    for _ in link:
        pass
    buf.close()
