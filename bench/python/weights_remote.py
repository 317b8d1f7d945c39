"""A trainer or a receiver of the remote weights benchmark (bench/weights-remote.ts), started with
spawnPython: the weights bench's state dict (weights_model.py) from a trainer on one GPU to receivers
on others over TCP links, the bytes over NCCL (cuda_ipc's nccl-tensor-set), received in place
(update_in_place straight into the receiver's parameters). Node sends commands on the parent link,
one reply each; the state dict travels on the TCP links between the Python processes.

  {op: 'build', tensors, gib, seed, ordinal}   the state dict on GPU ``ordinal`` -> {count, bytes}
  {op: 'listen', token, links}                 trainer: -> {url}; accepts ``links`` links in the background
  {op: 'connect', url, token}                  receiver
  {op: 'accepted'}                             trainer: once every link is there
  {op: 'run', syncs, warmup, links, broadcast} trainer: ``warmup`` + ``syncs`` syncs to the first ``links`` links (a
                                               Fanout over them with ``broadcast``), each of the last ``syncs`` timed
                                               from the send to the last acknowledgement -> {times, send}
  {op: 'serve', syncs, warmup}                 receiver: as many updates, each acknowledged once its values are in
                                               the parameters -> {phases (of the last ``syncs``), method, operations}
  {op: 'checksum'} -> {checksum};  {op: 'free'}

A sync: the trainer changes its weights in place (an optimizer step), then sends the state dict (its
share_tensors object, made once: the plan is reused while the tensors stay); times use the monotonic
clock both processes read (the receiver's phases start at the trainer's send).
"""
import threading
import time

import torch

from cuda_ipc import Device, Fanout, connect, listen, parent_link, set_working_device, share_tensors, update_in_place

import weights_model as wm

link = parent_link()
sd = None
shared = None
targets = None
links = []
enough = threading.Event()


def now():
    return time.perf_counter_ns()


def handle(msg):
    global sd, shared, targets, links
    op = msg["op"]
    if op == "build":
        torch.cuda.set_device(msg["ordinal"])
        set_working_device(Device.get(msg["ordinal"]))
        sd = wm.build(torch, msg["tensors"], msg["gib"], msg["seed"], device=f"cuda:{msg['ordinal']}")
        return {"count": len(sd), "bytes": wm.nbytes(sd)}
    if op == "listen":
        server = listen("tcp://127.0.0.1:0", token=msg["token"])
        want = msg["links"]

        def accept():
            while len(links) < want:
                links.append(server.accept(timeout=300))
            enough.set()
        threading.Thread(target=accept, daemon=True).start()
        return {"url": server.url}
    if op == "connect":
        links.append(connect(msg["url"], token=msg["token"], timeout=120))
        return {}
    if op == "accepted":
        assert enough.wait(300), "the receivers did not all connect"
        return {}
    if op == "run":
        to = links[:msg["links"]]
        fan = Fanout(to) if msg["broadcast"] else None
        names = list(sd)
        if shared is None:
            shared = share_tensors(sd)
        times, send_us = [], []
        warmup = msg.get("warmup", 0)
        for i in range(warmup + msg["syncs"]):
            with torch.no_grad():
                sd[names[0]].add_(1)  # the training step changes the weights in place
                sd[names[-1]].add_(1)
            t0 = now()
            message = {"weights": shared, "sync": i, "t0": t0}
            if fan is not None:
                fan.send(message)
            else:
                to[0].send(message)
            t1 = now()
            for x in to:
                ack = x.receive(timeout=600)
                assert ack == {"ack": i}, ack
            t2 = now()
            if i >= warmup:
                times.append((t2 - t0) / 1000)
                send_us.append((t1 - t0) / 1000)
        if fan is not None:
            fan.close()
        return {"times": times, "send": send_us}
    if op == "serve":
        data = links[0]
        if targets is None:
            targets = dict(sd)  # made once: a repeated update reuses its plan
        phases = {"receive": [], "plan": [], "wait": [], "queue": [], "transfer": [], "ack": []}
        r = None
        for i in range(msg.get("warmup", 0) + msg["syncs"]):
            m = data.receive(timeout=600)
            t1 = now()
            r = update_in_place(targets, m["weights"])
            t2 = now()
            data.send({"ack": i})
            t3 = now()
            m["weights"].close()
            timings = r.timings or {}
            phases["receive"].append((t1 - m["t0"]) / 1000)
            for k in ("plan", "wait", "queue", "transfer"):
                phases[k].append(float(timings.get(k, 0.0)))
            phases["plan"][-1] += max(0.0, (t2 - t1) / 1000 - sum(float(timings.get(k, 0.0)) for k in ("plan", "wait", "queue", "transfer")))
            phases["ack"].append((t3 - t2) / 1000)
        skip = msg.get("warmup", 0)
        phases = {k: v[skip:] for k, v in phases.items()}
        return {"phases": phases, "method": r.method if r else None, "operations": r.operations if r else 0}
    if op == "checksum":
        return {"checksum": wm.checksum(torch, sd)}
    if op == "free":
        for x in links:
            x.close()
        links = []
        sd = shared = targets = None
        torch.cuda.empty_cache()
        return {}
    raise ValueError(f"unknown op {op}")


for msg in link:
    if msg.get("op") == "exit":
        link.send({})
        break
    try:
        link.send(handle(msg))
    except Exception as e:  # noqa: BLE001 - said to Node, which stops the run
        code = getattr(e, "code", type(e).__name__)
        link.send({"error": f"{code}: {e}"})
