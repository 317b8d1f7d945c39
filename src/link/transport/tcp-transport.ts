// A link's transport over TCP (PROTOCOL.md 1.1), optionally inside TLS: an authenticated node:net
// (or node:tls) socket presenting the native socket's face to the Link (frame-transport.ts).
//
// Receiving: the byte stream is cut back into frames. Each header is checked as soon as its 16
// bytes arrived, before any of its payload is buffered: no fds, no frame rings, no memfd
// payloads, control frames within 128 KiB, a message within maxMessageBytes (else REFUSE reason
// 3 goes back and the link closes with ERR_MESSAGE_TOO_LARGE). A frame that fits the receive
// buffer is assembled there (RecordSource.Socket); a larger message in a buffer of its own
// (RecordSource.Ring, read through ringBuffer / ringView). The link's own checks then run on the
// whole frame, as for a Unix socket. Reading pauses when the link says so (its inbox is full):
// the socket is paused, so the kernel and then the peer's sender hold the backlog. A larger message
// is first reserved against the process's bound on received memory (received-memory.ts): without
// room (and with no receive() or 'message' listener waiting on this link), reading pauses the same
// way until consumers on any link make room.
//
// Sending: a frame is copied (the caller reuses its buffers) and written to the socket, whole.
// Once the socket's write buffer is past its high-water mark send() returns false, having written
// nothing, and the link's outbox holds what follows until the socket drains ('writable').
//
// The end: the peer's FIN or a reset, after the frames that arrived whole, is the peer's end
// ('eof' / 'error': ERR_PEER_GONE unless a GOODBYE came first); a frame cut short is dropped,
// never delivered in part. close() half-closes (what was written still goes, then FIN) and reads
// and drops what the peer still sends until it closes too, at most LINGER_MS: a socket closed
// with unread bytes would reset the connection, and the peer could lose what it had not read yet.
import type { Socket } from 'node:net';
import { IpcError } from '../../errors.js';
import {
  ENCODING_MASK,
  FEATURE_NCCL,
  FRAME_MAGIC,
  FRAME_VERSION,
  FrameType,
  HEADER_BYTES,
  LARGE_PAYLOAD,
  MAX_FRAME_BYTES,
  RefuseReason,
  encodeRefuse,
  invalid,
} from './frame.js';
import type { FrameTransport, RingState } from './frame-transport.js';
import { RecordSource, type RecordHandler, type StateHandler } from './unix-transport.js';
import { checkMessageLength } from './large-message.js';
import { releaseReceived, reserveReceived, stopWaitingForRoom, waitForRoom } from './received-memory.js';

/** A large message's buffer is made whole up to this size as soon as its header checked out; past it, it grows as its bytes come. */
const LARGE_UPFRONT_BYTES = 64 * 2 ** 20;

/** How long a closed link's socket keeps reading (and dropping) what its peer still sends. */
const LINGER_MS = 2000;

const EMPTY = Buffer.alloc(0);

const NO_RINGS: RingState = Object.freeze({ sending: false, receiving: false });

/**
 * Checks the header at view[0, 16) of a frame arriving on a TCP link (PROTOCOL.md 1.1) and
 * returns its payload length; throws ERR_FRAME_INVALID, or ERR_MESSAGE_TOO_LARGE for a message
 * longer than `maxMessageBytes`. The rest (flags, lengths per type, payloads) is parseHeader()'s,
 * on the whole frame.
 */
export function checkStreamHeader(view: DataView, maxMessageBytes: number): number {
  const magic = view.getUint32(0, true);
  if (magic !== FRAME_MAGIC) throw invalid(`bad magic 0x${magic.toString(16)}`);
  const version = view.getUint8(4);
  if (version !== FRAME_VERSION) throw invalid(`protocol version ${version}, this build speaks ${FRAME_VERSION}`);
  if (view.getUint16(14, true) !== 0) throw invalid('reserved header bytes are not zero');
  const fds = view.getUint16(12, true);
  if (fds !== 0) throw invalid(`a header on a TCP link announces ${fds} fds; TCP links carry none`);
  const type = view.getUint8(5);
  const payloadLength = view.getUint32(8, true);
  if (type === FrameType.Ring || type === FrameType.RingStart) throw invalid(`a ${type === FrameType.Ring ? 'RING' : 'RING_START'} frame on a TCP link, which has no frame rings`);
  if (type < FrameType.Hello || type > FrameType.NcclAbort) throw invalid(`unknown frame type ${type}`);
  if (type === FrameType.Message) {
    const flags = view.getUint16(6, true);
    if ((flags & LARGE_PAYLOAD) !== 0) throw invalid('a message on a TCP link flagged as carried in a memfd');
    if ((flags & ~ENCODING_MASK) !== 0) throw invalid(`unknown message flags 0x${flags.toString(16)}`);
    checkMessageLength(payloadLength, maxMessageBytes);
  } else if (HEADER_BYTES + payloadLength > MAX_FRAME_BYTES) {
    throw invalid(`a control frame of ${HEADER_BYTES + payloadLength} bytes, more than ${MAX_FRAME_BYTES}`);
  }
  return payloadLength;
}

const closing = new WeakSet<Socket>();

/**
 * Closes `socket` without losing what was written to it: half-closes (what was written still
 * goes, then FIN), then reads and drops what the peer still sends until it closes too, at most
 * LINGER_MS. Closing a TCP socket with unread bytes resets the connection, and the peer could
 * then lose what it had received and not read yet (a GOODBYE, a refusal, a proof). Idempotent.
 */
export function closeGracefully(socket: Socket): void {
  if (closing.has(socket)) return;
  closing.add(socket);
  socket.on('error', () => {});
  if (socket.destroyed) return;
  if (!socket.listenerCount('data')) socket.on('data', () => {});
  const timer = setTimeout(() => socket.destroy(), LINGER_MS).unref();
  socket.once('close', () => clearTimeout(timer));
  socket.end();
  socket.resume();
  socket.unref();
}

/** An error the link's outbox reads as the peer having closed (as sendmsg's EPIPE). */
function closedError(): Error {
  return Object.assign(new Error('the TCP connection is closed'), { code: 'EPIPE' });
}

export class TcpTransport implements FrameTransport {
  readonly kind = 'tcp';
  readonly inlineLarge = true;
  /** TCP links take device memory over NCCL (PROTOCOL.md 8), never frame rings. */
  readonly features = FEATURE_NCCL;
  readonly ringState = NO_RINGS;
  readonly recvBuffer = new ArrayBuffer(MAX_FRAME_BYTES);
  readonly #recv = Buffer.from(this.recvBuffer);
  readonly #recvView = new DataView(this.recvBuffer);
  readonly #socket: Socket;
  readonly #maxMessageBytes: number;
  readonly #onRecord: RecordHandler;
  readonly #onState: StateHandler;
  readonly #fail: (error: IpcError) => void;
  #closed = false;
  // Receiving: chunks not yet cut into frames (the first from #at), and the frame being assembled.
  #chunks: Buffer[] = [];
  #at = 0;
  /** The frame being assembled: #recv, or a buffer of its own for a larger message. */
  #frame: Buffer;
  #frameView: DataView;
  /** Bytes of it that arrived, and its whole length once its header did (0 before). */
  #have = 0;
  #length = 0;
  #paused = false;
  /** Bytes of the large message being assembled, reserved against the process's bound. */
  #reserved = 0;
  /** A large message's header arrived and the process's bound has no room for it yet: reading waits. */
  #waitingRoom = false;
  readonly #consumerWaiting: () => boolean;
  readonly #room = (): void => this.consumerWaiting();
  #pumping = false;
  #resumeScheduled = false;
  /** The peer's end ('end' or 'error'), reported once the frames before it were delivered. */
  #ended: { what: 'eof' | 'error'; errno: number | undefined } | undefined;
  // Sending.
  #needDrain = false;
  #wantWritable = false;

  /**
   * Takes over `socket` (connected and authenticated, paused), whose first bytes after the
   * authentication are `leftover`. Records reach `onRecord` from the next tick on.
   */
  constructor(socket: Socket, leftover: Buffer | undefined, maxMessageBytes: number, onRecord: RecordHandler, onState: StateHandler, fail: (error: IpcError) => void,
    consumerWaiting: () => boolean = () => false) {
    this.#socket = socket;
    this.#consumerWaiting = consumerWaiting;
    this.#maxMessageBytes = maxMessageBytes;
    this.#onRecord = onRecord;
    this.#onState = onState;
    this.#fail = fail;
    this.#frame = this.#recv;
    this.#frameView = this.#recvView;
    if (leftover?.byteLength) this.#chunks.push(leftover);
    socket.on('data', this.#onData);
    socket.on('end', this.#onEnd);
    socket.on('error', this.#onError);
    socket.on('close', this.#onClose);
    socket.on('drain', this.#onDrain);
    // The link that owns this transport is still being made: its first records come next tick.
    process.nextTick(() => {
      if (this.#closed) return;
      this.#pump();
      if (!this.#paused && !this.#closed && !this.#waitingRoom) socket.resume();
    });
  }

  /**
   * The application waits for a message on this link (or the process's bound has room again): a
   * large message held back for the bound is reserved now, and reading goes on.
   */
  consumerWaiting(): void {
    if (this.#closed || !this.#waitingRoom || !this.#reserveLarge(false)) return;
    this.#waitingRoom = false;
    stopWaitingForRoom(this.#room);
    if (this.#paused) return;
    setImmediate(() => {
      if (this.#closed || this.#paused || this.#waitingRoom) return;
      this.#pump();
      if (!this.#closed && !this.#paused && !this.#waitingRoom) this.#socket.resume();
    });
  }

  // ------------------------------------------------------------------------------------------
  // The native socket's face.

  /** No fd of its own to offer (node:net owns it). */
  get fd(): number {
    return -1;
  }
  /** The frame handed with RecordSource.Ring: a message larger than recvBuffer, valid during the call. */
  get ringBuffer(): Buffer {
    return this.#frame;
  }
  get ringView(): DataView {
    return this.#frameView;
  }
  ref(): void {
    if (!this.#closed) this.#socket.ref();
  }
  unref(): void {
    if (!this.#closed) this.#socket.unref();
  }

  send(head: ArrayBufferView, headLength: number, body: ArrayBufferView | null, fds: readonly number[] | null): boolean {
    const h = head as Uint8Array;
    if (this.#mustWait(h, fds)) return false;
    this.#write(h, headLength, body as Uint8Array | null, null);
    return true;
  }

  /** send(), with `second` right behind the frame in the same write. */
  sendPair(head: ArrayBufferView, headLength: number, body: ArrayBufferView | null, fds: readonly number[] | null, second: Uint8Array): number {
    const h = head as Uint8Array;
    if (this.#mustWait(h, fds)) return 0;
    this.#write(h, headLength, body as Uint8Array | null, second);
    return 2;
  }

  /** Throws where nothing can be sent; true while the frame `h` must wait for 'drain'. */
  #mustWait(h: Uint8Array, fds: readonly number[] | null): boolean {
    if (this.#closed || this.#socket.destroyed || !this.#socket.writable) throw closedError();
    if (fds?.length) throw new IpcError('ERR_NOT_TRANSFERABLE', 'a TCP link carries no fds');
    // A GOODBYE or REFUSE goes even past the high-water mark: the link closes right after.
    const type = h[5];
    return this.#needDrain && type !== FrameType.Goodbye && type !== FrameType.Refuse;
  }

  #write(h: Uint8Array, headLength: number, b: Uint8Array | null, second: Uint8Array | null): void {
    const out = Buffer.allocUnsafe(headLength + (b?.byteLength ?? 0) + (second?.byteLength ?? 0));
    out.set(headLength === h.byteLength ? h : h.subarray(0, headLength), 0);
    if (b) out.set(b, headLength);
    if (second) out.set(second, out.byteLength - second.byteLength);
    if (!this.#socket.write(out)) this.#needDrain = true;
  }

  /** Resolves once what was written is in the kernel (node:net writes in order, so an empty write's callback says so). */
  whenWritten(): Promise<void> | undefined {
    if (this.#closed || this.#socket.writableLength === 0) return undefined;
    return new Promise<void>((resolve, reject) => {
      this.#socket.write(EMPTY, (e) => (e ? reject(closedError()) : resolve()));
    });
  }

  setInterest(readable: boolean, writable: boolean): void {
    if (this.#closed) return;
    this.#wantWritable = writable;
    if (writable && !this.#needDrain) {
      // Room already: say so on the next turn, as a poll would.
      setImmediate(() => {
        if (!this.#closed && this.#wantWritable && !this.#needDrain) {
          this.#wantWritable = false;
          this.#onState('writable', undefined);
        }
      });
    }
    if (readable === !this.#paused) return;
    this.#paused = !readable;
    if (this.#paused) {
      this.#socket.pause();
    } else if (!this.#resumeScheduled) {
      // Not from inside the consumer that resumed: the frames already here go first, then the socket.
      this.#resumeScheduled = true;
      setImmediate(() => {
        this.#resumeScheduled = false;
        if (this.#closed || this.#paused) return;
        this.#pump();
        if (!this.#closed && !this.#paused && !this.#waitingRoom) this.#socket.resume();
      });
    }
  }

  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    this.#chunks = [];
    stopWaitingForRoom(this.#room);
    releaseReceived(this.#reserved);
    this.#reserved = 0;
    const s = this.#socket;
    s.off('data', this.#onData);
    s.off('end', this.#onEnd);
    s.off('drain', this.#onDrain);
    s.off('close', this.#onClose);
    // Errors after the close concern no one (closeGracefully listens, or 'error' would throw).
    s.off('error', this.#onError);
    closeGracefully(s);
  }

  // ------------------------------------------------------------------------------------------
  // No frame rings on TCP: the stream check refuses RING and RING_START before they get here.

  offer(): undefined {
    return undefined;
  }
  offerSent(): void {}
  acceptOffer(): boolean {
    throw invalid('a RING frame on a TCP link');
  }
  startReceiving(): void {
    throw invalid('a RING_START frame on a TCP link');
  }

  // ------------------------------------------------------------------------------------------
  // Receiving.

  readonly #onData = (chunk: Buffer): void => {
    if (this.#closed) return;
    this.#chunks.push(chunk);
    if (!this.#paused) this.#pump();
  };

  readonly #onEnd = (): void => {
    this.#ended ??= { what: 'eof', errno: undefined };
    this.#finish();
  };

  readonly #onError = (e: Error & { errno?: number }): void => {
    this.#ended ??= { what: 'error', errno: typeof e.errno === 'number' ? Math.abs(e.errno) : undefined };
    this.#finish();
  };

  /** Closed without 'end' or 'error' first (destroyed under us): the peer is as good as gone. */
  readonly #onClose = (): void => {
    this.#ended ??= { what: 'eof', errno: undefined };
    this.#finish();
  };

  readonly #onDrain = (): void => {
    this.#needDrain = false;
    if (this.#closed || !this.#wantWritable) return;
    this.#wantWritable = false;
    this.#onState('writable', undefined);
  };

  /** The peer's end: the whole frames that arrived before it are delivered first, whatever the pause. */
  #finish(): void {
    if (this.#closed) return;
    this.#pump(true);
    if (this.#closed) return;
    const end = this.#ended!;
    this.#onState(end.what, end.errno);
  }

  /**
   * Cuts the chunks into frames and hands each whole one to the link, until they run out, the
   * link pauses reading (unless `all`: the peer has ended) or closes.
   */
  #pump(all = false): void {
    if (this.#pumping) return;
    this.#pumping = true;
    try {
      while (this.#chunks.length > 0 && !this.#closed && (all || !this.#paused)) {
        if (this.#waitingRoom) {
          // At the peer's end the message that arrived whole is taken, bound or not (it is the last).
          if (!all || !this.#reserveLarge(true)) return;
          this.#waitingRoom = false;
          stopWaitingForRoom(this.#room);
        }
        const chunk = this.#chunks[0]!;
        const available = chunk.byteLength - this.#at;
        if (this.#length === 0) {
          // The header, into the receive buffer's first 16 bytes.
          const n = Math.min(HEADER_BYTES - this.#have, available);
          chunk.copy(this.#recv, this.#have, this.#at, this.#at + n);
          this.#consumed(n);
          this.#have += n;
          if (this.#have < HEADER_BYTES) continue;
          if (!this.#startFrame(all)) return;
          if (this.#waitingRoom) return;
        } else {
          const n = Math.min(this.#length - this.#have, available);
          if (this.#have + n > this.#frame.byteLength) this.#grow(this.#have + n);
          chunk.copy(this.#frame, this.#have, this.#at, this.#at + n);
          this.#consumed(n);
          this.#have += n;
        }
        if (this.#have === this.#length) this.#deliver();
      }
    } finally {
      this.#pumping = false;
    }
  }

  #consumed(n: number): void {
    this.#at += n;
    if (this.#at === this.#chunks[0]!.byteLength) {
      this.#chunks.shift();
      this.#at = 0;
    }
  }

  /** A header arrived whole: checks it and sets up the frame's buffer. False when the link was closed for it. */
  #startFrame(all: boolean): boolean {
    let payloadLength: number;
    try {
      payloadLength = checkStreamHeader(this.#recvView, this.#maxMessageBytes);
    } catch (e) {
      const error = e as IpcError;
      if (error.code === 'ERR_MESSAGE_TOO_LARGE') {
        // The one refusal the sender can act on: tell it why, before the link closes.
        try {
          const refusal = encodeRefuse(RefuseReason.TooLarge, error.message);
          this.send(refusal, refusal.byteLength, null, null);
        } catch {
          // The peer learns from the close either way.
        }
      }
      this.#chunks = [];
      this.#fail(error);
      return false;
    }
    this.#length = HEADER_BYTES + payloadLength;
    if (this.#length <= MAX_FRAME_BYTES) {
      this.#frame = this.#recv;
      this.#frameView = this.#recvView;
    } else if (!this.#reserveLarge(all)) {
      this.#waitingRoom = true;
      waitForRoom(this.#room);
      this.#socket.pause();
    }
    return true;
  }

  /**
   * Reserves the large message whose header is in #recv against the process's bound (`force`, or
   * a consumer waiting on this link: taken whatever the bound) and sets up its buffer. False: no room.
   */
  #reserveLarge(force: boolean): boolean {
    if (!reserveReceived(this.#length, force || this.#consumerWaiting())) return false;
    this.#reserved = this.#length;
    // Past LARGE_UPFRONT_BYTES grown as the bytes come (#grow), so that a header alone never
    // makes this side hold what it announces.
    this.#frame = Buffer.allocUnsafeSlow(Math.min(this.#length, LARGE_UPFRONT_BYTES));
    this.#recv.copy(this.#frame, 0, 0, HEADER_BYTES);
    return true;
  }

  /** A larger buffer for the large message being assembled, holding what arrived: at least `need`, at most its length. */
  #grow(need: number): void {
    const next = Buffer.allocUnsafeSlow(Math.min(this.#length, Math.max(need, 2 * this.#frame.byteLength)));
    this.#frame.copy(next, 0, 0, this.#have);
    this.#frame = next;
  }

  #deliver(): void {
    const length = this.#length;
    const source = this.#frame === this.#recv ? RecordSource.Socket : RecordSource.Ring;
    if (source === RecordSource.Ring) this.#frameView = new DataView(this.#frame.buffer, this.#frame.byteOffset, length);
    this.#have = 0;
    this.#length = 0;
    this.#onRecord(0, length, undefined, undefined, source);
    // The message holds its own copy now (counted by the inbox, if it waits there).
    releaseReceived(this.#reserved);
    this.#reserved = 0;
    if (source === RecordSource.Ring) {
      // The decoded message holds copies: the frame's own buffer goes.
      this.#frame = this.#recv;
      this.#frameView = this.#recvView;
    }
  }
}
