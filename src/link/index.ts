// Public surface of the link layer.
export { Link, type LinkState, type PeerCredentials, type ReceiveOptions } from './link.js';
export { spawn, parentLink, type SpawnOptions, type SpawnedChild } from './spawn.js';
export { listen, connect, Listener, type ListenOptions, type ConnectOptions } from './listener.js';
export { socketPath, defaultSocketDirectory } from './socket-path.js';
export {
  registerTransferHandler,
  unregisterTransferHandler,
  type TransferHandler,
  type TransferEncoding,
} from './transfer.js';
