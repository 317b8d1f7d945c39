"""The host work of a weights sync, without a GPU: the Python steps of bench/weights.ts's trainer ->
receiver flow (share_tensors over a link, receive, map, update_in_place's plan, close, the ack) with
the fake driver of python/tests/fake_cuda.py, both ends in this process. Device work is host memcpy
there and driver calls are Python functions, so the absolute figures are not a GPU's; what the
Python code around them costs, and how it changes, is what this measures (issue 30: the repeated
sync's host work, the first sync's encode and decode). The copies are left out (plan: what
update_in_place does before them).

    PYTHONPATH=python python3 bench/python/weights_host_work.py [tensors] [syncs] [--calls]

Prints the median CPU microseconds of each phase of a first (fresh) and a repeated sync; with
--calls, the Python function calls each phase made instead (the same count every run, whatever the
machine's load: the work itself, for comparisons on a busy machine).
"""
import gc
import statistics
import sys
import threading
import time

sys.path.insert(0, __file__.rsplit("/bench/", 1)[0] + "/python")

from tests import fake_cuda  # noqa: E402
from tests.test_link import deliver_releases, pair  # noqa: E402
from cuda_ipc import share_tensors  # noqa: E402
from cuda_ipc.tensors import update as update_mod  # noqa: E402
from cuda_ipc.ipc import cache as memory_mod  # noqa: E402

import weights_model as wm  # noqa: E402

# CPU time of this process (all its threads): the work measured is CPU work, and on a shared
# machine wall time also counts the other processes'.
clock = time.process_time
_calls = 0


def _count(frame, event, arg):  # noqa: ANN001 - sys.setprofile's signature
    global _calls
    if event == "call" or event == "c_call":
        _calls += 1


if "--calls" in sys.argv:
    sys.argv.remove("--calls")
    sys.setprofile(_count)
    threading.setprofile(_count)

    def clock() -> float:  # noqa: F811 - the calls so far instead of the time
        return _calls / 1e6


def build(fake, tensors: int):
    """The model's names and shapes in ~8 tensors per segment, each a small float32 view (the sizes
    do not matter here, the counts do)."""
    names = [n for n, _shape in wm.layout(tensors, 8.0)]
    per = max(1, round(len(names) / max(1, len(names) // 8)))
    named = {}
    seg = 0
    segments = 0
    for i, n in enumerate(names):
        if i % per == 0:
            seg = fake.alloc(64 * per)
            segments += 1
        named[n] = fake_cuda.FakeArray(seg + 64 * (i % per), (4, 4), "<f4")
    return named, segments


def main() -> None:
    tensors = int(sys.argv[1]) if len(sys.argv) > 1 else 3000
    syncs = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    fake = fake_cuda.install()
    la, lb = pair()
    src, segments = build(fake, tensors)
    dst = {n: fake_cuda.FakeArray(fake.alloc(64), (4, 4), "<f4") for n in src}
    print(f"{len(src)} tensors in {segments} allocations (fake driver, one process); plan: update_in_place's, without the copies")
    for label, fresh in (("first sync", True), ("repeated sync", False)):
        phases: dict[str, list[float]] = {k: [] for k in ("encode + send", "receive", "map", "plan", "ack", "close previous")}
        kept = []
        shared = None
        for _ in range(syncs):
            if fresh:
                for ts in kept:
                    ts.close()
                kept = []
                memory_mod._export_handles.clear()
                lb.handler_state.clear()
                update_mod._plans.clear()
                gc.collect()
                shared = None
            t0 = clock()
            if shared is None:
                shared = share_tensors(src, sync=False)
            la.send({"weights": shared})
            t1 = clock()
            memory_mod._local_exports.clear()  # as in another process: the receiver opens the handles
            ts = lb.receive(timeout=30)["weights"]
            t2 = clock()
            ts.bases()
            t3 = clock()
            plan = update_mod._plan_for_set(dst, ts, True)  # update_in_place without its copies (the fake's are slow)
            update_mod._source_pointers(plan, ts)
            t4 = clock()
            lb.send({"ack": True})
            la.receive(timeout=30)
            t5 = clock()
            for old in kept:
                old.close(sync=False)
            kept = [ts]
            deliver_releases(lb, la)
            t6 = clock()
            for k, a, b in (("encode + send", t0, t1), ("receive", t1, t2), ("map", t2, t3), ("plan", t3, t4), ("ack", t4, t5),
                            ("close previous", t5, t6)):
                phases[k].append((b - a) * 1e6)
        for ts in kept:
            ts.close()
        deliver_releases(lb, la)
        unit = "calls" if sys.getprofile() is not None else "us"
        print(f"{label}: " + "; ".join(f"{k} {statistics.median(v):.0f} {unit}" for k, v in phases.items()) +
              f"; before the ack {sum(statistics.median(phases[k]) for k in ('encode + send', 'receive', 'map', 'plan', 'ack')):.0f} {unit}")
    la.close()
    lb.close()
    fake_cuda.uninstall(fake)


if __name__ == "__main__":
    main()
