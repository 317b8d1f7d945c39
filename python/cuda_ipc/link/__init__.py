"""Links (src/link): one connection between two processes over a Unix SOCK_SEQPACKET socket, carrying
structured messages with file descriptors; the same protocol as the Node side (docs/PROTOCOL.md).

The modules, by role: link (Link: state, handshake, reading, close), outbox (sending, releases),
inbox (messages read ahead of receive()), spawn (parent_link), listener (listen, connect),
socket_path, frame (the wire format), message_format / message_encoder / message_decoder (message
payloads), handlers (the transfer-handler registry), lease (what a sent value keeps alive until
the peer releases it), host_transfer and device_transfers (how host and device memory travel).
"""
# Their transfer handlers, registered for every link, host memory first (a value goes to the first
# handler that takes it).
from . import host_transfer  # noqa: F401, I001
from . import device_transfers  # noqa: F401
from .handlers import TransferEncoding, TransferHandler, register_transfer_handler, unregister_transfer_handler
from .link import _CREATE, LeaseCounts, Link, PeerCredentials
from .listener import Listener, connect, listen
from .socket_path import default_socket_directory, socket_path
from .spawn import LINK_FD_ENV, parent_link

__all__ = [
    "Link", "LeaseCounts", "PeerCredentials", "parent_link", "connect", "listen", "Listener", "socket_path",
    "default_socket_directory", "LINK_FD_ENV", "TransferEncoding", "TransferHandler", "register_transfer_handler",
    "unregister_transfer_handler",
]
