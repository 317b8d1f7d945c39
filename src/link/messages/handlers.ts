// The transfer handlers registered in this process, as the message encoder and decoder look them
// up. The link a handler is given is opaque here (transfer.ts's public TransferHandler names it
// Link): this file sits below link.ts, and the encoder and decoder only pass the link on.
import { IpcError } from '../../errors.js';
import type { LeaseHold, ReceivedLease } from '../lifetimes/lease.js';
import { invalidArgValue } from '../../arg-errors.js';
import type { LinkTransportKind } from '../transport/frame-transport.js';

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
 * What decode() returns for a value that is not usable yet: its bytes still arriving (an NCCL
 * receive). The link delivers the message, in its place among the others, once `ready` resolved;
 * if it rejects, the message fails with that error and its values are disposed.
 */
export class DeferredValue {
  constructor(readonly value: unknown, readonly ready: Promise<void>) {}
}

/** A registered handler as the encoder and decoder call it (see TransferHandler in transfer.ts). */
export interface RegisteredHandler {
  readonly kind: string;
  /** The link transports it serves (default ['unix']). */
  readonly transports?: readonly LinkTransportKind[];
  /** What to send instead on a link whose transport it does not serve. */
  readonly transportHint?: string;
  canTransfer(value: unknown): boolean;
  encode(value: object, link: object): TransferEncoding;
  decode(data: Uint8Array, fds: number[], link: object, lease: ReceivedLease | undefined): unknown;
}

const byKind = new Map<string, RegisteredHandler>();
let handlers: RegisteredHandler[] = [];

const KIND_RE = /^[\x21-\x7e]{1,64}$/;
const TRANSPORTS: readonly LinkTransportKind[] = ['unix', 'tcp'];
const UNIX_ONLY: readonly LinkTransportKind[] = ['unix'];

export function addHandler(handler: RegisteredHandler): void {
  const kind = handler?.kind;
  if (typeof kind !== 'string' || !KIND_RE.test(kind) || kind.startsWith('@')) {
    throw invalidArgValue(`transfer handler kind ${JSON.stringify(kind)} must be 1..64 printable ASCII characters not starting with '@'`);
  }
  const t = handler.transports;
  if (t !== undefined && (!Array.isArray(t) || t.length === 0 || !t.every((x) => TRANSPORTS.includes(x)))) {
    throw invalidArgValue(`transfer handler '${kind}': transports must be a non-empty array of ${TRANSPORTS.map((x) => `'${x}'`).join(', ')}`);
  }
  if (byKind.has(kind)) {
    throw invalidArgValue(`a transfer handler for '${kind}' is already registered; unregister it first to replace it`);
  }
  byKind.set(kind, handler);
  handlers = [...handlers, handler];
}

export function removeHandler(kind: string): boolean {
  const h = byKind.get(kind);
  if (!h) return false;
  byKind.delete(kind);
  handlers = handlers.filter((x) => x !== h);
  return true;
}

/** Whether `h` serves links of `transport`. */
export function serves(h: RegisteredHandler, transport: LinkTransportKind): boolean {
  return (h.transports ?? UNIX_ONLY).includes(transport);
}

/**
 * The handler that sends `value` on a link of `transport` (default 'unix'): the first registered
 * one that takes the value and serves the transport (a HostBuffer: 'host-buffer' on Unix links,
 * 'host-bytes' on TCP links).
 */
export function handlerForValue(value: object, transport: LinkTransportKind = 'unix'): RegisteredHandler | undefined {
  for (const h of handlers) if (serves(h, transport) && h.canTransfer(value)) return h;
  return undefined;
}

/** The first handler that takes `value` on some transport (for the error where none serves the link's). */
export function handlerOnOtherTransport(value: object): RegisteredHandler | undefined {
  for (const h of handlers) if (h.canTransfer(value)) return h;
  return undefined;
}

export function handlerForKind(kind: string): RegisteredHandler | undefined {
  return byKind.get(kind);
}
