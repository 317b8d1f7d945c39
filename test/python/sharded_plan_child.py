"""For test/cpu/sharded-agreement.test.ts: reads Node's layout records (JSON on stdin, hex), decodes
and re-encodes them, builds the same scenarios with the Python builder, plans them (whole and per
rank) and prints it all as JSON for Node to compare with its own."""
import json
import sys

from cuda_ipc.tensors.sharded import LayoutError, decode_layout, encode_layout, plan_sharded
from tests.sharded_scenarios import scenarios


def plan_json(plan):
    return {"fingerprint": plan.fingerprint, "scope": plan.scope,
            "pairs": [[p.src, p.dst, p.path, p.bytes, [x for r in p.runs for x in r]] for p in plan.pairs]}


def plan_or_error(layouts):
    try:
        return plan_json(plan_sharded(layouts))
    except LayoutError as e:
        return {"error": {"code": e.code, "tensor": e.tensor, "rank": e.rank,
                          "range": None if e.range is None else {"start": list(e.range.start), "length": list(e.range.length)}}}


request = json.load(sys.stdin)
out = {"scenarios": [], "cases": []}
built = scenarios()
for i, s in enumerate(request["scenarios"]):
    layouts = [decode_layout(bytes.fromhex(h)) for h in s["layouts"]]
    out["scenarios"].append({
        "name": built[i][0],
        "built": [encode_layout(l).hex() for l in built[i][1]],
        "reencoded": [encode_layout(l).hex() for l in layouts],
        "plan": plan_json(plan_sharded(layouts)),
        "own": [plan_json(plan_sharded(layouts, rank=l.rank)) for l in layouts],
    })
for case in request["cases"]:
    out["cases"].append(plan_or_error([decode_layout(bytes.fromhex(h)) for h in case]))
json.dump(out, sys.stdout)
