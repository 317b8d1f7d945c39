// The types a Link's users and openers name: who the peer is, where the link is in its life, the
// events it emits, and how an opener configures it. Kept apart from link.ts so that the modules
// the Link is made of can name them without importing the Link itself.
import type { Socket } from 'node:net';
import type { IpcError } from '../../errors.js';
import type { WaitOptions } from '../../abort.js';
import type { LinkLimits } from './link-options.js';

/** Who is on the other end, as the kernel reports it. */
export interface PeerCredentials {
  readonly pid: number;
  readonly uid: number;
  readonly gid: number;
}

/**
 * Where the peer of a TCP link is (`link.remote`): its address as the connection sees it. A TCP
 * link knows no pid or uid of its peer, which may be on another machine.
 */
export interface RemoteEndpoint {
  /** The peer's IP address, e.g. '10.0.0.2' or '::1'. */
  readonly address: string;
  readonly port: number;
  readonly family: 'IPv4' | 'IPv6';
  /** The link runs inside TLS (a tls:// URL). */
  readonly tls: boolean;
}

/** Where a link is in its life: the handshake, open, or closed. */
export type LinkState = 'handshaking' | 'open' | 'closed';

/** Options of `link.receive()`: `signal` gives up when it aborts (AbortError, code ABORT_ERR); `timeout` after that many ms (ERR_TIMEOUT). */
export type ReceiveOptions = WaitOptions;

/** @internal A TCP link's connection, authenticated (tcp-connect.ts, tcp-listener.ts). */
export interface TcpSetup {
  /** The connected socket (net or tls), paused; the link owns it from the constructor call on. */
  socket: Socket;
  /** What the peer sent after its authentication proof: its first frames. */
  leftover: Buffer | undefined;
  remote: RemoteEndpoint;
}

/** @internal How the opener configures a link. */
export interface LinkSetup {
  /** The connected socket; the link owns it from the constructor call on, even if that throws (-1 with `tcp`). */
  fd: number;
  /** A TCP link: its connection instead of `fd` (peerFrom, verifyPeer and allowUids then play no part). */
  tcp?: TcpSetup;
  /**
   * Where the peer's credentials come from: 'socket' = SO_PEERCRED (accept/connect, and a child's
   * view of its parent); 'hello' = credentials the kernel attaches to the peer's HELLO (the
   * parent's end of a socketpair, where SO_PEERCRED would name the parent itself).
   */
  peerFrom: 'socket' | 'hello';
  /** Refuse a peer whose uid is neither ours nor in allowUids. */
  verifyPeer: boolean;
  allowUids: readonly number[];
  /** Send HELLO at once (otherwise after the peer's HELLO was accepted). */
  helloFirst: boolean;
  handshakeTimeoutMs?: number;
  /** For messages: who the peer is, e.g. "child process 1234". */
  peerName: string;
  /** Offer frame rings (unix-transport.ts); default FRAME_RING_DEFAULT: off unless CUDA_IPC_LINK_RING=1. */
  frameRing?: boolean;
  /** The bounds of linkLimits(options) (default DEFAULT_LINK_LIMITS). */
  limits?: LinkLimits;
}

/**
 * The events of a Link and the arguments their listeners get (`In`: the type of received
 * messages). There is no catch-all: a misspelt event name does not compile.
 */
export interface LinkEvents<In = unknown> {
  /** A message that no pending receive() took (see Link). */
  message: [value: In];
  /** A message that could not be decoded (e.g. no transfer handler for it here); the link stays open. */
  messageerror: [error: IpcError];
  /** The link closed with an error; emitted only when someone listens for it. */
  error: [error: IpcError];
  /** send() returned false earlier and the peer caught up: sending may go on (see send()). */
  drain: [];
  /** The link closed: `reason` is undefined for a clean close. */
  close: [reason: IpcError | undefined];
  /** EventEmitter's own: a listener is about to be added. */
  newListener: [event: string | symbol, listener: (...args: any[]) => void];
  /** EventEmitter's own: a listener was removed. */
  removeListener: [event: string | symbol, listener: (...args: any[]) => void];
}
