"""One-way channel throughput with a Python end (bench/channel.ts, the Python rows).

    channel_oneway.py sink <wait> [batch]   consumer: reads the first byte of each message,
                                             releases it; ends with {"n", "sum", "cpu", ...}.
                                             With a batch size, receives with receive_many(batch)
    channel_oneway.py source <wait> <count> [batch]
                                             producer: writes one byte and publishes `count`
                                             messages of 8 bytes, then ends; sends {"cpu", ...}.
                                             With a batch size, acquire_many(batch) / publish_many
cpu: this process's CPU time (user + system, microseconds) over the messages; hot_path and native:
which hot path the channel end ran (cuda_ipc.native_helper()); waits: how the end's waits ended
(wait_stats: spin_hits, sleeps, ...); ranOn: the CPU it ran on at the end (-1 where /proc does not
say). Pins itself to the CPU the bench names (CUDA_IPC_BENCH_CPU), as the Node children do
(bench/placement.ts).
"""
import os
import sys
import time

from cuda_ipc import native_helper, parent_link
from cuda_ipc.channel import accept_channel


def cpu_us() -> float:
    t = time.process_time()
    return t * 1e6


def pin() -> None:
    cpu = os.environ.get("CUDA_IPC_BENCH_CPU")
    if cpu is not None and cpu.isdigit() and hasattr(os, "sched_setaffinity"):
        try:
            os.sched_setaffinity(0, {int(cpu)})
        except OSError:
            pass


def ran_on() -> int:
    """The CPU this process last ran on (field 39 of /proc/self/stat), -1 where it cannot be read."""
    try:
        with open("/proc/self/stat") as f:
            stat = f.read()
        return int(stat[stat.rindex(")") + 2:].split(" ")[39 - 3])
    except (OSError, ValueError, IndexError):
        return -1


def report(end, **values) -> dict:
    info = native_helper()
    return {**values, "hot_path": end.hot_path, "native": info.path if info.active else info.reason,
            "waits": end.wait_stats, "ranOn": ran_on()}


def main() -> None:
    pin()
    mode, wait = sys.argv[1], sys.argv[2]
    link = parent_link()
    if mode == "sink":
        batch = int(sys.argv[3]) if len(sys.argv) > 3 else 0
        consumer = accept_channel(link, role="consumer", wait=wait)
        n = 0
        total = 0
        c0 = cpu_us()
        if batch:
            while True:
                msgs = consumer.receive_many(batch)
                if not msgs:
                    break
                for msg in msgs:
                    total += msg.memory[0]
                    n += 1
                    msg.release()
        else:
            for msg in consumer:
                total += msg.memory[0]
                n += 1
                msg.release()
        cpu = cpu_us() - c0
        consumer.close()
        link.send(report(consumer, n=n, sum=total, cpu=cpu))
    elif mode == "source":
        count = int(sys.argv[3])
        batch = int(sys.argv[4]) if len(sys.argv) > 4 else 0
        producer = accept_channel(link, role="producer", wait=wait)
        c0 = cpu_us()
        if batch:
            left = count
            while left:
                slots = producer.acquire_many(min(batch, left))
                for slot in slots:
                    slot.memory[0] = 1
                producer.publish_many(slots, length=8)
                left -= len(slots)
        else:
            for _ in range(count):
                slot = producer.acquire()
                slot.memory[0] = 1
                producer.publish(slot, length=8)
        producer.end()
        cpu = cpu_us() - c0
        producer.close()
        link.send(report(producer, cpu=cpu))
    else:
        raise SystemExit(f"channel_oneway.py: unknown mode {mode!r}")
    link.close()


if __name__ == "__main__":
    main()
