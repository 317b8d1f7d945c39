// The frame ring: one direction of a link's frames through shared memory instead of the socket,
// woken by an eventfd doorbell (unix-transport.ts drives it; docs/PROTOCOL.md section 3.1 is the
// byte-for-byte description). The reader of a ring creates it (a sealed memfd) and its doorbell,
// and offers both to the writer in a RING frame; from then on the writer copies small frames
// without fds into the ring and rings the reader's doorbell only when the reader said it will
// sleep. A frame that must go by the socket (it carries fds, or is larger than a quarter of the
// ring) leaves a SOCKET entry in its place, so that the reader takes the two paths in the order
// they were sent.
//
// Layout (little-endian u32 words; the data area starts at RING_DATA_OFFSET):
//   0    magic 0x52504943 ("CIPR")     4    version 1
//   8    capacity of the data area     12   reserved, 0
//   64   tail: bytes published (the writer's, wrapping mod 2^32)
//   128  head: bytes consumed (the reader's, wrapping mod 2^32)
//   192  reader armed: 1 = the reader will sleep until rung; the writer swaps it to 0 and rings
//   256  writer waiting: 1 = the writer waits for room; the reader swaps it to 0 and rings back
//   320  reader closed: 1 once the reader closed its link (the writer's sends then fail at once, as
//        they do on a socket whose peer closed; a reader that dies says nothing: its socket does)
// Entries start 8-byte aligned at (position mod capacity) and never wrap:
//   u32 length (frame bytes that follow; 0 for SOCKET and PAD), u32 kind (1 FRAME, 2 SOCKET,
//   3 PAD: the rest of the data area is unused, the next entry is at its start); then the frame,
//   padded to 8 bytes.
//
// Each side keeps its own position (the writer its tail, the reader its head) and only ever
// stores it: a peer that scribbles over the shared words can make this side read garbage frames
// (which the frame checks refuse, closing the link), never read or write outside the mapping.
import { IpcError } from '../../errors.js';
import { addon } from '../../native/addon.js';
import type { NativeSharedMemory } from '../../native/posix-types.js';

export const RING_MAGIC = 0x52504943;
export const RING_VERSION = 1;
export const RING_DATA_OFFSET = 4096;
/** Data area of the rings a link makes. */
export const RING_CAPACITY = 64 * 1024;
export const RING_MIN_CAPACITY = 4096;
export const RING_MAX_CAPACITY = 1 << 24;

const W_MAGIC = 0;
const W_VERSION = 1;
const W_CAPACITY = 2;
const W_RESERVED = 3;
const W_TAIL = 16;
const W_HEAD = 32;
const W_ARMED = 48;
const W_WAITING = 64;
const W_CLOSED = 80;

export const enum EntryKind {
  Frame = 1,
  Socket = 2,
  Pad = 3,
}
const ENTRY_HEAD_BYTES = 8;
const align8 = (n: number): number => (n + 7) & ~7;

// F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL: the file keeps its size for good.
const SEALS = addon.posixConstants.F_SEAL_SHRINK | addon.posixConstants.F_SEAL_GROW | addon.posixConstants.F_SEAL_SEAL;

function corrupt(why: string): IpcError {
  return new IpcError('ERR_FRAME_INVALID', `the peer's frame ring is corrupt (${why}); the peer is broken or hostile`);
}

/** A mapped ring: the words as an Int32Array (atomics), the data area as a Buffer. */
class RingMapping {
  readonly words: Int32Array;
  readonly data: Buffer;
  readonly view: DataView;
  constructor(
    readonly memory: NativeSharedMemory,
    readonly capacity: number,
  ) {
    const ab = memory.arrayBuffer(0, RING_DATA_OFFSET + capacity);
    this.words = new Int32Array(ab, 0, RING_DATA_OFFSET / 4);
    this.data = Buffer.from(ab, RING_DATA_OFFSET, capacity);
    this.view = new DataView(ab, RING_DATA_OFFSET, capacity);
  }
  close(): void {
    this.memory.close();
  }
}

/** A ring this side reads (it made it); `fd` is the memfd to offer, until closeFd(). */
export class RingReader {
  readonly #map: RingMapping;
  readonly #mask: number;
  #head = 0;
  /** The entry last returned by next(): its kind, and where its frame lies in `data`. */
  kind: EntryKind = EntryKind.Pad;
  frameStart = 0;
  frameLength = 0;
  #next = 0;

  constructor(capacity = RING_CAPACITY) {
    const length = RING_DATA_OFFSET + capacity;
    const fd = addon.memfdCreate('cuda-ipc-link-ring', length, SEALS);
    let memory: NativeSharedMemory;
    try {
      memory = new addon.SharedMemory(fd, length);
    } catch (e) {
      addon.close(fd);
      throw e;
    }
    this.#map = new RingMapping(memory, capacity);
    this.#mask = capacity - 1;
    const w = this.#map.words;
    w[W_MAGIC] = RING_MAGIC;
    w[W_VERSION] = RING_VERSION;
    w[W_CAPACITY] = capacity;
    w[W_RESERVED] = 0;
    Atomics.store(w, W_ARMED, 1);  // asleep until the first frame
  }

  get capacity(): number {
    return this.#map.capacity;
  }
  /** The memfd to offer the writer (-1 once closeFd() ran). */
  get fd(): number {
    return this.#map.memory.fd;
  }
  /** The data area: frames returned by next() lie in data[frameStart, frameStart + frameLength). */
  get data(): Buffer {
    return this.#map.data;
  }
  /** The fd went to the writer: the mapping needs it no longer. */
  closeFd(): void {
    this.#map.memory.closeFd();
  }

  /**
   * The next entry (kind and frame in the fields above), or false when the writer has published
   * nothing more. Pads are skipped. Call consume() once done with it. Throws ERR_FRAME_INVALID
   * for an entry no correct writer makes.
   */
  next(): boolean {
    const w = this.#map.words;
    for (;;) {
      const tail = Atomics.load(w, W_TAIL) >>> 0;
      const used = (tail - this.#head) >>> 0;
      if (used === 0) return false;
      const capacity = this.#map.capacity;
      if (used > capacity || used % 8 !== 0) throw corrupt(`${used} bytes published`);
      const at = this.#head & this.#mask;
      const room = capacity - at;
      const v = this.#map.view;
      const length = v.getUint32(at, true);
      const kind = v.getUint32(at + 4, true);
      if (kind === EntryKind.Pad) {
        if (length !== 0 || used < room) throw corrupt('a misplaced PAD entry');
        this.#head = (this.#head + room) >>> 0;
        continue;
      }
      const size = ENTRY_HEAD_BYTES + align8(length);
      if (length > capacity / 4) throw corrupt(`a frame of ${length} bytes, more than a quarter of the ring`);
      if (size > room || size > used) throw corrupt(`an entry of ${length} bytes past the data published`);
      if (kind === EntryKind.Frame) {
        if (length === 0) throw corrupt('an empty FRAME entry');
      } else if (kind !== EntryKind.Socket || length !== 0) {
        throw corrupt(`entry kind ${kind} of ${length} bytes`);
      }
      this.kind = kind;
      this.frameStart = at + ENTRY_HEAD_BYTES;
      this.frameLength = length;
      this.#next = (this.#head + size) >>> 0;
      return true;
    }
  }

  /** Frees the entry next() returned. */
  consume(): void {
    this.#head = this.#next;
    Atomics.store(this.#map.words, W_HEAD, this.#head | 0);
  }

  /**
   * This side will sleep until rung: arms the doorbell, then looks again. True when frames came
   * in meanwhile (read them; the writer may or may not ring as well).
   */
  arm(): boolean {
    const w = this.#map.words;
    Atomics.store(w, W_ARMED, 1);
    return (Atomics.load(w, W_TAIL) >>> 0) !== this.#head;
  }

  /** True when the writer waits for room (it is then to be rung), clearing its flag. */
  takeWriterWaiting(): boolean {
    const w = this.#map.words;
    return Atomics.load(w, W_WAITING) !== 0 && Atomics.exchange(w, W_WAITING, 0) !== 0;
  }

  /** The link closed: tells the writer (whose next send fails) and unmaps. */
  close(): void {
    Atomics.store(this.#map.words, W_CLOSED, 1);
    this.#map.close();
  }
}

/** A ring this side writes (the peer made it and offered it in a RING frame). */
export class RingWriter {
  readonly #map: RingMapping;
  readonly #mask: number;
  readonly #maxFrame: number;
  #tail = 0;

  /** Maps the offered memfd (taking ownership of it, even on failure) after checking its header. */
  constructor(fd: number, capacity: number) {
    if (capacity < RING_MIN_CAPACITY || capacity > RING_MAX_CAPACITY || (capacity & (capacity - 1)) !== 0) {
      addon.close(fd);
      throw new IpcError('ERR_FRAME_INVALID', `the peer offered a frame ring of ${capacity} bytes: not a power of two in ${RING_MIN_CAPACITY}..${RING_MAX_CAPACITY}`);
    }
    const length = RING_DATA_OFFSET + capacity;
    let memory: NativeSharedMemory;
    try {
      // Touching a page past the end of the file would raise SIGBUS: the file must be that long
      // and sealed against shrinking for good.
      const sealed = (addon.getSeals(fd) & addon.posixConstants.F_SEAL_SHRINK) !== 0;
      if (!sealed || addon.fstatSize(fd) < length) {
        throw new IpcError('ERR_FRAME_INVALID', 'the peer offered a frame ring whose file is shorter than its capacity or not sealed against shrinking');
      }
      memory = new addon.SharedMemory(fd, length);
    } catch (e) {
      addon.close(fd);
      if (e instanceof IpcError) throw e;
      throw new IpcError('ERR_FRAME_INVALID', `the peer offered a frame ring that cannot be mapped: ${String((e as Error)?.message ?? e)}`, { cause: e });
    }
    const map = new RingMapping(memory, capacity);
    memory.closeFd();
    const w = map.words;
    if (w[W_MAGIC] !== RING_MAGIC || w[W_VERSION] !== RING_VERSION || w[W_CAPACITY] !== capacity || w[W_RESERVED] !== 0) {
      map.close();
      throw new IpcError('ERR_FRAME_INVALID', 'the peer offered a frame ring with a bad header (magic, version or capacity)');
    }
    this.#map = map;
    this.#mask = capacity - 1;
    this.#maxFrame = capacity / 4;
  }

  /** Largest frame put() takes: larger ones go by the socket. */
  get maxFrame(): number {
    return this.#maxFrame;
  }

  /** Bytes an entry of `frameLength` needs at the tail now, a PAD included. */
  #need(frameLength: number): number {
    const size = ENTRY_HEAD_BYTES + align8(frameLength);
    const room = this.#map.capacity - (this.#tail & this.#mask);
    return size > room ? room + size : size;
  }

  #free(): number {
    const used = (this.#tail - (Atomics.load(this.#map.words, W_HEAD) >>> 0)) >>> 0;
    if (used > this.#map.capacity) throw corrupt(`the reader consumed past what was published (${used} bytes outstanding)`);
    return this.#map.capacity - used;
  }

  /** Whether an entry of `frameLength` fits now. */
  fits(frameLength: number): boolean {
    return this.#free() >= this.#need(frameLength);
  }

  /**
   * Whether it fits; when it does not, tells the reader to ring this side once it consumed
   * something (and looks again, in case it did meanwhile).
   */
  fitsOrWait(frameLength: number): boolean {
    if (this.fits(frameLength)) return true;
    Atomics.store(this.#map.words, W_WAITING, 1);
    return this.fits(frameLength);
  }

  /** Writes an entry (after fits() said yes), unpublished; publish() makes it visible. */
  put(kind: EntryKind, head: Uint8Array | null, headLength: number, body: Uint8Array | null): void {
    const length = headLength + (body?.byteLength ?? 0);
    const v = this.#map.view;
    let at = this.#tail & this.#mask;
    const size = ENTRY_HEAD_BYTES + align8(length);
    if (size > this.#map.capacity - at) {
      v.setUint32(at, 0, true);
      v.setUint32(at + 4, EntryKind.Pad, true);
      this.#tail = (this.#tail + this.#map.capacity - at) >>> 0;
      at = 0;
    }
    v.setUint32(at, length, true);
    v.setUint32(at + 4, kind, true);
    const data = this.#map.data;
    if (head && headLength > 0) data.set(headLength === head.byteLength ? head : head.subarray(0, headLength), at + ENTRY_HEAD_BYTES);
    if (body && body.byteLength > 0) data.set(body, at + ENTRY_HEAD_BYTES + headLength);
    this.#tail = (this.#tail + size) >>> 0;
  }

  /** True once the reader closed its link. */
  get readerClosed(): boolean {
    return Atomics.load(this.#map.words, W_CLOSED) !== 0;
  }

  /** Makes what put() wrote visible to the reader. True when the reader must be rung. */
  publish(): boolean {
    const w = this.#map.words;
    Atomics.store(w, W_TAIL, this.#tail | 0);
    return Atomics.load(w, W_ARMED) !== 0 && Atomics.exchange(w, W_ARMED, 0) !== 0;
  }

  close(): void {
    this.#map.close();
  }
}
