"""The Python listener as the victim of test/cpu/security-links.test.ts (run as root, the attacker as
another user). argv: a mode, then its arguments; prints one JSON line per result.

``race DIR NAME SECONDS ALLOW_UID``: listens on NAME in DIR (allowing ALLOW_UID) and closes again, as
often as it can for SECONDS, while the attacker swaps names there; prints the count of each outcome
(an IpcError code, or ``untyped: <type>`` for anything else).

``serve DIR NAME ALLOW_UID``: listens, prints {"listening": path}, then accepts (handshakes side by
side) until a link of its own uid arrives, sends it "welcome" and prints {"accepted": uid, "pending": n}.
"""
import json
import os
import sys
import time

from cuda_ipc import IpcError, listen

mode = sys.argv[1]
if mode == "race":
    directory, name, seconds, allow = sys.argv[2], sys.argv[3], float(sys.argv[4]), int(sys.argv[5])
    outcomes: dict[str, int] = {}
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            listen(name, directory=directory, allow_uids=[allow]).close()
            key = "ok"
        except IpcError as e:
            key = e.code
        except Exception as e:  # noqa: BLE001 - what the test must never see
            key = f"untyped: {type(e).__name__}: {e}"
        outcomes[key] = outcomes.get(key, 0) + 1
    print(json.dumps(outcomes), flush=True)
elif mode == "serve":
    directory, name, allow = sys.argv[2], sys.argv[3], int(sys.argv[4])
    # A long handshake timeout: the attacker's silent connections stay held for the whole test.
    with listen(name, directory=directory, allow_uids=[allow], handshake_timeout=60) as server:
        print(json.dumps({"listening": server.path}), flush=True)
        deadline = time.monotonic() + 20
        while True:
            link = server.accept(timeout=max(0.01, deadline - time.monotonic()))
            if link.peer.uid == os.getuid():
                link.send("welcome")
                print(json.dumps({"accepted": link.peer.uid, "pending": len(server._pending)}), flush=True)
                try:
                    link.receive(timeout=10)  # until the peer closes
                except IpcError:
                    pass
                break
            link.close()
