"""Issue 40.2, the Python side (test/cpu/security-peer-memory.test.ts is the Node one): three
authenticated TCP peers flood an application that only polls (poll() reads ahead of receive()).
The process's bound across links (set here to 16 MiB instead of the 1 GiB default, to keep the test
small; the mechanism does not depend on the size) stops every link from reading ahead once reached:
the memory held for unconsumed messages peaks within the bound plus one message. Then receive()
takes every message, in order: none was lost. The default max_message_bytes is the inbox bound
(256 MiB), and a larger one raises the link's inbox_bytes with it."""
import select
import threading
import time
import unittest

import cuda_ipc
from cuda_ipc.link.transport.received_memory import DEFAULT_MAX_RECEIVED_BYTES, _reset_peak

from .test_tcp import TOKEN, linked

MiB = 2**20
LINKS = 3
MESSAGES = 20
MESSAGE = 2 * MiB
BOUND = 16 * MiB


class ReceivedMemoryTests(unittest.TestCase):
    def test_three_flooding_peers_stay_within_the_process_bound_and_nothing_is_lost(self):
        self.assertEqual(cuda_ipc.received_memory().limit, DEFAULT_MAX_RECEIVED_BYTES)
        cuda_ipc.set_max_received_bytes(BOUND)
        self.addCleanup(cuda_ipc.set_max_received_bytes, DEFAULT_MAX_RECEIVED_BYTES)
        with cuda_ipc.listen("tcp://127.0.0.1:0", token=TOKEN) as server:
            pairs = [linked(server) for _ in range(LINKS)]
            mine = [a for a, _ in pairs]
            errors: list[BaseException] = []

            def flood(link):
                try:
                    for i in range(MESSAGES):
                        link.send(bytes([i & 255]) * MESSAGE)
                except BaseException as e:  # noqa: BLE001 - reported below
                    errors.append(e)
            threads = [threading.Thread(target=flood, args=(b,)) for _, b in pairs]
            _reset_peak()
            for t in threads:
                t.start()
            # The application polls its links and never receives, until the bound stops the reading.
            deadline = time.monotonic() + 60
            while cuda_ipc.received_memory().held < BOUND:
                self.assertLess(time.monotonic(), deadline, f"held {cuda_ipc.received_memory().held} bytes after 60 s")
                select.select(mine, [], [], 1.0)
                for link in mine:
                    link.poll()
            # From here poll() reads nothing more: the senders' bytes wait in the kernel.
            held = cuda_ipc.received_memory().held
            for _ in range(50):
                select.select(mine, [], [], 0.01)
                for link in mine:
                    link.poll()
            memory = cuda_ipc.received_memory()
            self.assertEqual(memory.held, held, "poll() read nothing more past the bound")
            self.assertLessEqual(memory.peak, BOUND + MESSAGE, "held at most the bound plus one message")
            self.assertLess(sum(link.pending_receives for link in mine), LINKS * MESSAGES, "the rest waits with the senders")
            # The application receives: everything, in order.
            for link in mine:
                for i in range(MESSAGES):
                    m = link.receive(timeout=60)
                    self.assertEqual((len(m), m[0], m[-1]), (MESSAGE, i & 255, i & 255))
            for t in threads:
                t.join(timeout=60)
            self.assertEqual(errors, [])
            self.assertEqual(cuda_ipc.received_memory().held, 0)
            for a, b in pairs:
                a.close()
                b.close()

    def test_max_message_bytes_defaults_to_the_inbox_bound_and_raises_it(self):
        with cuda_ipc.listen("tcp://127.0.0.1:0", token=TOKEN) as server:
            a, b = linked(server)
            self.assertEqual((a.max_message_bytes, a.inbox_bytes), (256 * MiB, 256 * MiB))
            a.close()
            b.close()
        with cuda_ipc.listen("tcp://127.0.0.1:0", token=TOKEN, max_message_bytes=512 * MiB) as server:
            a, b = linked(server)
            self.assertEqual((a.max_message_bytes, a.inbox_bytes), (512 * MiB, 512 * MiB))
            a.close()
            b.close()


if __name__ == "__main__":
    unittest.main()
