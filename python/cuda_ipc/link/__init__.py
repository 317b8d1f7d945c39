"""Links (src/link): one connection between two processes over a Unix SOCK_SEQPACKET socket, carrying
structured messages with file descriptors, or between machines over TCP without them; the same
protocol as the Node side (docs/PROTOCOL.md).

The modules, by layer, in the folders of src/link/ (imports run down this list; import-graph.test.ts
checks it): connect/ (spawn: parent_link; listener: listen, connect by name; endpoints: by name or URL;
tcp: TCP listeners and dialing), transfers/ (how host and device memory travel: host_transfer,
host_bytes_transfer, device_transfers, nccl_buffer_transfer), nccl/ (nccl_comms, nccl_outgoing,
nccl_order: the NCCL communicators of TCP links and the order of their transfers; fanout: one message
to several TCP links, its device memory broadcast once), connection/ (link: the Link's state,
handshake, reading, close; stream: TCP links, frames on a byte stream; frame_dispatch, outbox, inbox,
arriving: waits that read the link meanwhile), messages/ (message_format, message_encoder,
message_decoder, handlers: the transfer-handler registry, deferred: values still arriving,
nccl_records, nccl_abort), lifetimes/ (lease: what a sent value keeps alive until the peer releases
it; gone: GONE notices), transport/ (frame: the wire format; large_message, tcp_auth, socket_file,
socket_path, fds).
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
from .transport.tcp_transport import RemoteAddress
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
