"""A trainer or a receiver of the weights benchmark (bench/weights.ts), started with spawnPython. Node
sends commands on the parent link (one reply each); the state dict travels on a direct link between
the two Python processes (listen / connect), as a tensor set (share_tensors), and the receiver copies
it into its own parameters with update_in_place. Times are taken in the trainer, from the send to the
receiver's acknowledgement, which it sends once its copies finished (stream synchronized); the
receiver splits that time into phases from the trainer's send timestamp (both read CLOCK_MONOTONIC).

  {op: 'build', tensors, gib, seed, ipc_pool}   the synthetic state dict (with ipc_pool, allocated in
                                         cuda_ipc.ipc_mem_pool(); the previous one is freed first)
                                         -> {count, bytes, checksum, segments, pool}
  {op: 'listen', name} / {op: 'connect', name}
  {op: 'limit', syncs}                   trainer: torch._foreach_copy_ of the same bytes in this process -> {times}
  {op: 'run', syncs, fresh, split}       trainer: `syncs` sends -> {times, exports, send}
  {op: 'serve', syncs, fresh, split, method}   receiver: `syncs` updates -> {opened, phases, bytes, operations, method}
  {op: 'checksum'} -> {checksum};  {op: 'free'} -> {}

fresh: every sync starts cold (the trainer asks for its handles again and encodes anew, and sends its
pool's fd again; the receiver closed its mappings and imported pools, forgot its decoded tables and
plans): the first sync of a pair of processes. The trainer's clock starts once the receiver says it is
ready (its forgetting is not part of a sync).
The receiver acknowledges once its copies finished, then closes the previous sync's sets (off the
critical path: the trainer's next step runs meanwhile); 'close' is that time.
split: the state dict goes as that many sets (messages); 1 (the default) sends it whole, in one large
message (docs/PROTOCOL.md section 3.1), which Python sends and receives once its large messages are in.
"""
import gc
import os
import sys
import threading
import time

import torch

from cuda_ipc import IpcError, connect, ipc_mem_pool, legacy_cache_stats, listen, parent_link, share_tensors, update_in_place
from cuda_ipc.tensors import tensor_set_transfer as tensor_set
from cuda_ipc.cuda import driver as _drv
from cuda_ipc import memory as _mem
from cuda_ipc.ipc import cache as _cache
from cuda_ipc.tensors import tensor_map as _tensor_map
from cuda_ipc.tensors import update as _update

import weights_model as wm

# Where a trainer's encode goes (measured, not changed): the allocations looked up (one driver query
# each, and the legacy handle asked of the driver on a first sync) and the table encoded; and where a
# receiver's update waits for its mappings (TensorMap.bases()).
_spent = {"allocations": 0.0, "table": 0.0, "map": 0.0}


def _timed(key, fn):
    def wrapper(*args, **kwargs):
        t = time.perf_counter_ns()
        try:
            return fn(*args, **kwargs)
        finally:
            _spent[key] += (time.perf_counter_ns() - t) / 1000
    return wrapper


tensor_set._device_alloc = _timed("allocations", tensor_set._device_alloc)
_tensor_map.TensorMap.bases = _timed("map", _tensor_map.TensorMap.bases)
tensor_set._ask_handles = _timed("allocations", tensor_set._ask_handles)
tensor_set.encode_table = _timed("table", tensor_set.encode_table)

link = parent_link()
torch.cuda.synchronize()
peer = None
accepted = threading.Event()
sd = None
kept = []
shared = None
targets = None
mem_pool = None  # the trainer's ipc_mem_pool(), kept while its state dict lives


def chunks(names, split):
    n = len(names)
    return [names[i * n // split:(i + 1) * n // split] for i in range(split)]


def now():
    return time.perf_counter_ns()


def handle(msg):
    global peer, sd, kept, shared, targets, mem_pool
    op = msg["op"]
    if op == "build":
        sd = shared = None
        gc.collect()
        torch.cuda.empty_cache()
        if msg.get("ipc_pool"):
            mem_pool = ipc_mem_pool()
            with torch.cuda.use_mem_pool(mem_pool):
                sd = wm.build(torch, msg["tensors"], msg["gib"], msg["seed"])
        else:
            sd = wm.build(torch, msg["tensors"], msg["gib"], msg["seed"])
        facts = [_drv.pointer_facts(t.data_ptr()) for t in sd.values()]
        link.send({"count": len(sd), "bytes": wm.nbytes(sd), "checksum": wm.checksum(torch, sd),
                   "segments": len({f.base for f in facts}), "pool": all(f.pool for f in facts)})
    elif op == "listen":
        server = listen(msg["name"])

        def accept(server=server):
            global peer
            peer = server.accept(timeout=60)
            accepted.set()
        threading.Thread(target=accept, daemon=True).start()
        link.send({})
    elif op == "connect":
        peer = connect(msg["name"], timeout=60)
        accepted.set()
        link.send({})
    elif op == "limit":
        src = list(sd.values())
        dst = [torch.empty_like(t) for t in src]
        times = []
        for _ in range(msg["syncs"] + 1):
            torch.cuda.synchronize()
            t0 = now()
            torch._foreach_copy_(dst, src)
            torch.cuda.synchronize()
            times.append((now() - t0) / 1000)
        del dst
        gc.collect()
        torch.cuda.empty_cache()
        link.send({"times": times[1:]})  # the first launches the kernels' first use
    elif op == "run":
        accepted.wait(60)
        names = list(sd)
        parts = chunks(names, msg["split"])
        times, exports, send_us, alloc_us, table_us = [], [], [], [], []
        for i in range(msg["syncs"]):
            first, last = sd[names[0]], sd[names[-1]]
            first.add_(1)  # the training step changes the weights (in place, as optimizers do)
            last.add_(1)
            torch.cuda.synchronize()
            if msg["fresh"] or shared is None:
                shared = [share_tensors({n: sd[n] for n in part}) for part in parts]
                if msg["fresh"]:
                    _mem._export_handles.clear()  # ask the driver for every handle again
                    peer.handler_state.pop(_cache._POOLS_SENT, None)  # and send the pool's fd again
                    # The clock starts once the receiver finished forgetting (its gc.collect() alone
                    # takes tens of ms): a first sync meets a receiver that waits for it.
                    ready = peer.receive(timeout=120)
                    assert ready == {"ready": i}, ready
            e0 = tensor_set.handle_exports
            _spent["allocations"] = _spent["table"] = 0.0
            t0 = now()
            for s in shared:
                peer.send({"weights": s, "sync": i, "t0": t0})
            t1 = now()
            ack = peer.receive(timeout=120)
            t2 = now()
            assert ack == {"ack": i}, ack
            times.append((t2 - t0) / 1000)
            send_us.append((t1 - t0) / 1000)
            exports.append(tensor_set.handle_exports - e0)
            alloc_us.append(_spent["allocations"])
            table_us.append(_spent["table"])
        link.send({"times": times, "exports": exports, "send": send_us, "allocations": alloc_us, "table": table_us})
    elif op == "serve":
        accepted.wait(60)
        names = list(sd)
        split = msg["split"]
        if targets is None or len(targets) != split:
            targets = [{n: sd[n] for n in part} for part in chunks(names, split)]
        opened, result = [], None
        phases = {"receive": [], "map": [], "plan": [], "table": [], "launch": [], "sync": [], "close (after the ack)": []}
        for i in range(msg["syncs"]):
            if msg["fresh"]:
                for ts in kept:
                    ts.close()
                kept = []
                peer.handler_state.pop("cuda_ipc.tensors.tensor_set_transfer.layouts", None)
                peer.handler_state.pop("cuda_ipc.tensors.tensor_set_transfer.records", None)
                _tensor_map._descriptors.clear()
                for pool in peer.handler_state.pop(_cache._POOLS_RECEIVED, {}).values():
                    pool.release()  # the pool is imported again from the fd the trainer sends again
                _update._plans.clear()
                gc.collect()
                peer.send({"ready": i})
            o0 = legacy_cache_stats()["opened"]
            msgs = [peer.receive(timeout=120) for _ in range(split)]
            t1 = now()
            t0 = msgs[0]["t0"]  # the trainer's clock at its send: both read CLOCK_MONOTONIC
            sets = [m["weights"] for m in msgs]
            t2 = now()
            ops = 0
            spent = {"plan": 0.0, "table": 0.0, "launch": 0.0}
            _spent["map"] = 0.0
            for target, ts in zip(targets, sets):
                # As a user's call: the plan first, then the addresses (TensorMap.bases(), timed: the
                # handle opens or pool imports of a first sync, started as the set was decoded, waited for).
                result = update_in_place(target, ts, method=msg["method"])
                ops += result.operations
                for k in spent:
                    spent[k] += (result.timings or {}).get(k, 0.0)
            t3 = now()
            torch.cuda.synchronize()  # the copies (on the update's stream) and anything before them
            t4 = now()
            peer.send({"ack": i})
            # The previous sync's sets, closed once this sync's are mapped (their mappings stay
            # open for these), after the ack: the trainer goes on meanwhile.
            for ts in kept:
                ts.close(sync=False)
            kept = sets
            t5 = now()
            opened.append(legacy_cache_stats()["opened"] - o0)
            phases["receive"].append((t1 - t0) / 1000)
            phases["map"].append((t2 - t1) / 1000 + _spent["map"])
            # plan / table / launch as update_in_place measured them (its plan less the wait in bases());
            # the rest of t2..t3 (Python around the calls) goes to plan
            spent["plan"] -= _spent["map"]
            for k, v in spent.items():
                phases[k].append(v)
            phases["plan"][-1] += max(0.0, (t3 - t2) / 1000 - sum(spent.values()) - _spent["map"])
            phases["sync"].append((t4 - t3) / 1000)
            phases["close (after the ack)"].append((t5 - t4) / 1000)
        link.send({"opened": opened, "phases": phases, "bytes": sum(r.nbytes for r in kept), "operations": ops, "method": result.method})
    elif op == "checksum":
        link.send({"checksum": wm.checksum(torch, sd)})
    elif op == "free":
        for ts in kept:
            ts.close()
        kept = []
        sd = shared = targets = None
        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        link.send({})


# CUDA_IPC_BENCH_PROFILE=FILE: each 'run' and 'serve' under cProfile, its busiest functions (by own time and by cumulative time) appended to
# FILE.<pid> (where a phase's time goes, function by function, on the GPU machine).
_profile_to = os.environ.get("CUDA_IPC_BENCH_PROFILE")
_pool_built = False


def profiled(msg):
    global _pool_built
    if msg["op"] == "build":
        _pool_built = bool(msg.get("ipc_pool"))
    if not _profile_to or msg["op"] not in ("run", "serve"):
        return handle(msg)
    import cProfile
    import io
    import pstats
    prof = cProfile.Profile()
    prof.enable()
    try:
        return handle(msg)
    finally:
        prof.disable()
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(25)
        pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(30)
        with open(f"{_profile_to}.{os.getpid()}", "a") as f:
            f.write(f"=== {msg['op']} syncs={msg['syncs']} fresh={msg['fresh']} method={msg.get('method')} ipc_pool={_pool_built}\n{out.getvalue()}\n")


for msg in link:
    try:
        profiled(msg)
    except IpcError as e:  # said to Node, which stops the run (e.g. a message too large for a frame)
        link.send({"error": f"{e.code}: {e}"})
sys.exit(0)
