"""cuda_ipc: the Python companion of the cuda-ipc Node.js package.

A Python process joins a cuda-ipc link (``parent_link()`` when Node started it with ``spawnPython``,
``connect(name)`` to a Node ``listen(name)``) and exchanges messages, host buffers and GPU memory
with Node without copies; ``listen('tcp://...')`` / ``connect('tcp://...', token=...)`` link
processes on different machines (messages and copies of host buffers):

* received device buffers expose ``__cuda_array_interface__`` and DLPack, so ``torch.as_tensor``,
  ``cupy.asarray`` and ``numba.cuda.as_cuda_array`` view them; received host buffers expose a
  memoryview. Closing one (or dropping the last reference) releases it to the sender.
* channels: ``accept_channel(link)`` makes this process a producer or consumer of a channel a Node
  process created (host or device slots), with the same ordering, wake-up and crash rules.
* CUDA tensors and arrays (PyTorch, CuPy, anything with ``__cuda_array_interface__``, cuda.core
  buffers) put in a message are shared zero-copy and kept alive until the peer releases them.

* NCCL: ``load_nccl()`` and ``NcclCommunicator`` (cuda_ipc.nccl) move device bytes between processes
  and machines, the same layer as Node's, with libnccl.so.2 found at run time. On a TCP link, CUDA
  tensors and ``share_tensors`` sets put in a message move over NCCL (the link sets up the
  communicators): received into memory of the receiver's own, or straight into its parameters by
  ``update_in_place`` (a ``RemoteTensorSet``); ``Fanout`` sends one message to many links, its device
  bytes broadcast once.

The core uses only the standard library (ctypes for libcuda); the wire protocol is documented in
docs/PROTOCOL.md of the cuda-ipc repository.
"""
from .errors import CudaError, IpcError
from .link import TransferEncoding, TransferHandler, register_transfer_handler, unregister_transfer_handler
from .link import Link, LeaseCounts, PeerCredentials, connect, default_socket_directory, parent_link, socket_path
from .host.host_buffer import HostBuffer
from .arrays.device_array import DeviceBuffer, DeviceArray
from .ipc.pool import ImportedPool
from .ipc.event import IpcEvent
from .ipc.cache import configure_import_cache, legacy_cache_stats
from .arrays.exports import share
from .ipc.descriptor import (
    LegacyHandleDescriptor, IpcEventDescriptor, decode_descriptor, encode_descriptor, parse_descriptor_json,
    descriptor_to_json,
)
from .cuda.device import Device, set_working_device, working_device
from .ipc.torch_handle import descriptor_from_torch, torch_storage_args
from .channel import ChannelConsumer, ChannelProducer, ChannelMessage, ChannelSlot, accept_channel
# [tensors] named tensors over links, in-place updates (issue 21)
from .arrays.host_array import HostArray
from .tensors.tensor_set_transfer import SharedTensors, TensorMap, share_tensors
from .tensors.update import UpdateResult, update_in_place
from .tensors.nccl_transfer import RemoteTensorSet  # tensor sets over TCP links (NCCL)
from .link.nccl.fanout import Fanout
from .link import Listener, RemoteAddress, TcpListener, listen
from .link.transport.received_memory import ReceivedMemory, received_memory, set_max_received_bytes
from .nccl import NcclCommunicator, NcclError, NcclLibrary, NcclUnavailableError, load_nccl
from .native.addon import NativeHelper, native_helper
from .tensors.torch_pool import ipc_mem_pool, pool_stats as ipc_mem_pool_stats
# [tensors] sharded weights, the planning half (issue 37): layouts, their record, the plan
from .tensors.sharded import LayoutBuilder, LayoutError, decode_layout, encode_layout, layout_fingerprint, plan_sharded, tensor_parallel_parameter
from .tensors.sharded import ShardGroup, ShardError  # the sync group (issue 37)
from typing import Any
from ._renamed import renamed_attribute

__all__ = [
    "CudaError", "IpcError", "Link", "LeaseCounts", "PeerCredentials", "parent_link", "connect", "socket_path",
    "default_socket_directory", "HostBuffer", "DeviceBuffer", "DeviceArray", "ImportedPool", "IpcEvent", "share",
    "Device", "LegacyHandleDescriptor", "IpcEventDescriptor", "encode_descriptor", "decode_descriptor",
    "descriptor_to_json", "parse_descriptor_json", "descriptor_from_torch", "torch_storage_args",
    "TransferHandler", "TransferEncoding", "register_transfer_handler", "unregister_transfer_handler",
    "accept_channel", "ChannelConsumer", "ChannelProducer", "ChannelMessage", "ChannelSlot", "working_device", "set_working_device",
    "configure_import_cache", "legacy_cache_stats",
    "HostArray", "SharedTensors", "TensorMap", "share_tensors", "UpdateResult", "update_in_place", "Listener", "listen",
    "NcclCommunicator", "NcclError", "NcclLibrary", "NcclUnavailableError", "load_nccl",
    "NativeHelper", "native_helper", "ipc_mem_pool", "ipc_mem_pool_stats", "TcpListener", "RemoteAddress", "RemoteTensorSet", "Fanout",
    "ReceivedMemory", "received_memory", "set_max_received_bytes",
    "LayoutBuilder", "LayoutError", "decode_layout", "encode_layout", "layout_fingerprint", "plan_sharded", "tensor_parallel_parameter",
    "ShardGroup", "ShardError",
]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    # The old names of these (_renamed.py): each use warns, for one release.
    return renamed_attribute(__name__, {"DeviceArray": DeviceArray, "ChannelMessage": ChannelMessage, "ChannelSlot": ChannelSlot, "TensorMap": TensorMap, "parse_descriptor_json": parse_descriptor_json}, name)
