// The per-process bound on memory held for received messages that no one has consumed yet, across
// every link of the process (issue 40): each link's inbox bounds its own backlog (LinkOptions.inbox),
// but an authenticated peer with many links could still make this process hold their sum. Inboxes
// count the messages they hold here, and a TCP link reserves a large message here before it
// buffers it; past the bound, every link whose application is not waiting for a message stops
// reading (the kernel, then the peers' senders, hold the backlog: their send() returns false) until
// consumers bring the total back under it. Nothing is dropped or refused for it.
//
// What can pass the bound: the one message that crossed it, and on a link whose application is
// waiting for a message (a pending receive() or a 'message' listener), that message (it goes
// straight to the application). So the memory held for unconsumed messages stays within
// maxReceivedBytes + one message (at most the largest maxMessageBytes of the links).
import { checkInteger } from '../../arg-errors.js';

/** Default per-process bound (1 GiB): four default inbox bounds. */
export const DEFAULT_MAX_RECEIVED_BYTES = 2 ** 30;

/** What a link registers to hear that the bound was reached (pause) or has room again (resume). */
export interface ReceivedMemoryListener {
  boundReached(): void;
  roomAgain(): void;
}

/** Where the process stands against its bound (receivedMemory()). */
export interface ReceivedMemoryCounts {
  /** Bytes of received messages not consumed yet, and of large TCP messages being assembled. */
  held: number;
  /** The bound (setMaxReceivedBytes(), CUDA_IPC_MAX_RECEIVED_BYTES, default 1 GiB). */
  limit: number;
  /** The most `held` has been since the process started (or resetPeak()). */
  peak: number;
}

function limitFromEnvironment(): number {
  const text = process.env.CUDA_IPC_MAX_RECEIVED_BYTES;
  if (text === undefined || text === '') return DEFAULT_MAX_RECEIVED_BYTES;
  const n = Number(text);
  if (Number.isSafeInteger(n) && n >= 1) return n;
  process.emitWarning(`CUDA_IPC_MAX_RECEIVED_BYTES=${JSON.stringify(text)} is not a positive integer; the default (${DEFAULT_MAX_RECEIVED_BYTES}) holds`, { code: 'CUDA_IPC_ENV' });
  return DEFAULT_MAX_RECEIVED_BYTES;
}

let limit = limitFromEnvironment();
let held = 0;
let peak = 0;
let reached = false;
const listeners = new Set<ReceivedMemoryListener>();
/** Transports holding a large message back for want of room: asked again whenever bytes are released. */
const roomWaiters = new Set<() => void>();

function changed(): void {
  if (held > peak) peak = held;
  if (!reached && held >= limit) {
    reached = true;
    for (const l of [...listeners]) l.boundReached();
  } else if (reached && held < limit) {
    reached = false;
    for (const l of [...listeners]) l.roomAgain();
  }
}

/** Whether the bound is reached: links whose application is not waiting stop reading. */
export function boundReached(): boolean {
  return reached;
}

/** Counts `bytes` of a received message now held (it arrived: never refused here). */
export function holdReceived(bytes: number): void {
  if (bytes <= 0) return;
  held += bytes;
  changed();
}

/** `bytes` counted by holdReceived() or reserveReceived() are no longer held. */
export function releaseReceived(bytes: number): void {
  if (bytes <= 0) return;
  held = Math.max(0, held - bytes);
  changed();
  for (const retry of [...roomWaiters]) retry();
}

/** @internal `retry` runs whenever bytes are released, until stopWaitingForRoom(retry). */
export function waitForRoom(retry: () => void): void {
  roomWaiters.add(retry);
}

/** @internal */
export function stopWaitingForRoom(retry: () => void): void {
  roomWaiters.delete(retry);
}

/**
 * Reserves `bytes` for a message about to be buffered: true (counted) when they fit under the
 * bound, when nothing is held (one message always fits), or when `waited` (the application is
 * waiting for it); otherwise false, and the caller waits for roomAgain().
 */
export function reserveReceived(bytes: number, waited: boolean): boolean {
  if (!waited && held > 0 && held + bytes > limit) return false;
  holdReceived(bytes);
  return true;
}

/** @internal Registers a link's inbox or transport (until it closes). */
export function watchReceivedMemory(l: ReceivedMemoryListener): void {
  listeners.add(l);
}

/** @internal */
export function unwatchReceivedMemory(l: ReceivedMemoryListener): void {
  listeners.delete(l);
}

/**
 * Sets the per-process bound on memory held for received messages not yet consumed, across all
 * links (default 1 GiB, or CUDA_IPC_MAX_RECEIVED_BYTES): past it, links stop reading until the
 * application consumes what they hold (their peers' send() returns false). Lowering it below what
 * is held pauses them at once.
 * @throws RangeError ERR_OUT_OF_RANGE for anything but a positive safe integer.
 */
export function setMaxReceivedBytes(bytes: number): void {
  limit = checkInteger(bytes, 'bytes', 1, Number.MAX_SAFE_INTEGER);
  changed();
  for (const retry of [...roomWaiters]) retry();
}

/** This process against its bound on received messages not yet consumed (see setMaxReceivedBytes()). */
export function receivedMemory(): ReceivedMemoryCounts {
  return { held, limit, peak };
}

/** @internal For tests: the peak starts again from what is held now. */
export function resetReceivedPeak(): void {
  peak = held;
}
