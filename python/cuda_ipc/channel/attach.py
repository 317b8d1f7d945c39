"""The peer's side of the attach protocol (src/channel/attach.ts, create.ts): how a Node hub hands a
channel to this process over a link. Three link messages, all dicts with the key PROTOCOL naming
the step:

  hub  -> peer  {PROTOCOL: 'attach', version: 4, index, role, control, slots, doorbells}
  peer -> hub   {PROTOCOL: 'ready', index}     (or 'refused', message)
  hub  -> peer  {PROTOCOL: 'active', index}

``accept_channel(link)`` receives the channel, checks it, and returns this process's end.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, NoReturn, overload

from ..errors import IpcError
from ..host.host_buffer import HostBuffer
from ..link.messages.message_decoder import dispose_values
from ..arrays.device_array import DeviceBuffer
from .block import Block
from .consumer import ChannelConsumer
from .doorbells import Doorbells
from .endpoint import Endpoint
from .layout import ROLE_CONSUMER, ROLE_PRODUCER, ST_RECOVERING, read_header, read_participant
from .producer import ChannelProducer
from .waiter import WaitPolicy

if TYPE_CHECKING:
    from ..link.connection.link import Link

PROTOCOL = "@cuda-ipc/channel"
ATTACH_VERSION = 4


@overload
def accept_channel(link: Link, role: Literal["producer"], memory: str | None = None, *, timeout: float | None = 60.0,
                   wait: str = "adaptive", spin_us: float | None = None) -> ChannelProducer: ...
@overload
def accept_channel(link: Link, role: Literal["consumer"], memory: str | None = None, *, timeout: float | None = 60.0,
                   wait: str = "adaptive", spin_us: float | None = None) -> ChannelConsumer: ...
@overload
def accept_channel(link: Link, role: str | None = None, memory: str | None = None, *, timeout: float | None = 60.0,
                   wait: str = "adaptive", spin_us: float | None = None) -> ChannelProducer | ChannelConsumer: ...


def accept_channel(link: Link, role: str | None = None, memory: str | None = None, *, timeout: float | None = 60.0,
                   wait: str = "adaptive", spin_us: float | None = None) -> ChannelProducer | ChannelConsumer:
    """The peer's side of a Node ``hub.attach(link, { role })`` / ``createChannel(link, ...)``: receives
    the channel over ``link`` (the next message on it must be the channel), checks it, and returns
    this process's end: a ``ChannelProducer`` or ``ChannelConsumer`` in the role the hub gave it
    (refused unless it is ``role``, when given; ``memory`` 'host' or 'device' likewise).

    ``wait``: 'adaptive' (default: spin up to ``spin_us``, default 10, while recent waits ended that
    fast, then sleep), 'sleep' (never spin) or 'spin' (always spin ``spin_us``, default 50, first).
    Keep the link open while using the channel: its closing is how each side learns the other died.
    """
    policy = WaitPolicy(wait, spin_us)
    if role not in (None, "producer", "consumer"):
        raise IpcError("ERR_INVALID_ARG", f"accept_channel: role must be 'producer' or 'consumer'; got {role!r}")
    if memory not in (None, "host", "device"):
        raise IpcError("ERR_INVALID_ARG", f"accept_channel: memory must be 'host' or 'device'; got {memory!r}")
    msg = link.receive(timeout=timeout)
    if not isinstance(msg, dict) or msg.get(PROTOCOL) != "attach":
        dispose_values(_values_of(msg))
        raise IpcError("ERR_FRAME_INVALID", "accept_channel: the first message on the link was not a channel (the other side must call attach or createChannel)")
    owned = [msg.get("control"), msg.get("slots"), msg.get("doorbells")]

    def refuse(error: IpcError) -> NoReturn:
        try:
            link.send({PROTOCOL: "refused", "message": str(error)})
        except IpcError:
            pass
        dispose_values(owned)
        raise error

    def bad(what: str) -> IpcError:
        return IpcError("ERR_DESCRIPTOR_INVALID", f"accept_channel: {what}")

    if msg.get("version") != ATTACH_VERSION:
        refuse(IpcError("ERR_DESCRIPTOR_VERSION", f"accept_channel: channel protocol version {msg.get('version')!r}; this side speaks {ATTACH_VERSION}: use the same cuda-ipc version on both sides"))
    control = msg.get("control")
    if not isinstance(control, HostBuffer) or control.offset != 0:
        refuse(bad("the control block is not shared memory (a whole memfd)"))
    try:
        layout = read_header(control.memory, control.nbytes)
    except IpcError as e:
        refuse(e)
    their_role = msg.get("role")
    k = msg.get("index")
    if their_role not in ("producer", "consumer") or type(k) is not int or not 1 <= k < layout.max_participants:
        refuse(bad(f"bad role or index ({their_role!r}, {k!r})"))
    if role is not None and role != their_role:
        refuse(IpcError("ERR_INVALID_ARG", f"accept_channel: the hub attached this process as a {their_role}, not a {role} as asked"))
    kind = "device" if layout.device else "host"
    if memory is not None and memory != kind:
        refuse(IpcError("ERR_INVALID_ARG", f"accept_channel: the channel's slots are {kind} memory, not {memory} as asked"))
    slots = msg.get("slots")
    if layout.device:
        if not isinstance(slots, DeviceBuffer):
            refuse(bad(f"{kind} slots expected"))
    elif not isinstance(slots, HostBuffer):
        refuse(bad(f"{kind} slots expected"))
    total = layout.slot_count * layout.slot_bytes
    if slots.nbytes < total:
        refuse(bad(f"the slots hold {slots.nbytes} bytes, fewer than {layout.slot_count} x {layout.slot_bytes}"))
    bells = msg.get("doorbells")
    if not isinstance(bells, Doorbells) or len(bells.fds) != layout.max_participants:
        refuse(bad(f"expected {layout.max_participants} doorbells"))
    state, prole = read_participant(control.memory, layout, k)
    if state != ST_RECOVERING or prole != (ROLE_PRODUCER if their_role == "producer" else ROLE_CONSUMER):
        refuse(bad("the participant entry the hub named is not waiting for this peer"))
    device = None
    if isinstance(slots, DeviceBuffer):  # (layout.device)
        try:
            slots.ptr  # map the slots now: a failure is a refusal, not a surprise later
            device = slots.device
        except (IpcError, Exception) as e:  # noqa: BLE001 - CudaError included
            refuse(IpcError(getattr(e, "code", "ERR_DESCRIPTOR_INVALID") if isinstance(e, IpcError) else "ERR_DESCRIPTOR_INVALID",
                            f"accept_channel: the device slots could not be mapped: {e}"))
    try:
        block = Block(layout, control, slots, bells, device)
    except Exception as e:  # noqa: BLE001
        refuse(IpcError(getattr(e, "code", "ERR_UNSUPPORTED") if isinstance(e, IpcError) else "ERR_UNSUPPORTED",
                        f"accept_channel: could not map the channel: {e}"))
    try:
        link.send({PROTOCOL: "ready", "index": k})
        active = link.receive(timeout=timeout)
        if not isinstance(active, dict) or active.get(PROTOCOL) != "active":
            dispose_values(_values_of(active))
            raise IpcError("ERR_FRAME_INVALID", "accept_channel: the hub did not confirm the attach")
        end = Endpoint(block, k, their_role, link, policy)
        return ChannelProducer(end) if their_role == "producer" else ChannelConsumer(end)
    except BaseException:
        block.close()  # the hub repairs the entry once the link closes
        raise


def _values_of(msg: Any) -> list[Any]:
    if isinstance(msg, dict):
        return list(msg.values())
    return [msg] if msg is not None else []
