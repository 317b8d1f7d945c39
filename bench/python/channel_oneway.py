"""One-way channel throughput with a Python end (bench/channel.ts, the Python rows).

    channel_oneway.py sink <wait>           consumer: reads the first byte of each message,
                                             releases it; ends with {"n", "sum", "cpu"}
    channel_oneway.py source <wait> <count> producer: writes one byte and publishes `count`
                                             messages of 8 bytes, then ends; sends {"cpu"}
cpu: this process's CPU time (user + system, microseconds) over the messages.
"""
import sys
import time

from cuda_ipc import parent_link
from cuda_ipc.channel import accept_channel


def cpu_us() -> float:
    t = time.process_time()
    return t * 1e6


def main() -> None:
    mode, wait = sys.argv[1], sys.argv[2]
    link = parent_link()
    if mode == "sink":
        consumer = accept_channel(link, role="consumer", wait=wait)
        n = 0
        total = 0
        c0 = cpu_us()
        for msg in consumer:
            total += msg.memory[0]
            n += 1
            msg.release()
        cpu = cpu_us() - c0
        consumer.close()
        link.send({"n": n, "sum": total, "cpu": cpu})
    elif mode == "source":
        count = int(sys.argv[3])
        producer = accept_channel(link, role="producer", wait=wait)
        c0 = cpu_us()
        for _ in range(count):
            slot = producer.acquire()
            slot.memory[0] = 1
            producer.publish(slot, length=8)
        producer.end()
        cpu = cpu_us() - c0
        producer.close()
        link.send({"cpu": cpu})
    else:
        raise SystemExit(f"channel_oneway.py: unknown mode {mode!r}")
    link.close()


if __name__ == "__main__":
    main()
