"""Python child for the channel tests (test/cpu/python-channel.test.ts), started with spawnPython. The
first argument says what it does:

  relay      accept a consumer end, then a producer end (host slots); for every message check its
             checksum, answer with u32 index, u32 crc32 of the payload, the payload xor 0x5a (meta
             echoed); end the producer once the consumer ended; then send {done: n, wait_stats,
             hot_paths: [the consumer's, the producer's]}.
  hold N     accept a consumer end, take N messages without releasing them, send {held: [positions]},
             then wait (to be killed).
  produce N  accept a producer end, publish N messages (u32 index), send {published: N}, then wait
             (to be killed) without ending.
  consume    accept a consumer end, read messages until the channel ends; send {received: [u32...]}
             or {error: code, received: [...]}, then exit. With a path as second argument it writes
             that JSON there instead (its hub may be gone).
"""
import json
import struct
import sys
import time
import zlib

from cuda_ipc import IpcError, accept_channel, parent_link

link = parent_link()
mode = sys.argv[1]
XOR = bytes(b ^ 0x5A for b in range(256))

if mode == "relay":
    consumer = accept_channel(link, role="consumer", memory="host")
    producer = accept_channel(link, role="producer", memory="host")
    n = 0
    for msg in consumer:
        with msg:
            mem = msg.memory
            index, crc = struct.unpack_from("<II", mem, 0)
            payload = mem[8:]
            if index != n or zlib.crc32(payload) != crc:
                raise SystemExit(f"message {n}: index {index}, checksum {crc:#x} != {zlib.crc32(payload):#x}")
            slot = producer.acquire(timeout=30)
            out = slot.memory
            length = len(mem)
            struct.pack_into("<II", out, 0, index, zlib.crc32(payload))
            out[8:length] = bytes(payload).translate(XOR)
            producer.publish(slot, length=length, meta=msg.meta)
            del mem, payload, out
        n += 1
    producer.end(timeout=30)
    link.send({"done": n, "wait_stats": consumer.wait_stats, "hot_paths": [consumer.hot_path, producer.hot_path]})
    consumer.close()
elif mode == "hold":
    consumer = accept_channel(link, role="consumer")
    held = [consumer.receive(timeout=30) for _ in range(int(sys.argv[2]))]
    link.send({"held": [m.position for m in held], "index": consumer.index})
    time.sleep(60)
elif mode == "produce":
    producer = accept_channel(link, role="producer")
    n = int(sys.argv[2])
    for i in range(n):
        slot = producer.acquire(timeout=30)
        struct.pack_into("<I", slot.memory, 0, i)
        producer.publish(slot, length=4, meta={"i": i})
    link.send({"published": n})
    time.sleep(60)
elif mode == "consume":
    consumer = accept_channel(link, role="consumer")
    got = []
    result = {}
    try:
        for msg in consumer:
            with msg:
                got.append(struct.unpack_from("<I", msg.memory, 0)[0])
        result = {"received": got}
    except IpcError as e:
        result = {"error": e.code, "message": str(e), "received": got}
    if len(sys.argv) > 2:
        with open(sys.argv[2] + ".tmp", "w") as f:
            json.dump(result, f)
        import os
        os.replace(sys.argv[2] + ".tmp", sys.argv[2])
    else:
        link.send(result)
    consumer.close()
link.close()
