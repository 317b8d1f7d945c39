// The transfer-handler API: how objects that own OS or GPU resources (HostBuffer, device buffers,
// IPC pools and events) travel inside link messages. A handler turns a value into bytes plus fds
// on the sending side and rebuilds it on the receiving side. The registry itself is handlers.ts,
// below link.ts; this file gives it the public types, which name the Link a handler works for.
import type { Link } from '../connection/link.js';
import type { ReceivedLease } from '../lifetimes/lease.js';
import { addHandler, removeHandler, type TransferEncoding } from '../messages/handlers.js';
import type { LinkTransportKind } from '../transport/frame-transport.js';

export type { TransferEncoding, LinkTransportKind };

/**
 * How values of a kind of your own travel over links (registerTransferHandler): which objects it
 * sends, how it encodes them (bytes and fds) and decodes them.
 */
export interface TransferHandler<T extends object = object> {
  /** Wire name, e.g. 'host-buffer'; 1..64 ASCII characters, not starting with '@' (built-ins). */
  readonly kind: string;
  /**
   * The link transports this handler serves (default `['unix']`): `'unix'` for links between
   * processes of one machine, where fds and CUDA IPC handles work; `'tcp'` for links between
   * machines (TCP or TLS), which carry bytes only (a handler for them returns no fds). Sending a
   * value on a link whose transport none of the handlers that take it serves throws
   * ERR_NOT_TRANSFERABLE; receiving a record of this kind on such a link fails that message. Two
   * handlers may take the same values on different transports (a HostBuffer travels as
   * 'host-buffer' on Unix links and as 'host-bytes', a copy, on TCP links).
   */
  readonly transports?: readonly LinkTransportKind[];
  /**
   * What to send instead where this handler does not serve the link's transport, for the message
   * of that ERR_NOT_TRANSFERABLE, e.g. "copy the bytes into a HostBuffer".
   */
  readonly transportHint?: string;
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
   * Values with `close()` or `[Symbol.dispose]()` are disposed by the link if the message can't be
   * delivered (decode of a later value failed, or the link closed with the message unread).
   *
   * `lease` is set when the sender leased the value (its encode() returned a hold). The decoded
   * value must call `lease.end()` once it is finally released (closed, freed), which lets the
   * sender release its resource; disposal by the link counts. If decode() throws, the link ends
   * the lease itself.
   */
  decode(data: Uint8Array, fds: number[], link: Link, lease: ReceivedLease | undefined): unknown;
}

/** Registers a handler for every link in this process (the receiving process needs it too). */
export function registerTransferHandler<T extends object>(handler: TransferHandler<T>): void {
  addHandler(handler);
}

/** Removes the handler for `kind`; returns whether there was one. */
export function unregisterTransferHandler(kind: string): boolean {
  return removeHandler(kind);
}
