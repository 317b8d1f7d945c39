"""Python end of the Node<->Python TCP link tests (test/cpu/python-tcp.test.ts). The token comes from
CUDA_IPC_TOKEN (as a user's would).

  tcp_peer.py listen           listens on tcp://127.0.0.1:0, prints {"url": ...}, serves one link
  tcp_peer.py connect URL      connects to URL and serves the link; a failure prints {"error": code}

Answers one reply per command until the peer closes the link:

  {op: 'echo', value}              -> {value}
  {op: 'where'}                    -> {transport, tls, remote: [address, port, family], peer: error code}
  {op: 'host', buffer, expect, n}  checks the received HostBuffer holds bytes i*expect & 255, then sends
                                    {ok, copy, buffer}: a new HostBuffer of n bytes, byte i = i & 255
                                    (copy: its memfd is not one it was sent)
  {op: 'exit', code}               exits at once without closing the link
"""
import json
import os
import sys

import cuda_ipc
from cuda_ipc import HostBuffer, IpcError


def serve(link):
    for msg in link:
        op = msg["op"]
        if op == "echo":
            link.send({"value": msg["value"]})
        elif op == "where":
            try:
                link.peer
                peer = "none"
            except IpcError as e:
                peer = e.code
            link.send({"transport": link.transport, "tls": link.tls, "remote": list(link.remote), "peer": peer})
        elif op == "host":
            buf = msg["buffer"]
            data = buf.read()
            ok = isinstance(buf, HostBuffer) and all(b == (i * msg["expect"]) & 255 for i, b in enumerate(data))
            buf.close()
            out = HostBuffer.allocate(msg["n"])
            out.write(bytes(i & 255 for i in range(msg["n"])))
            link.send({"ok": ok, "length": len(data), "buffer": out})
            out.close()
        elif op == "exit":
            os._exit(msg.get("code", 0))
        else:
            link.send({"error": f"unknown op {op}"})


def main() -> None:
    if sys.argv[1] == "listen":
        with cuda_ipc.listen("tcp://127.0.0.1:0") as server:
            print(json.dumps({"url": server.url}), flush=True)
            with server.accept(timeout=30) as link:
                serve(link)
        return
    try:
        link = cuda_ipc.connect(sys.argv[2], timeout=10)
    except IpcError as e:
        print(json.dumps({"error": e.code}), flush=True)
        sys.exit(2)
    print(json.dumps({"connected": True}), flush=True)
    with link:
        serve(link)


main()
