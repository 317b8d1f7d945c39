// Public surface of the link layer.
export { Link, type LinkEvents, type LinkState, type PeerCredentials, type ReceiveOptions, type RemoteEndpoint, type LinkTransportKind } from './link.js';
export { type LinkOptions, type LinkLimits } from './link-options.js';
export { type InboxCounts } from './inbox.js';
export { setMaxReceivedBytes, receivedMemory, type ReceivedMemoryCounts } from './received-memory.js';
export { type SendQueueCounts } from './outbox.js';
export { announceGone, registerGoneHandler, type GoneHandler } from './gone.js';
export { spawn, parentLink, type SpawnOptions, type SpawnedChild } from './spawn.js';
export { setLinkWorkingDevice, linkWorkingDevice } from './working-device.js';
export { spawnPython, pythonPackageDirectory, type SpawnPythonOptions } from './spawn-python.js';
export { listen, connect, Listener, type ListenerEvents, type ListenOptions, type ConnectOptions } from './listener.js';
export { TcpListener, type TcpListenOptions, type TcpListenerEvents } from './tcp-listener.js';
export { type TcpConnectOptions, type TcpLinkOptions, type TlsLinkOptions } from './tcp-connect.js';
export { type LinkUrl } from './link-url.js';
export { type RefusedReport } from './refusal-report.js';
export { socketPath } from './socket-path.js';
export { Fanout } from './fanout.js';
export { preloadNccl } from './nccl-comms.js';
export { defaultSocketDirectory } from '../runtime-directory.js';
export {
  registerTransferHandler,
  unregisterTransferHandler,
  type TransferHandler,
  type TransferEncoding,
} from './transfers/transfer.js';
export { leaseStats, type LeaseHold, type ReceivedLease, type LeaseCounts, type LeaseStats, type LinkLeaseStats } from './lease.js';

// Host buffers, device buffers, pools and events travel over every link once the link layer is
// loaded: the handlers register here, so no receiving process can miss one.
import './transfers/host-transfer.js';
import './transfers/host-bytes-transfer.js';
import './transfers/device-transfers.js';
import './transfers/nccl-buffer-transfer.js';
