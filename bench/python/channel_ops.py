"""The Python channel ends' own cost per message, in one process (issue 38): no Node, no second
process, so no cache lines moving between cores and no waits, only what the Python end executes.

    cd python && python3 ../bench/python/channel_ops.py [--slots N] [--batch N] [--rounds N]

A producer and a consumer end in this process on a channel of the tests' Python hub
(python/tests/channel_hub.py, which makes the control block as Node's hub does), host slots of
4 KiB. Each round: ``batch`` messages through acquire / write one byte / publish, then as many through
the iterator / read one byte / release (the bench's per-message loops, bench/python/channel_oneway.py),
then a batch through acquire_many / publish_many and receive_many / release. Each side is timed
alone (time.perf_counter_ns around its loop); prints the median and 10th percentile over the rounds
of each side's nanoseconds per message, and the hot path that ran (CUDA_IPC_PY_NATIVE=0: the
standard library's). The cross-process rows (Node at the other end) are
bench/python-ratios.ts's; a change in the figures here is the Python side's own.
"""
import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))

from tests.channel_hub import TestHub  # noqa: E402  (the package and its tests from python/)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--slots", type=int, default=64)
    ap.add_argument("--batch", type=int, default=64, help="messages per round and per batch call (at most --slots)")
    ap.add_argument("--rounds", type=int, default=3000)
    a = ap.parse_args()
    if not 1 <= a.batch <= a.slots or a.rounds < 1:
        raise SystemExit("channel_ops.py: --batch must be in 1..--slots, --rounds positive")
    hub = TestHub(slots=a.slots, slot_bytes=4096)
    producer = hub.attach("producer")
    consumer = hub.attach("consumer")
    it = iter(consumer)
    clock = time.perf_counter_ns
    b = a.batch

    def rounds(n: int) -> list[list[float]]:
        out: list[list[float]] = [[], [], [], []]
        for _ in range(n):
            t0 = clock()
            for _ in range(b):
                slot = producer.acquire()
                slot.memory[0] = 1
                producer.publish(slot, length=8)
            t1 = clock()
            for _ in range(b):
                msg = next(it)
                msg.memory[0]
                msg.release()
            t2 = clock()
            slots = producer.acquire_many(b)
            for slot in slots:
                slot.memory[0] = 1
            producer.publish_many(slots, length=8)
            t3 = clock()
            msgs = consumer.receive_many(b)
            for msg in msgs:
                msg.memory[0]
                msg.release()
            t4 = clock()
            out[0].append((t1 - t0) / b)
            out[1].append((t2 - t1) / b)
            out[2].append((t3 - t2) / len(slots))
            out[3].append((t4 - t3) / len(msgs))
        return out

    try:
        rounds(max(1, a.rounds // 6))  # warm-up, dropped
        res = rounds(a.rounds)
    finally:
        producer.close()
        consumer.close()
        hub.close()

    def fmt(xs: list[float]) -> str:
        return f"{statistics.median(xs):6.0f} (p10 {sorted(xs)[len(xs) // 10]:.0f})"
    print(f"hot path {producer.hot_path}; {a.slots} slots, {b} messages a round, {a.rounds} rounds; ns per message, median (p10)")
    print(f"  producer acquire + publish          {fmt(res[0])}")
    print(f"  consumer iterate + release          {fmt(res[1])}")
    print(f"  producer acquire_many/publish_many  {fmt(res[2])}")
    print(f"  consumer receive_many + release     {fmt(res[3])}")


if __name__ == "__main__":
    main()
