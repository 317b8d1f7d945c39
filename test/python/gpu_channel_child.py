"""Python child for the device-slot channel test (test/gpu/python-channel.test.ts), started with
spawnPython: a consumer of Node's device-slot channel and a producer of a second one. For every
message it runs a PyTorch kernel on the slot in place (zero-copy, ordered after Node's kernel by the
channel's fence on its own stream), y = 3 * x + 7 over int32 elements, written straight into a slot
of the answer channel, published on the same stream; the release of the request waits for that
work on the GPU. Then ends its producer and sends {count, checked} (checked: the first messages,
whose inputs it also compared on the CPU)."""
import torch

from cuda_ipc import accept_channel, parent_link

link = parent_link()
requests = accept_channel(link, role="consumer", memory="device")
answers = accept_channel(link, role="producer", memory="device")
n = requests.slot_bytes // 4
stream = torch.cuda.Stream()
count = 0
checked = 0
with torch.cuda.stream(stream), torch.no_grad():
    for msg in requests:
        seq = msg.meta["seq"]
        msg.wait_on(stream)  # GPU-side: after Node's kernel wrote the slot
        x = torch.as_tensor(msg.view("int32", (n,)), device="cuda")
        if count < 3:
            expect = torch.arange(n, dtype=torch.int32, device="cuda") + seq * 1000
            if not torch.equal(x, expect):
                raise SystemExit(f"message {seq}: the slot does not hold what Node wrote")
            checked += 1
        slot = answers.acquire(stream=stream)  # GPU-side: after Node's check of the slot's last answer
        out = torch.as_tensor(slot.view("int32", (n,)), device="cuda")
        torch.add(x * 3, 7, out=out)
        answers.publish(slot, stream=stream, meta={"seq": seq})
        msg.release(stream=stream)
        del x, out
        count += 1
answers.end(timeout=120)
link.send({"count": count, "checked": checked})
requests.close()
link.close()
