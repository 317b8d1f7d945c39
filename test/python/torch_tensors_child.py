"""Python child for the GPU tensor-set tests (test/gpu/python-tensors.test.ts), with PyTorch and a GPU.
One reply per command from Node (parent_link); a second link, to another Python child, for the
trainer -> receiver flows (listen / connect):

  {op: 'describe', weights}         torch tensors of a received set -> {names, dtypes, shapes, strides,
                                    bytes: {name: C-order bytes as hex}}; closes it
  {op: 'state-dict'}                a small model's state dict, caching-allocator sub-allocations, a
                                    transposed view and a strided slice -> sent as one set, with the
                                    bytes of each tensor -> {weights, bytes, segments}
  {op: 'check-back', weights}       a set of our own tensors sent back: same pointers, same values -> {ok}
  {op: 'listen', name} / {op: 'connect', name}    the link between the two children
  {op: 'model', seed, ipc_pool}     builds the model (trainer or receiver); with ipc_pool, under
                                    torch.cuda.use_mem_pool(cuda_ipc.ipc_mem_pool()) -> {names, pools:
                                    how many of its tensors' allocations lie in a CUDA memory pool}
  {op: 'send'}                      trainer: sends share_tensors(state_dict) on the peer link (the same
                                    SharedTensors each time) -> {handle_exports}
  {op: 'step'}                      trainer: adds 1 to every parameter in place -> {}
  {op: 'apply', keep}               receiver: receives a set, update_in_place into its parameters (one
                                    strided destination among them), checks against load_state_dict ->
                                    {ok, copied, operations, method, opened, kinds}; keeps the set until the next
  {op: 'hold'}                      receiver: receives a set and keeps it (to be killed holding it)
  {op: 'drop'}                      receiver: closes what it keeps -> {mappings}
  {op: 'free'}                      trainer: drops its model and the shared set, empties torch's cache,
                                    waits for the peer's releases -> {reserved, leases}
  {op: 'mem'}                       empties torch's cache -> {free (device-wide), reserved, legacy}
  {op: 'pool-arena'}                in this process: tensors of many sizes (one larger than a chunk) under
                                    ipc_mem_pool(), every other freed and allocated again, values checked
                                    -> {ok, tensors, allocations, chunks, freed}
  {op: 'odd-update'}                in this process: 3000 uint8/bf16 tensors of odd sizes at odd offsets,
                                    update_in_place (copy_runs) from a dict, twice -> {ok, method, operations}
"""
import copy
import gc
import os
import threading
import time

import torch

from cuda_ipc import Device, connect, ipc_mem_pool, ipc_mem_pool_stats, legacy_cache_stats, listen, parent_link, share_tensors, update_in_place
from cuda_ipc.tensors import tensor_set_transfer as tensor_set
from cuda_ipc.tensors import kernels as copy_kernels
from cuda_ipc.cuda import driver as drv

torch.manual_seed(0)
link = parent_link()
dev = torch.device("cuda", 0)
torch.cuda.synchronize()  # the CUDA context now, so that device memory measured later does not count it
peer = None
listener = None
accepted = threading.Event()
model = None
shared = None
kept = None
strided_target = None
apply_target = None


def make_model(seed):
    g = torch.Generator().manual_seed(seed)
    m = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 32), torch.nn.LayerNorm(32))
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    m.register_buffer("extra", torch.randn(16, 8, generator=g))
    # 128 MiB, so that memory held after the sender freed it would show in the device's free memory.
    m.register_buffer("bulk", torch.full((32 << 20,), float(seed)))
    return m.to(dev)


def c_bytes(t):
    """A tensor's bytes in C order, as hex."""
    return bytes(t.detach().contiguous().cpu().view(torch.uint8).reshape(-1).tolist()).hex()


def step(m):
    # In a function: a loop variable at module level (this loop used to be one) is a global that
    # keeps the last parameter, so its 2 MiB caching-allocator segment, alive after 'free' dropped
    # the model (memory_reserved() was 2097152 there, not 0).
    with torch.no_grad():
        for p in m.parameters():
            p.add_(1)


def pool_arena():
    """The IPC pool's allocator carves PyTorch's segments out of a few chunks: segments never overlap
    (each tensor keeps its own value while all live, and after every other one was freed and the
    cache emptied, and new ones took their place), the model's tensors lie in a few pool allocations,
    and everything goes back once the pool is dropped."""
    sizes = [1000 + i for i in range(120)] + [(5 << 20) + 4096 * i for i in range(40)] + [(64 << 20) + i for i in range(8)] + [(5 << 29) + 2]
    pool = ipc_mem_pool()

    def check(ts, values):
        torch.cuda.synchronize()
        return all(t is None or bool(t.eq(v).all()) for t, v in zip(ts, values))

    values = [i % 251 for i in range(len(sizes))]
    with torch.cuda.use_mem_pool(pool):
        ts = [torch.full((n,), v, dtype=torch.uint8, device=dev) for n, v in zip(sizes, values)]
    ok = check(ts, values)
    with Device.get(0).activate():
        bases = {drv.pointer_facts(t.data_ptr()).base for t in ts}
    held = ipc_mem_pool_stats(0)
    for i in range(0, len(ts), 2):
        ts[i] = None
    gc.collect()
    torch.cuda.empty_cache()
    ok = ok and check(ts, values)
    with torch.cuda.use_mem_pool(pool):
        for i in range(0, len(ts), 2):
            ts[i] = torch.full((sizes[i],), (i + 7) % 251, dtype=torch.uint8, device=dev)
            values[i] = (i + 7) % 251
    ok = ok and check(ts, values)
    ts = None
    del pool
    gc.collect()
    torch.cuda.empty_cache()
    return {"ok": ok, "tensors": len(sizes), "allocations": len(bases), "chunks": held["chunks"], "used": held["used"],
            "bytes": sum(sizes), "freed": ipc_mem_pool_stats(0)}


def odd_update():
    """Sizes from 1 byte to several 64 KiB chunks; sources at offsets sharing the destination's
    misalignment, differing from it, or aligned; bf16 views among them. Values compared with torch."""
    n = 3000
    sizes = [200_000 + i if i % 211 == 0 else 1 + (i * 7919) % 3001 for i in range(n)]
    src_store = torch.randint(0, 256, (sum(sizes) + 16 * n + 64,), dtype=torch.uint8, device=dev)
    dst_store = torch.zeros(sum(sizes) + 16 * n + 64, dtype=torch.uint8, device=dev)  # offsets grow by < 16 a tensor
    src, dst = {}, {}
    s = d = 0
    for i, size in enumerate(sizes):
        s += i % 7
        d += (s - d) % 16 if i % 3 == 0 else i % 5
        if i % 10 == 9 and size % 2 == 0:  # bf16 views need even offsets and sizes
            s += s % 2
            d += d % 2
            src[f"t{i}"] = src_store[s:s + size].view(torch.bfloat16)
            dst[f"t{i}"] = dst_store[d:d + size].view(torch.bfloat16)
        else:
            src[f"t{i}"] = src_store[s:s + size]
            dst[f"t{i}"] = dst_store[d:d + size]
        s += size
        d += size
    ok = True
    for _ in range(2):
        r = update_in_place(dst, src, sync=True)
        ok = ok and all(torch.equal(dst[k].view(torch.uint8), src[k].view(torch.uint8)) for k in src)
        src_store.add_(1)
    written = torch.zeros_like(dst_store, dtype=torch.bool)
    for t in dst.values():
        u = t.view(torch.uint8)
        off = u.data_ptr() - dst_store.data_ptr()
        written[off:off + u.numel()] = True
    ok = ok and int(dst_store[~written].count_nonzero()) == 0
    return {"ok": bool(ok), "method": r.method, "operations": r.operations, "copied": r.copied}


for msg in link:
    op = msg["op"]
    if op == "describe":
        ts = msg["weights"]
        out = {"names": list(ts), "dtypes": [], "shapes": [], "strides": [], "bytes": {}}
        for n in ts:
            t = ts[n]
            assert t.is_cuda
            out["dtypes"].append(str(t.dtype).replace("torch.", ""))
            out["shapes"].append(list(t.shape))
            out["strides"].append([s * t.element_size() for s in t.stride()])
            out["bytes"][n] = c_bytes(t)
        link.send(out)
        ts.close()
    elif op == "state-dict":
        m = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 16), torch.nn.LayerNorm(16)).to(dev, torch.bfloat16)
        big = torch.arange(64 * 16, dtype=torch.float32, device=dev).reshape(64, 16)
        sd = dict(m.state_dict())
        sd["extra.T"] = m[0].weight.t()  # a transposed view of a parameter
        sd["big.slice"] = big[:, 3:7]  # strided, with gaps
        sd["big.row"] = big[5]  # a view at an offset
        with Device.get(0).activate():
            bases = {drv.address_range(t.data_ptr())[0] for t in sd.values()}
        model = (m, big)
        link.send({"weights": share_tensors(sd), "bytes": {n: c_bytes(t) for n, t in sd.items()}, "segments": len(bases)})
    elif op == "check-back":
        ts = msg["weights"]
        m, big = model
        sd = dict(m.state_dict())
        sd["extra.T"] = m[0].weight.t()
        sd["big.slice"] = big[:, 3:7]
        sd["big.row"] = big[5]
        ok = all(ts[n].data_ptr() == t.data_ptr() and torch.equal(ts[n], t) for n, t in sd.items())
        ts.close()
        link.send({"ok": ok})
    elif op == "listen":
        listener = listen(msg["name"])

        def accept():
            global peer
            peer = listener.accept(timeout=30)
            accepted.set()
        threading.Thread(target=accept, daemon=True).start()
        link.send({"listening": True})
    elif op == "connect":
        peer = connect(msg["name"])
        link.send({"connected": True})
    elif op == "model":
        if listener is not None:
            accepted.wait(30)
        if msg.get("ipc_pool"):
            mem_pool = ipc_mem_pool()
            with torch.cuda.use_mem_pool(mem_pool):
                model = make_model(msg["seed"])
        else:
            model = make_model(msg["seed"])
        with Device.get(0).activate():
            pools = sum(1 for t in model.state_dict().values() if drv.pointer_facts(t.data_ptr()).pool)
        if msg.get("strided_extra"):
            # Our 'extra' is a transposed view of storage of our own: a strided destination.
            store = torch.zeros(8, 16, device=dev)
            strided_target = store.t()
            # The receiver's copy kernel loaded and launched once now, so that the device memory
            # the test measures from here on counts no module or launch resources of ours.
            warm_src = torch.arange(64, dtype=torch.uint8, device=dev)
            warm_dst = torch.zeros(64, dtype=torch.uint8, device=dev)
            with Device.get(0).activate():
                table = copy_kernels.plan_runs([warm_dst.data_ptr()], [warm_src.data_ptr()], [64])
                warm = copy_kernels.DeviceTable(0)
                warm.upload(table, 0)
                warm.launch(table, 0)
                torch.cuda.synchronize()
                warm.close()
            assert bool((warm_dst == warm_src).all()), "the warm-up copy copied"
            del warm_src, warm_dst
        link.send({"names": list(model.state_dict()), "pools": pools})
    elif op == "send":
        if shared is None:
            shared = share_tensors(model.state_dict())
        peer.send({"weights": shared})
        link.send({"handle_exports": tensor_set.handle_exports})
    elif op == "step":
        step(model)
        link.send({})
    elif op == "apply":
        ts = peer.receive(timeout=30)["weights"]
        if apply_target is None:  # made once, as a trainer's receiver would: the update's plan is kept for it
            apply_target = dict(model.state_dict(keep_vars=True))
            if strided_target is not None:
                apply_target["extra"] = strided_target
        target = apply_target
        r = update_in_place(target, ts, sync=True)
        reference = copy.deepcopy(model)
        reference.load_state_dict({n: ts[n] for n in ts})
        ok = all(torch.equal(target[n], t) for n, t in reference.state_dict().items())
        del reference
        if kept is not None:
            kept.close()
        kept = ts
        link.send({"ok": ok, "copied": r.copied, "operations": r.operations, "method": r.method, "opened": legacy_cache_stats()["opened"],
                   "uploaded": r.timings["uploaded"] if r.timings else -1, "kinds": sorted({a.kind for a in ts.allocations})})
    elif op == "hold":
        kept = peer.receive(timeout=30)["weights"]
        _ = [kept[n] for n in kept]
        link.send({"held": len(kept)})
    elif op == "drop":
        if kept is not None:
            kept.close()
        kept = None
        gc.collect()
        link.send({"mappings": legacy_cache_stats()["mappings"]})
    elif op == "free":
        model = None
        shared = None
        gc.collect()
        deadline = time.monotonic() + 10
        while peer is not None and not peer.closed and peer.leases.count and time.monotonic() < deadline:
            try:
                peer.poll()
            except Exception:  # noqa: BLE001 - the peer may be gone: its leases ended with the link
                break
            time.sleep(0.01)
        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        link.send({"reserved": torch.cuda.memory_reserved(), "leases": peer.leases.count if peer is not None else 0})
    elif op == "mem":
        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()  # what this process freed itself (the load_state_dict references) goes back
        link.send({"free": torch.cuda.mem_get_info()[0], "reserved": torch.cuda.memory_reserved(), "legacy": legacy_cache_stats()})

    elif op == "pool-arena":
        link.send(pool_arena())
    elif op == "odd-update":
        link.send(odd_update())

if kept is not None:
    kept.close()
os._exit(0)
