// A Unix link's transport (UnixTransport): the socket, and once both sides agreed (HELLO feature bit FEATURE_RING), a
// frame ring each way (frame-ring.ts) for small frames without fds. It presents the native
// socket's face (send, setInterest, ...) to the outbox and the link, so that what sends and
// what receives frames does not know which path a frame took.
//
// Why: a frame through the ring costs a copy and, when the reader sleeps, one eventfd write and
// one eventfd read; through the socket it costs sendmsg() and two recvmsg() (the second finds
// the queue empty), and the kernel's socket buffer bookkeeping. Frames that follow each other
// closely (an ack, then its RELEASE) share one wake-up: the writer rings only a reader that said
// it will sleep.
//
// Ordering: every frame a side sends after its RING_START goes through the peer's ring in order,
// either whole or as a SOCKET entry that stands for the next frame on the socket. The writer
// publishes that entry only once sendmsg() took the frame, so the reader, given a socket frame,
// first takes the ring's frames up to the SOCKET entry; when the entry is not published yet, every
// ring frame sent before the socket frame is (it was published before the sendmsg()), and the
// reader notes a credit that the entry, once published, uses up.
//
// Death: the socket still tells (EOF, or an error): before passing that on, the reader takes
// whatever the peer published, so a GOODBYE that went through the ring still reads as a clean
// close, and frames sent before a crash are still delivered.
import { endianness } from 'node:os';
import { IpcError } from '../../errors.js';
import { addon } from '../../native/addon.js';
import type { NativeDoorbell } from '../../native/channel-types.js';
import type { NativeOwnedFd, NativeSocket } from '../../native/posix-types.js';
import type { FrameTransport, RingState } from './frame-transport.js';
import { FEATURE_RING, FrameType, HEADER_BYTES, RING_FDS, RING_PAYLOAD_BYTES, writeHeader } from './frame.js';
import { EntryKind, RingReader, RingWriter } from './frame-ring.js';
import { closeFds } from './fds.js';

/**
 * Where a record the link is given lies: the socket's receive buffer, or the transport's own
 * buffer (ringBuffer: a frame ring's copy, or a TCP frame too large for the receive buffer).
 */
export const enum RecordSource {
  Socket = 0,
  Ring = 1,
}

export type RecordHandler = (status: number, length: number, fds: number[] | undefined, cred: [number, number, number] | undefined, source: RecordSource) => void;
export type StateHandler = (what: 'writable' | 'eof' | 'error', errno: number | undefined) => void;

/**
 * Links offer frame rings only when asked: CUDA_IPC_LINK_RING=1 or spawn(..., { frameRing: true })
 * (and only on little-endian machines: the ring's words are native-endian atomics). Measured on
 * the 2-core CPU machine (bench, 20 runs, both paths in each run), the ring did not beat the
 * socket: the bare round trip 11.8 us through rings against 11.5 us over the socket (1.05x
 * slower paired, 1.12x unpinned), its p99 335 us against 93 us; the host-buffer handoff 63.4 us
 * against 65.2 us (0.98x, within the runs' spread of 58-71 us). The socket is the default until
 * the bench on the GPU machine shows the ring faster there.
 */
export const FRAME_RING_DEFAULT = process.env.CUDA_IPC_LINK_RING === '1' && endianness() === 'LE';

const enum Blocked {
  No = 0,
  Socket = 1,
  Ring = 2,
}

/** Messages delivered one microtask after another before a drain yields to the event loop. */
const DRAIN_BUDGET = 64;

const enum Drain {
  /** Up to where the link paused reading, then arm the doorbell. */
  Normal = 0,
  /** Up to the SOCKET entry a socket frame stands behind (or a credit), whatever the pause. */
  UntilSocket = 1,
  /** Everything published (the socket ended), whatever the pause. */
  All = 2,
}

export type { RingState } from './frame-transport.js';

/** The transport of a link on one machine: a Unix socket, with frame rings where both sides take them. */
export class UnixTransport implements FrameTransport {
  readonly kind = 'unix';
  /** Messages larger than a frame travel in a sealed memfd (large-message.ts). */
  readonly inlineLarge = false;
  readonly #sock: NativeSocket;
  readonly #onRecord: RecordHandler;
  readonly #onState: StateHandler;
  readonly #fail: (error: IpcError) => void;
  readonly #features: number;
  #peerFeatures = 0;
  #closed = false;
  // Inbound: the ring this side reads, its doorbell, and where a ring frame is copied for the link.
  #reader: RingReader | undefined;
  #bellFd: NativeOwnedFd | undefined;
  #bell: NativeDoorbell | undefined;
  #receiving = false;
  #paused = false;
  #credits = 0;
  #ringBuffer: Buffer | undefined;
  #ringView: DataView | undefined;
  // Outbound: the peer's ring and doorbell.
  #writer: RingWriter | undefined;
  #peerBellFd: NativeOwnedFd | undefined;
  #sending = false;
  #blocked = Blocked.No;
  #wantWritable = false;
  /** Messages delivered in the current run of microtask-chained drains. */
  #chained = 0;

  /** Takes ownership of `fd` once constructed (a throw leaves it to the caller). */
  constructor(fd: number, bufferSize: number, onRecord: RecordHandler, onState: StateHandler, fail: (error: IpcError) => void, ring: boolean) {
    this.#onRecord = onRecord;
    this.#onState = onState;
    this.#fail = fail;
    this.#features = ring ? FEATURE_RING : 0;
    this.#sock = new addon.Socket(fd, bufferSize, this.#socketRecord, this.#socketState);
  }

  // ------------------------------------------------------------------------------------------
  // The native socket's face.

  get fd(): number {
    return this.#sock.fd;
  }
  get recvBuffer(): ArrayBuffer {
    return this.#sock.recvBuffer;
  }
  ref(): void {
    this.#sock.ref();
  }
  unref(): void {
    this.#sock.unref();
  }

  send(head: ArrayBufferView, headLength: number, body: ArrayBufferView | null, fds: readonly number[] | null): boolean {
    if (!this.#sending) {
      if (!this.#sock.send(head, headLength, body, fds)) {
        this.#blocked = Blocked.Socket;
        return false;
      }
      // Every frame after this one goes through the peer's ring, in order.
      if (this.#writer && (head as Uint8Array)[5] === FrameType.RingStart) this.#sending = true;
      return true;
    }
    const w = this.#writer!;
    // As sendmsg() fails on a socket whose peer closed (the outbox reads EPIPE as ERR_LINK_CLOSED).
    if (w.readerClosed) throw Object.assign(new Error('the peer closed its frame ring'), { code: 'EPIPE' });
    const h = head as Uint8Array;
    const b = body as Uint8Array | null;
    const length = headLength + (b?.byteLength ?? 0);
    if (!fds?.length && length <= w.maxFrame) {
      if (!w.fitsOrWait(length)) {
        this.#blocked = Blocked.Ring;
        return false;
      }
      w.put(EntryKind.Frame, h, headLength, b);
    } else {
      // By the socket, with a SOCKET entry in the ring where the frame stands in order: room for
      // the entry first, then the frame, then the entry (see the ordering notes above).
      if (!w.fitsOrWait(0)) {
        this.#blocked = Blocked.Ring;
        return false;
      }
      if (!this.#sock.send(head, headLength, body, fds)) {
        this.#blocked = Blocked.Socket;
        return false;
      }
      w.put(EntryKind.Socket, null, 0, null);
    }
    if (w.publish()) addon.eventfdRing(this.#peerBellFd!.fd);
    return true;
  }

  sendPair(head: ArrayBufferView, headLength: number, body: ArrayBufferView | null, fds: readonly number[] | null, second: Uint8Array): number {
    if (!this.#sending) {
      const n = this.#sock.sendPair(head, headLength, body, fds, second);
      if (n === 0) this.#blocked = Blocked.Socket;
      return n;
    }
    // Through the peer's ring: two entries, and the second publish rings no doorbell the first rang.
    if (!this.send(head, headLength, body, fds)) return 0;
    return this.send(second, second.byteLength, null, null) ? 2 : 1;
  }

  setInterest(readable: boolean, writable: boolean): void {
    if (this.#closed) return;
    const resumed = this.#paused && readable;
    this.#paused = !readable;
    this.#wantWritable = writable;
    // A frame waiting for room in the ring is woken by the peer's ring of this side's doorbell,
    // not by the socket (which would report writable at once, over and over).
    this.#sock.setInterest(readable, writable && this.#blocked !== Blocked.Ring);
    if (resumed && this.#receiving) {
      setImmediate(() => {
        if (!this.#closed && !this.#paused) this.#drain(Drain.Normal);
      });
    }
  }

  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    this.#bell?.close();
    this.#sock.close();
    this.#reader?.close();
    this.#writer?.close();
    this.#bellFd?.close();  // after its Doorbell stopped polling it
    this.#peerBellFd?.close();
  }

  // ------------------------------------------------------------------------------------------
  // Agreeing on the rings (link-sender.ts offers, frame-dispatch.ts accepts and starts).

  /** HELLO's features from this side. */
  get features(): number {
    return this.#features;
  }

  /** Which rings are in use (tests, status). */
  get ringState(): RingState {
    return { sending: this.#sending, receiving: this.#receiving };
  }

  /** Copy of a ring frame, for the link to read when it is given a record from RecordSource.Ring. */
  get ringBuffer(): Buffer {
    return this.#ringBuffer!;
  }
  get ringView(): DataView {
    return this.#ringView!;
  }

  /**
   * The link is open and the peer's HELLO said `peerFeatures`: when both sides take rings, makes
   * this side's (ring and doorbell) and returns the RING frame offering it, whose fds are
   * borrowed until offerSent(). Undefined when there is nothing to offer.
   */
  offer(peerFeatures: number): { frame: Uint8Array; fds: number[] } | undefined {
    this.#peerFeatures = peerFeatures;
    if (!(this.#features & peerFeatures & FEATURE_RING) || this.#closed || this.#reader) return undefined;
    const reader = new RingReader();
    let bellFd: NativeOwnedFd | undefined;
    try {
      const fd = addon.eventfdCreate();
      try {
        bellFd = new addon.OwnedFd(fd);
      } catch (e) {
        addon.close(fd);
        throw e;
      }
      this.#bell = new addon.Doorbell(bellFd.fd, this.#rung);
    } catch (e) {
      bellFd?.close();
      reader.close();
      throw e;
    }
    this.#reader = reader;
    this.#bellFd = bellFd;
    this.#ringBuffer = Buffer.allocUnsafeSlow(reader.capacity / 4);
    this.#ringView = new DataView(this.#ringBuffer.buffer, this.#ringBuffer.byteOffset, this.#ringBuffer.byteLength);
    const frame = new Uint8Array(HEADER_BYTES + RING_PAYLOAD_BYTES);
    const v = new DataView(frame.buffer);
    writeHeader(v, FrameType.Ring, 0, RING_PAYLOAD_BYTES, RING_FDS);
    v.setUint32(HEADER_BYTES, reader.capacity, true);
    return { frame, fds: [reader.fd, bellFd.fd] };
  }

  /** The RING frame went out (or is queued with its own copies of the fds). */
  offerSent(): void {
    this.#reader?.closeFd();
  }

  /**
   * The peer offered its ring (`fds`: memfd, doorbell; owned from the call on). Returns true when
   * this side takes it: the link then sends RING_START, and from that frame on this side sends
   * through the ring. False when this side could not offer its own ring (the peer would have no
   * doorbell to say it made room): this side keeps sending by the socket. Throws
   * ERR_FRAME_INVALID for an offer a correct peer does not make.
   */
  acceptOffer(capacity: number, fds: [number, number]): boolean {
    const [memfd, bellFd] = fds;
    if (!(this.#features & this.#peerFeatures & FEATURE_RING) || this.#writer) {
      closeFds(fds);
      throw new IpcError('ERR_FRAME_INVALID', this.#writer ? 'the peer offered a second frame ring' : 'the peer offered a frame ring although the HELLOs did not agree on one');
    }
    if (!this.#reader) {
      closeFds(fds);
      return false;
    }
    let isEventfd = false;
    try {
      isEventfd = addon.isEventfd(bellFd);
    } catch {
      // refused below
    }
    if (!isEventfd) {
      closeFds(fds);
      throw new IpcError('ERR_FRAME_INVALID', 'the peer offered a frame ring whose doorbell is not an eventfd');
    }
    let peerBell: NativeOwnedFd;
    try {
      peerBell = new addon.OwnedFd(bellFd);
    } catch (e) {
      closeFds(fds);
      throw e;
    }
    try {
      this.#writer = new RingWriter(memfd, capacity);  // owns memfd, even when it throws
    } catch (e) {
      peerBell.close();
      throw e;
    }
    this.#peerBellFd = peerBell;
    return true;
  }

  /** RING_START arrived: the peer's frames now come through this side's ring. */
  startReceiving(): void {
    // A correct peer offers its own ring (its doorbell, which this side rings when it made room)
    // before it starts using this side's.
    if (!this.#reader || this.#receiving || !this.#writer) {
      throw new IpcError('ERR_FRAME_INVALID', this.#receiving ? 'the peer sent a second RING_START'
        : !this.#reader ? 'the peer sent RING_START without having been offered a frame ring' : 'the peer sent RING_START before offering its own frame ring');
    }
    // The socket callback that delivered RING_START reads the ring next (#socketRecord).
    this.#receiving = true;
  }

  // ------------------------------------------------------------------------------------------
  // Receiving.

  readonly #socketRecord = (status: number, length: number, fds: number[] | undefined, cred: [number, number, number] | undefined): void => {
    if (this.#closed) {
      closeFds(fds);
      return;
    }
    if (this.#receiving) {
      // The frames the peer put in the ring before this one go first.
      this.#drain(Drain.UntilSocket);
      if (this.#closed) {
        closeFds(fds);
        return;
      }
    }
    this.#onRecord(status, length, fds, cred, RecordSource.Socket);
    if (this.#receiving && !this.#closed && !this.#paused) this.#drain(Drain.Normal);
  };

  readonly #socketState = (what: 'writable' | 'eof' | 'error', errno: number | undefined): void => {
    if (this.#closed) return;
    if (what === 'writable') {
      if (this.#blocked === Blocked.Socket) this.#blocked = Blocked.No;
    } else if (this.#receiving) {
      // What the peer published before it went away is still delivered.
      this.#drain(Drain.All);
      if (this.#closed) return;
    }
    this.#onState(what, errno);
  };

  readonly #resume = (): void => {
    if (!this.#closed && !this.#paused && this.#receiving) this.#drain(Drain.Normal);
  };

  /** This side's doorbell: the peer published frames, or made room in its ring for this side. */
  readonly #rung = (status: number): void => {
    if (this.#closed) return;
    if (status < 0) {
      this.#fail(new IpcError('ERR_PEER_GONE', `polling the link's doorbell failed (errno ${-status})`));
      return;
    }
    if (this.#blocked === Blocked.Ring && this.#wantWritable) {
      this.#blocked = Blocked.No;
      this.#onState('writable', undefined);
      if (this.#closed) return;
    }
    if (this.#receiving && !this.#paused) this.#drain(Drain.Normal);
  };

  /**
   * Hands the ring's frames to the link in order. Returns when the ring is empty (Normal: with
   * the doorbell armed), at a SOCKET entry whose frame has not arrived, at the SOCKET entry a
   * socket frame stands behind (UntilSocket), where the link paused reading (Normal), or after a
   * message (Normal), going on in a microtask: as the socket runs microtasks after each record, the
   * code a message resumes runs before the frames behind it (an ack's RELEASE, whose unmapping
   * then no longer delays the caller's next step).
   */
  #drain(mode: Drain): void {
    const r = this.#reader!;
    let yielded = false;
    try {
      for (;;) {
        if (!r.next()) {
          if (mode === Drain.UntilSocket) {
            // The socket frame came before its SOCKET entry was published; that entry is owed.
            this.#credits++;
            break;
          }
          if (mode === Drain.Normal && r.arm()) continue;
          break;
        }
        if (r.kind === EntryKind.Socket) {
          if (this.#credits > 0) {
            // The entry of a socket frame handled already (it came before its entry): entries
            // are in order, so the first owed entry is the oldest credit's. Frames behind it go on.
            this.#credits--;
            r.consume();
            continue;
          }
          if (mode === Drain.UntilSocket) r.consume();  // the entry of the socket frame in hand
          break;  // otherwise its frame is still on its way through the socket
        }
        const length = r.frameLength;
        const buffer = this.#ringBuffer!;
        r.data.copy(buffer, 0, r.frameStart, r.frameStart + length);
        r.consume();
        if (r.takeWriterWaiting()) addon.eventfdRing(this.#peerBellFd!.fd);
        const message = length > 5 && buffer[5] === FrameType.Message;
        this.#onRecord(0, length, undefined, undefined, RecordSource.Ring);
        if (this.#closed) return;
        if (mode === Drain.Normal && (this.#paused || (message && (yielded = true)))) break;
      }
      if (r.takeWriterWaiting()) addon.eventfdRing(this.#peerBellFd!.fd);
      if (yielded) {
        // A bounded run of microtasks, then a turn of the event loop (as the socket's drain budget).
        if (++this.#chained < DRAIN_BUDGET) queueMicrotask(this.#resume);
        else {
          this.#chained = 0;
          setImmediate(this.#resume);
        }
      } else {
        this.#chained = 0;
      }
    } catch (e) {
      if (this.#closed) return;
      this.#fail(e instanceof IpcError ? e : new IpcError('ERR_FRAME_INVALID', `reading the link's frame ring failed: ${String((e as Error)?.message ?? e)}`, { cause: e }));
    }
  }
}
