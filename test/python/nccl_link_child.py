"""A PyTorch process with a TCP link to another process (Python or Node), device memory moved over NCCL,
for test/gpu/nccl-python-link.test.ts. Started with spawnPython; told over that control link what to
do, one reply per command: {ok: true, ...} or {ok: false, error: traceback}.

  {op: 'init', ordinal}                 torch.cuda.set_device(ordinal); the receiving device too
  {op: 'listen', token}                 -> {url}; the link is accepted in the background ('accepted' waits for it)
  {op: 'connect', url, token}
  {op: 'accepted'}
  {op: 'send-tensor', numel, seed, dtype}   int32/float32/bfloat16 seed + i (mod 2^20 for the floats) -> {}
  {op: 'recv-tensor'}                   the next message's 't' checked against its 'seed' (and 'u' against 'useed')
                                        -> {bad, dtype, shape, device, kind, u?}
  {op: 'model', seed}                   a model (embedding, attention-like linears, norms, an MoE-like spread of sizes)
  {op: 'sync', step}                    sender: one training step (in place), then the state dict sent as one set -> {}
  {op: 'update', step, via}             receiver: the next set into this model's parameters ('inplace': update_in_place,
                                        'fetch': ts.fetch() then load_state_dict); compared with a reference model that
                                        loaded the sender's values with torch's load_state_dict -> {method, copied, bad, timings}
  {op: 'fetch-one', name, step}         the next set: ts[name] (received into memory of its own) compared with the
                                        reference stepped too -> {bad, pending, device}
  {op: 'params', specs}                 int32 parameters [{name, numel}], one allocation each
  {op: 'update-params', seed}           the next set ('set') into them by update_in_place, each checked against
                                        seed + 1000 k + i -> {bad, method, copied, operations}
  {op: 'send-params', seed}             those parameters filled with seed + 1000 k + i, sent as one set ('set') -> {}
  {op: 'send-big', mib}                 sender: a tensor of that many MiB sent, and dropped here (the lease keeps it) -> {}
  {op: 'receive-only'}                  receiver: takes the next message in the background (killed meanwhile)
  {op: 'state'}                         -> {allocated, leases, link_closed, reason, threads}
  {op: 'exit'}
"""
from __future__ import annotations

import gc
import threading
import traceback

import torch

import cuda_ipc
from cuda_ipc import Device, connect, listen, parent_link, set_working_device, share_tensors, update_in_place

control = parent_link()
data: cuda_ipc.Link | None = None
accepted = threading.Event()
ordinal = 0
model: torch.nn.Module | None = None
reference: torch.nn.Module | None = None
shared = None
model_seed = 0
params: dict[str, torch.Tensor] = {}
shared_params = None


def expected(numel: int, seed: int, dtype: torch.dtype) -> torch.Tensor:
    i = torch.arange(numel, dtype=torch.int64, device=f"cuda:{ordinal}")
    if dtype in (torch.float32, torch.bfloat16, torch.float16):
        return ((seed + i) % (1 << 8)).to(dtype)  # exact in every float format
    return (seed + i).to(dtype)


def make_model(seed: int, big: bool = True) -> torch.nn.Module:
    """About 520 MiB of bf16 with ``big`` (a 16384 x 16384 matrix: three chunks of the packed stream), plus small tensors."""
    torch.manual_seed(seed)
    layers: list[torch.nn.Module] = [torch.nn.Embedding(4096, 256)]
    if big:
        layers.append(torch.nn.Linear(16384, 16384, bias=False))
    for _ in range(4):
        layers += [torch.nn.LayerNorm(256), torch.nn.Linear(256, 768), torch.nn.Linear(768, 256, bias=False)]
        layers += [torch.nn.Linear(256, 64, bias=False) for _ in range(8)]  # small "experts"
    m = torch.nn.Sequential(*layers).to(device=f"cuda:{ordinal}", dtype=torch.bfloat16)
    m.register_buffer("step", torch.zeros(3, dtype=torch.int64, device=f"cuda:{ordinal}"))
    return m


@torch.no_grad()
def train_step(m: torch.nn.Module, step: int) -> None:
    """A deterministic change of every value (what an optimizer step is to the receiver)."""
    for p in m.parameters():
        p.mul_(0.5).add_(step)
    m.step.add_(step)  # type: ignore[operator]


def check(t: object, seed: int) -> dict:
    """A received tensor against seed + i (a uint8 tensor: its int32 words)."""
    kind = type(t).__module__ + "." + type(t).__qualname__
    if not isinstance(t, torch.Tensor):
        return {"bad": -1, "kind": kind}
    flat = t.reshape(-1)
    words = flat.view(torch.int32) if t.dtype == torch.uint8 else flat
    bad = int((words != expected(words.numel(), seed, words.dtype)).sum().item())
    return {"bad": bad, "dtype": str(t.dtype), "shape": list(t.shape), "device": t.device.index, "kind": kind}


def mismatches(a: torch.nn.Module, b: torch.nn.Module) -> int:
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)
    return sum(int((sa[k] != sb[k]).sum().item()) for k in sa)


def handle(msg: dict) -> dict:  # noqa: C901 - one branch per command
    global data, ordinal, model, reference, shared, model_seed, params, shared_params
    op = msg["op"]
    if op == "init":
        ordinal = msg["ordinal"]
        torch.cuda.set_device(ordinal)
        set_working_device(Device.get(ordinal))
        return {"device": Device.get(ordinal).uuid}
    if op == "listen":
        server = listen("tcp://127.0.0.1:0", token=msg["token"])

        def accept() -> None:
            global data
            data = server.accept(timeout=120)
            accepted.set()
        threading.Thread(target=accept, daemon=True).start()
        return {"url": server.url}
    if op == "connect":
        data = connect(msg["url"], token=msg["token"], timeout=60)
        accepted.set()
        return {}
    if op == "accepted":
        assert accepted.wait(120), "no link was accepted"
        return {}
    assert data is not None
    if op == "send-tensor":
        dtype = getattr(torch, msg["dtype"])
        t = expected(msg["numel"], msg["seed"], dtype)
        data.send({"t": t, "seed": msg["seed"]})
        return {}
    if op == "recv-tensor":
        m = data.receive(timeout=300)
        out = check(m["t"], m["seed"])
        if "u" in m:  # a second device value of the same message
            out["u"] = check(m["u"], m["useed"])
        return out
    if op == "model":
        model_seed = msg["seed"]
        model = make_model(model_seed)
        return {"tensors": len(model.state_dict()), "bytes": sum(t.numel() * t.element_size() for t in model.state_dict().values())}
    if op == "sync":
        assert model is not None
        train_step(model, msg["step"])
        if shared is None:
            shared = share_tensors(model.state_dict())
        data.send({"sd": shared, "step": msg["step"]})
        return {}
    if op == "update":
        assert model is not None
        m = data.receive(timeout=300)
        ts = m["sd"]
        pending = ts.pending
        if msg["via"] == "inplace":
            r = update_in_place(model, ts)
            method, copied, timings = r.method, r.copied, r.timings
        else:
            ts.fetch()
            model.load_state_dict(ts.tensors())
            method, copied, timings = "load_state_dict", len(ts), None
        torch.cuda.synchronize()
        ts.close()
        # The reference: the sender's model rebuilt here and stepped the same way, loaded by torch itself.
        if reference is None:
            reference = make_model(msg["sender_seed"])
        train_step(reference, msg["step"])
        want = make_model(0)
        want.load_state_dict(reference.state_dict())  # what torch's own load puts in the parameters
        bad = mismatches(model, want)
        return {"pending": pending, "method": method, "copied": copied, "bad": bad, "timings": timings}
    if op == "fetch-one":
        ts = data.receive(timeout=300)["sd"]
        pending = ts.pending
        got = ts[msg["name"]]
        assert reference is not None
        train_step(reference, msg["step"])
        bad = int((got != reference.state_dict()[msg["name"]]).sum().item())
        ts.close()
        return {"pending": pending, "bad": bad, "device": got.device.index}
    if op == "params":
        params = {s["name"]: torch.zeros(s["numel"], dtype=torch.int32, device=f"cuda:{ordinal}") for s in msg["specs"]}
        return {}
    if op == "update-params":
        ts = data.receive(timeout=300)["set"]
        r = update_in_place(params, ts)
        ts.close()
        bad = sum(int((p != expected(p.numel(), msg["seed"] + 1000 * k, torch.int32)).sum().item()) for k, p in enumerate(params.values()))
        return {"bad": bad, "method": r.method, "copied": r.copied, "operations": r.operations}
    if op == "send-params":
        for k, p in enumerate(params.values()):
            p.copy_(expected(p.numel(), msg["seed"] + 1000 * k, torch.int32))
        if shared_params is None:
            shared_params = share_tensors(params)
        data.send({"set": shared_params})
        return {}
    if op == "send-big":
        t = torch.full((msg["mib"] << 18,), 7, dtype=torch.int32, device=f"cuda:{ordinal}")
        data.send({"t": t, "seed": 0})
        del t
        return {}
    if op == "receive-only":
        threading.Thread(target=lambda: data.receive(timeout=600), daemon=True).start()  # type: ignore[union-attr]
        return {}
    if op == "state":
        data.poll()  # what the peer sent meanwhile (releases, its end), as a sender reads its link now and then
        gc.collect()  # (no device synchronize: a stream NCCL still holds must not hang this answer)
        threads = [t.name for t in threading.enumerate() if t.name.startswith("cuda-ipc nccl ") and "watchdog" not in t.name]
        reason = data._reason.code if data._reason is not None else None
        return {"allocated": torch.cuda.memory_allocated(ordinal), "leases": data.leases.count, "link_closed": data.closed,
                "reason": reason, "threads": threads}
    raise ValueError(f"unknown op {op}")


for msg in control:
    if msg["op"] == "exit":
        if data is not None:
            data.close()
        control.send({"ok": True})
        break
    try:
        out = handle(msg)
        out["ok"] = True
        control.send(out)
    except Exception:  # noqa: BLE001 - said to the test
        control.send({"ok": False, "error": traceback.format_exc()})
