"""The synthetic model of the weights benchmark (bench/weights.ts): a bf16 MoE-like state dict with a
few large tensors (embedding, LM head), attention matrices, and many small expert matrices, norms and
routers; by default about 8 GiB in about 3,000 tensors. Every process builds the same names and
shapes; values differ per seed."""
import math

HIDDEN = 2048
VOCAB = 131072
LAYERS = 16


def layout(tensors: int = 3000, gib: float = 8.0):
    """[(name, shape)] in state-dict order."""
    experts = max(1, round((tensors / LAYERS - 7) / 3))
    per_layer_fixed = 4 * HIDDEN * HIDDEN + 2 * HIDDEN + 64 * HIDDEN  # q k v o, two norms, router
    vocab = VOCAB
    fixed = 2 * vocab * HIDDEN + LAYERS * per_layer_fixed + HIDDEN
    target = int(gib * (1 << 30)) // 2  # elements
    if fixed > target * 0.6:  # a small run: shrink the big tensors with it
        vocab = max(1024, int(target * 0.2 / (2 * HIDDEN)) // 64 * 64)
        fixed = 2 * vocab * HIDDEN + LAYERS * per_layer_fixed + HIDDEN
    inter = max(64, (target - fixed) // (LAYERS * experts * 3 * HIDDEN) // 64 * 64)
    out = [("model.embed_tokens.weight", (vocab, HIDDEN))]
    for layer in range(LAYERS):
        p = f"model.layers.{layer}."
        out += [(p + "input_layernorm.weight", (HIDDEN,))]
        out += [(p + f"self_attn.{m}_proj.weight", (HIDDEN, HIDDEN)) for m in ("q", "k", "v", "o")]
        out += [(p + "post_attention_layernorm.weight", (HIDDEN,)), (p + "mlp.gate.weight", (64, HIDDEN))]
        for e in range(experts):
            q = f"{p}mlp.experts.{e}."
            out += [(q + "gate_proj.weight", (inter, HIDDEN)), (q + "up_proj.weight", (inter, HIDDEN)), (q + "down_proj.weight", (HIDDEN, inter))]
    out += [("model.norm.weight", (HIDDEN,)), ("lm_head.weight", (vocab, HIDDEN))]
    return out


def build(torch, tensors: int, gib: float, seed: int, device="cuda"):
    """The state dict, allocated the way a model's parameters are (one torch.empty each, in order)."""
    g = torch.Generator(device=device).manual_seed(seed)
    sd = {}
    for name, shape in layout(tensors, gib):
        t = torch.empty(shape, dtype=torch.bfloat16, device=device)
        t.normal_(generator=g)
        sd[name] = t
    torch.cuda.synchronize()
    return sd


#: The packed-bucket references' bucket size (1 GiB, as the issue measured).
BUCKET = 1 << 30


def buckets(sd):
    """The state dict's names in runs of at most BUCKET bytes (a bigger tensor alone), in order."""
    out, cur, size = [], [], 0
    for n, t in sd.items():
        b = t.numel() * t.element_size()
        if cur and size + b > BUCKET:
            out.append(cur)
            cur, size = [], 0
        cur.append(n)
        size += b
    if cur:
        out.append(cur)
    return out


def nbytes(sd) -> int:
    return sum(t.numel() * t.element_size() for t in sd.values())


def checksum(torch, sd) -> float:
    """A value that changes with every tensor (sum of a few elements of each, in float64)."""
    acc = torch.zeros((), dtype=torch.float64, device=next(iter(sd.values())).device)
    for t in sd.values():
        flat = t.reshape(-1)
        acc += flat[:: max(1, flat.numel() // 7)].double().sum()
    return float(acc.item())


def percentile(values, q):
    s = sorted(values)
    return s[min(len(s) - 1, math.ceil(len(s) * q) - 1)] if s else float("nan")
