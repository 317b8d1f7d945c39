"""Device memory sent on a TCP link (docs/PROTOCOL.md 8.2, 'nccl-buffer'; src/link/transfers/nccl-buffer-transfer.ts):
a torch CUDA tensor, a CUDA array (``__cuda_array_interface__``, C-contiguous), a cuda.core buffer or a
received DeviceBuffer / DeviceArray. The record says how many bytes (and an array's dtype and shape),
the bytes follow over the link's NCCL communicator for the memory's device, one ncclSend / ncclRecv
(or ncclBroadcast from a Fanout).

Sending: ``link.send({"w": tensor})`` returns once the record went out; NCCL reads the tensor after the
work already queued on its producing stream (an event; a CUDA array without a stream: the device is
synchronized first, as share() does; ``share(t, sync=False)``: neither). The tensor is kept until the
receiver has the bytes (its RELEASE) and NCCL is done reading it. Do not change it meanwhile.

Receiving: memory of this process's own on the receiving device (nccl_comms.receiving_device): a torch
tensor when torch is importable (uint8 for a plain buffer), else a DeviceBuffer of kind 'owned' (an
DeviceArray over it for an array). receive() returns the message once the bytes are there; the lease
ends then. On a Unix link the same values are shared instead (device_transfers.py).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from ...cuda import driver as drv
from ...ipc.descriptor import DTYPES
from ...cuda.device import Device, uuid_bytes
from ...errors import IpcError
from ...arrays.buffer_array import torch_module
from ...arrays.device_array import DeviceArray, DeviceBuffer
from ...arrays.exports import Shared, _describe_array, _is_device_array
from ...arrays.owned import allocate_device_buffer, hold, unhold
from ...nccl import NcclCommunicator
from ..messages.nccl_records import NCCL_BUFFER_KIND, decode_nccl_buffer, encode_nccl_buffer
from ...cuda.stream import Event, after_producer, producer_stream
from ..messages.deferred import Completion, DeferredValue
from ..messages.handlers import TransferEncoding, TransferHandler, register_transfer_handler
from ..messages.nccl_abort import ABORT_CANNOT_TAKE
from ..nccl.nccl_comms import LinkComm, check_peer, incoming_comm
from ..nccl.nccl_outgoing import OutgoingTransfer, begin_outgoing

if TYPE_CHECKING:
    from ..lifetimes.lease import ReceivedLease
    from ..connection.link import Link


class Source(NamedTuple):
    """Device memory to send: where, how much, on which device, what it holds, and how to let go of it."""

    ptr: int
    nbytes: int
    device: Device
    #: (dtype, shape) when it is an array, else None (a plain buffer)
    array: tuple[str, tuple[int, ...]] | None
    #: What to keep alive until NCCL and the peer are done with it.
    keep: Any
    #: Runs once the memory is free to go (a received buffer's hold ends).
    let_go: Callable[[], None]
    #: The producer's stream to wait for, None: no ordering needed (or done already).
    after: int | None
    #: Synchronize the device before sending (a producer this side does not know).
    sync_device: bool


def _nothing() -> None:
    pass



def describe_source(value: Any, what: str = "link.send") -> Source:
    """What sending ``value`` over NCCL takes (ERR_NOT_TRANSFERABLE for strided or empty memory)."""
    sync = True
    if isinstance(value, Shared):
        sync, value = value.sync, value.obj
    if isinstance(value, (DeviceBuffer, DeviceArray)):
        buf = value.buffer if isinstance(value, DeviceArray) else value
        if buf.closed:
            raise IpcError("ERR_CLOSED", f"{what}: the DeviceBuffer is closed; send it before closing it")
        array = None
        if isinstance(value, DeviceArray):
            if not value.meta.c_contiguous:
                raise IpcError("ERR_NOT_TRANSFERABLE", f"{what}: a strided array cannot cross a TCP link (its bytes go as one NCCL "
                               "transfer); send a C-contiguous copy")
            array = (value.meta.dtype, value.meta.shape)
            nbytes = value.meta.extent
        else:
            nbytes = value.nbytes
        if nbytes == 0:
            raise IpcError("ERR_NOT_TRANSFERABLE", f"{what}: an empty buffer has no bytes to send; send its shape as data instead")
        o = buf._origin
        ptr = value.ptr
        o.retain()  # kept (a received buffer: the sender's lease too) until NCCL and the peer are done
        return Source(ptr, nbytes, buf.device, array, value, lambda: o.release(False), None, False)
    e = _describe_array(value, sync)
    if not e.ptr or not e.extent:
        raise IpcError("ERR_NOT_TRANSFERABLE", f"{what}: an empty tensor/array has no bytes to send; send its shape as data instead")
    contiguous = e.meta.c_contiguous if e.meta is not None else (value.is_contiguous() if hasattr(value, "is_contiguous") else
                                                                 (value.__cuda_array_interface__.get("strides") is None
                                                                  if hasattr(value, "__cuda_array_interface__") else True))
    if not contiguous:
        raise IpcError("ERR_NOT_TRANSFERABLE", f"{what}: a strided tensor/array cannot cross a TCP link (its bytes go as one NCCL "
                       "transfer); send a contiguous copy (tensor.contiguous())")
    ordinal = e.ordinal
    if ordinal is None:
        with Device.get(0).activate():  # pointer queries need some context current (unified addressing answers for every device)
            ordinal = drv.ptr_attribute_int(drv.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, e.ptr)
    device = Device.get(ordinal)
    array = (e.meta.dtype, e.meta.shape) if e.meta is not None else None
    after = producer_stream(value, ordinal) if e.sync is not None else None
    return Source(e.ptr, e.extent, device, array, e.keep, _nothing, after, e.sync is not None and after is None)


class _NcclBufferTransfer(TransferHandler[Any]):
    kind = NCCL_BUFFER_KIND
    transports = frozenset({"tcp"})

    def can_transfer(self, value: object) -> bool:
        return _is_device_array(value)

    def encode(self, value: Any, link: Link) -> TransferEncoding:
        check_peer(link, "device memory")
        src = describe_source(value)
        try:
            out = begin_outgoing(link, src.device)
        except BaseException:
            src.let_go()
            raise
        try:
            array = src.array if src.array is not None and src.array[0] in DTYPES else None
            data = encode_nccl_buffer(out.reference, out.sequence, src.nbytes, uuid_bytes(src.device.uuid), array)
            ready = after_producer(src.device, src.after) if src.after is not None or src.sync_device else None
        except BaseException:
            out.abandoned()
            src.let_go()
            raise
        return _sending(out, src, data, ready)

    def decode(self, data: memoryview, fds: list[int], link: Link, lease: ReceivedLease | None) -> Any:
        if fds:
            raise IpcError("ERR_DESCRIPTOR_INVALID", "received an nccl-buffer record with fds")
        r = decode_nccl_buffer(data)
        comm = incoming_comm(link, r.comm, r.sequence)
        try:
            value, ptr, ready_to_write, done_writing = _allocate(r.nbytes, r.array, comm.device)
        except Exception as e:
            error = IpcError("ERR_NCCL", f"could not allocate {r.nbytes} bytes on device {comm.device.ordinal} to receive a buffer over "
                             f"NCCL: {e}")
            comm.abort(error, ABORT_CANNOT_TAKE)
            raise error from e
        ready = Completion()
        n = r.nbytes

        def start(lc: LinkComm, c: NcclCommunicator) -> None:
            if ready_to_write is not None:
                lc.stream.wait(ready_to_write)
                ready_to_write.close()
            if lc.broadcast:
                c.broadcast(ptr, n, 0, stream=lc.stream.handle)
            else:
                c.recv(ptr, n, 0, stream=lc.stream.handle)

        def settle(error: IpcError | None) -> None:
            done_writing()
            if lease is not None:
                lease.end()  # the sender's memory is free: the bytes are here, or will never come
            ready.settle(error)
        comm.submit(r.sequence, start, settle)
        return DeferredValue(value, ready)


def _sending(out: OutgoingTransfer, src: Source, data: bytes, ready: Event | None) -> TransferEncoding:
    """The encoding of one send: the memory kept until the peer has it and NCCL is done reading it."""
    ptr, nbytes = src.ptr, src.nbytes

    def start(lc: LinkComm, c: NcclCommunicator) -> None:
        if ready is not None:
            lc.stream.wait(ready)
            ready.close()
        if lc.broadcast:
            c.broadcast(ptr, nbytes, 0, stream=lc.stream.handle)
        else:
            c.send(ptr, nbytes, 1, stream=lc.stream.handle)
    return out.encoding(data, nbytes, NCCL_BUFFER_KIND, start, [] if ready is None else [ready], src.keep, src.let_go)


def _allocate(nbytes: int, array: tuple[str, tuple[int, ...]] | None, device: Device) -> tuple[Any, int, Event | None, Callable[[], None]]:
    """Memory of this process's own for a received buffer: (the value, its address, an event the
    receive must wait for, what ends the transfer's hold on it)."""
    torch = torch_module()  # torch when importable, asked once
    if torch is not None:
        dtype = getattr(torch, array[0], None) if array is not None else torch.uint8
        if dtype is not None:
            t = torch.empty(array[1] if array is not None else (nbytes,), dtype=dtype, device=f"cuda:{device.ordinal}")
            # The caching allocator may hand out a block that work queued on this thread's current
            # stream still uses: the receive waits for that stream.
            ev = after_producer(device, producer_stream(t, device.ordinal))
            keep = [t]
            return t, int(t.data_ptr()), ev, keep.clear
    buf = allocate_device_buffer(nbytes, device)
    hold(buf)  # the receive keeps the memory, whoever closes the value meanwhile
    value: Any = buf.view(array[0], array[1]) if array is not None else buf
    return value, buf.ptr, None, lambda: unhold(buf)


register_transfer_handler(_NcclBufferTransfer())
