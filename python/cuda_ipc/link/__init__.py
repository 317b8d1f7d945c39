"""Links (src/link): one connection between two processes over a Unix SOCK_SEQPACKET socket, carrying
structured messages with file descriptors, or between machines over TCP without them; the same
protocol as the Node side (docs/PROTOCOL.md).

The modules, by role: link (Link: state, handshake, reading, close), outbox (sending, releases),
inbox (messages read ahead of receive()), spawn (parent_link), listener (listen, connect by name),
endpoints (listen, connect by name or URL), tcp / tcp_auth / stream (TCP links: listeners and
dialing, the token exchange, frames on a byte stream), socket_path, frame (the wire format),
message_format / message_encoder / message_decoder (message payloads), handlers (the
transfer-handler registry), lease (what a sent value keeps alive until the peer releases it),
host_transfer, host_bytes and device_transfers (how host and device memory travel), nccl_abort (the
NCCL layer's abort frames), nccl_order / nccl_comms (the NCCL communicators of TCP links and the order
of their transfers), nccl_buffer (device memory over NCCL), fanout (one message to several TCP links,
its device memory broadcast once), deferred / arriving (values still arriving when their message is
read, and waiting for them while reading the link).
"""
# Their transfer handlers, registered for every link, host memory first (a value goes to the first
# handler that takes it).
from .transfers import host_transfer  # noqa: F401, I001
from .transfers import device_transfers  # noqa: F401
from .transfers import host_bytes_transfer as host_bytes  # noqa: F401
from .transfers import nccl_buffer_transfer as nccl_buffer  # noqa: F401  (device memory on TCP links, over NCCL)
from .messages.handlers import TransferEncoding, TransferHandler, register_transfer_handler, unregister_transfer_handler
from .connection.link import _CREATE, LeaseCounts, Link, PeerCredentials
from .connect.listener import Listener
from .connect.endpoints import connect, listen
from .messages.nccl_abort import NcclAbort, on_nccl_abort, peer_takes_nccl, send_nccl_abort
from .nccl.fanout import Fanout
from .connection.stream import RemoteAddress
from .connect.tcp import TcpListener
from .transport.tcp_auth import TOKEN_ENV
from .transport.socket_path import default_socket_directory, socket_path
from .connect.spawn import LINK_FD_ENV, parent_link

__all__ = [
    "Link", "LeaseCounts", "PeerCredentials", "parent_link", "connect", "listen", "Listener", "socket_path",
    "default_socket_directory", "LINK_FD_ENV", "TransferEncoding", "TransferHandler", "register_transfer_handler",
    "unregister_transfer_handler", "TcpListener", "RemoteAddress", "TOKEN_ENV", "NcclAbort", "on_nccl_abort", "send_nccl_abort",
    "peer_takes_nccl", "Fanout",
]
