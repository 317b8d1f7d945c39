// Public surface of the link layer.
export { Link, type LinkEvents, type LinkState, type PeerCredentials, type ReceiveOptions, type RemoteEndpoint, type LinkTransportKind } from './connection/link.js';
export { type LinkOptions, type LinkLimits } from './connection/link-options.js';
export { type InboxCounts } from './connection/inbox.js';
export { setMaxReceivedBytes, receivedMemory, type ReceivedMemoryCounts } from './transport/received-memory.js';
export { type SendQueueCounts } from './connection/outbox.js';
export { announceGone, registerGoneHandler, type GoneHandler } from './lifetimes/gone.js';
export { spawn, parentLink, type SpawnOptions, type SpawnedChild } from './connect/spawn.js';
export { setLinkWorkingDevice, linkWorkingDevice } from './connection/working-device.js';
export { spawnPython, pythonPackageDirectory, type SpawnPythonOptions } from './connect/spawn-python.js';
export { listen, connect, Listener, type ListenerEvents, type ListenOptions, type ConnectOptions } from './connect/listener.js';
export { TcpListener, type TcpListenOptions, type TcpListenerEvents } from './connect/tcp-listener.js';
export { type TcpConnectOptions, type TcpLinkOptions, type TlsLinkOptions } from './connect/tcp-connect.js';
export { type LinkUrl } from './transport/link-url.js';
export { type RefusedReport } from './connect/refusal-report.js';
export { socketPath } from './transport/socket-path.js';
export { Fanout } from './nccl/fanout.js';
export { preloadNccl } from './nccl/nccl-comms.js';
export { defaultSocketDirectory } from '../runtime-directory.js';
export {
  registerTransferHandler,
  unregisterTransferHandler,
  type TransferHandler,
  type TransferEncoding,
} from './transfers/transfer.js';
export { leaseStats, type LeaseHold, type ReceivedLease, type LeaseCounts, type LeaseStats, type LinkLeaseStats } from './lifetimes/lease.js';

// Host buffers, device buffers, pools and events travel over every link once the link layer is
// loaded: the handlers register here, so no receiving process can miss one.
import './transfers/host-transfer.js';
import './transfers/host-bytes-transfer.js';
import './transfers/device-transfers.js';
import './transfers/nccl-buffer-transfer.js';
