// The transfer-handler registry: how objects that own OS or GPU resources (HostBuffer now; device
// buffers, IPC pools and events later) travel inside link messages. A handler turns a value into
// bytes plus fds on the sending side and rebuilds it on the receiving side.
import { IpcError } from '../errors.js';
import type { Link } from './link.js';
import type { LeaseHold, ReceivedLease } from './lease.js';

/** What encode() returns for one value. */
export interface TransferEncoding {
  /** Bytes for decode(); copied into the frame during send(), so a scratch buffer is fine. */
  readonly data: Uint8Array;
  /**
   * fds to pass with the message, in order, all in the message's one sendmsg. Borrowed: the link
   * reads them during send() only (it dups them if the message has to wait for socket space) and
   * never closes them, unless `closeFdsAfterSend` is set.
   */
  readonly fds?: readonly number[];
  /** The link owns `fds` and closes them once sent or once the send failed. */
  readonly closeFdsAfterSend?: boolean;
  /**
   * Called once the message is committed to the link (sent, or queued behind earlier messages),
   * never if the send failed (e.g. a later value in the same message could not be encoded).
   * Record per-link state here ("this pool's fd has been sent on this link"), not in encode().
   */
  readonly onCommit?: () => void;
  /**
   * The sender-side resource this value keeps alive while the peer uses it (e.g. a reference on
   * the memory). Once the message is committed, the link leases it to the peer and runs
   * `release()` exactly once: when the peer releases the value (its ReceivedLease.end()), or when
   * the link closes for any reason, the peer's death included. If the send fails instead, the
   * link runs `release()` at once. `bytes` counts towards link.leases and leaseStats().
   */
  readonly hold?: LeaseHold;
}

/**
 * How values of a kind of your own travel over links (registerTransferHandler): which objects it
 * sends, how it encodes them (bytes and fds) and decodes them.
 */
export interface TransferHandler<T extends object = object> {
  /** Wire name, e.g. 'host-buffer'; 1..64 ASCII characters, not starting with '@' (built-ins). */
  readonly kind: string;
  /**
   * True for values this handler sends. Asked only about objects that are not plain objects,
   * arrays or typed arrays (class instances), in registration order; the first yes wins.
   */
  canTransfer(value: unknown): value is T;
  /** Serializes `value` for `link`; may throw (an IpcError) to refuse, failing the send. */
  encode(value: T, link: Link): TransferEncoding;
  /**
   * Rebuilds the value on the receiving side. `data` points into the link's receive buffer and is
   * valid only during the call: copy what you keep. On return the handler owns `fds`. If it
   * throws, the link closes every fd still in `fds`: a handler that already took ownership of
   * (or closed) some fd before throwing sets that entry to -1.
   * Values with close() or [Symbol.dispose]() are disposed by the link if the message can't be
   * delivered (decode of a later value failed, or the link closed with the message unread).
   *
   * `lease` is set when the sender leased the value (its encode() returned a hold). The decoded
   * value must call `lease.end()` once it is finally released (closed, freed), which lets the
   * sender release its resource; disposal by the link counts. If decode() throws, the link ends
   * the lease itself.
   */
  decode(data: Uint8Array, fds: number[], link: Link, lease: ReceivedLease | undefined): unknown;
}

const byKind = new Map<string, TransferHandler>();
let handlers: TransferHandler[] = [];

const KIND_RE = /^[\x21-\x7e]{1,64}$/;

/** Registers a handler for every link in this process (the receiving process needs it too). */
export function registerTransferHandler<T extends object>(handler: TransferHandler<T>): void {
  const kind = handler?.kind;
  if (typeof kind !== 'string' || !KIND_RE.test(kind) || kind.startsWith('@')) {
    throw new IpcError('ERR_INVALID_ARG', `transfer handler kind ${JSON.stringify(kind)} must be 1..64 printable ASCII characters not starting with '@'`);
  }
  if (byKind.has(kind)) {
    throw new IpcError('ERR_INVALID_ARG', `a transfer handler for '${kind}' is already registered; unregister it first to replace it`);
  }
  byKind.set(kind, handler as TransferHandler);
  handlers = [...handlers, handler as TransferHandler];
}

/** Removes the handler for `kind`; returns whether there was one. */
export function unregisterTransferHandler(kind: string): boolean {
  const h = byKind.get(kind);
  if (!h) return false;
  byKind.delete(kind);
  handlers = handlers.filter((x) => x !== h);
  return true;
}

/** The handler that sends `value`, if any. */
export function handlerForValue(value: object): TransferHandler | undefined {
  for (const h of handlers) if (h.canTransfer(value)) return h;
  return undefined;
}

export function handlerForKind(kind: string): TransferHandler | undefined {
  return byKind.get(kind);
}
