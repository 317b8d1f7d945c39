"""Channels from Python: this process as a producer or consumer of a channel a Node process created
(``ChannelHub.attach(link, { role })`` or ``createChannel(link, ...)`` there; ``accept_channel(link)``
here). The same control block, ordering, wake-up and crash rules as Node's ends
(docs/channel-protocol.md); the API is synchronous::

    consumer = accept_channel(parent_link(), role="consumer")
    for msg in consumer:                 # blocks; ends when every producer ended
        with msg:                        # release() on exit: the slot goes back to the producers
            data = msg.memory            # host slots: a memoryview of the message's bytes (no copy)

    producer = accept_channel(link, role="producer")
    slot = producer.acquire()            # blocks while every slot is in flight (backpressure)
    slot.memory[:5] = b"hello"
    producer.publish(slot, length=5, meta={"id": 1})
    producer.end()                       # waits until the consumers released everything

Device slots: ``msg.buffer`` / ``slot.buffer`` is the slot's device memory (``__cuda_array_interface__``
and DLPack, ``view(dtype, shape)``), mapped once per channel. GPU work is ordered through the
channel's fences on the caller's stream (a PyTorch/CuPy/cuda.core stream, or an int CUstream; None
is the legacy default stream): ``msg.wait_on(stream)`` before reading a message on the GPU,
``msg.release(stream=stream)`` after; ``producer.acquire(stream=stream)`` orders your writes after
the consumers' work on the slot's previous message, and ``publish(slot, stream=stream)`` makes the
consumers' work wait for yours. Without a stream, acquire and ``msg.synchronize()`` wait on the CPU.

Waiting: an end spins briefly, then sleeps on its doorbell (an eventfd) and on its link to the hub,
so that it notices the hub's death: then it repairs the control block in the hub's place (the hub's
own ends leave as dead; a consumer then ends with ERR_PEER_GONE after the messages already
published, a producer's acquire raises ERR_PEER_GONE). An end is used by one thread at a time;
``close()`` may come from another thread and wakes a blocked call.

The modules, as on the Node side (src/channel): attach (accept_channel), part (ChannelEnd, what both
ends tell), consumer (ChannelConsumer, ChannelMessage), producer (ChannelProducer, ChannelSlot), endpoint (what
both ends hold), waiter, recovery, block (what an end maps), ring (the protocol over the control
block), layout, shared_words (its atomics), doorbells, fences (device slots).
"""
from .attach import ATTACH_VERSION, PROTOCOL, accept_channel
from .consumer import ChannelConsumer, ChannelMessage
from .producer import ChannelProducer, ChannelSlot
from typing import Any
from .._renamed import renamed_attribute

__all__ = ["ATTACH_VERSION", "PROTOCOL", "accept_channel", "ChannelConsumer", "ChannelMessage", "ChannelProducer", "ChannelSlot"]


def __getattr__(name: str) -> Any:
    # The old names of these (_renamed.py): each use warns, for one release.
    return renamed_attribute(__name__, {"ChannelMessage": ChannelMessage, "ChannelSlot": ChannelSlot}, name)
