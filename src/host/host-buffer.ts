// HostBuffer: shared host memory (memfd + mmap MAP_SHARED) with the same method names as a device
// buffer: write / read / fill / view / close / byteLength. Another process maps the same bytes
// when it is given the fd (send the HostBuffer over a link).
import { addon } from '../native/addon.js';
import type { NativeSharedMemory } from '../native/posix-types.js';
import { IpcError, checkViewBytes, fdLimitError, outOfMemoryError, MAX_VIEW_BYTES } from '../errors.js';
import { raceWait, type WaitOptions } from '../abort.js';
import { trackLeak, untrackLeak, type LeakToken } from '../leak.js';
import { invalidArgValue, invalidArgType, badNumber, outOfRange } from '../arg-errors.js';

const { F_SEAL_SHRINK, F_SEAL_GROW, F_SEAL_SEAL } = addon.posixConstants;
/** Seals of every buffer allocate() makes: its size can never change. */
const SEALED = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;

/** For the transfer handler (not exported by the package): the whole mapping's length, whether
 * the file is sealed against shrinking, and the mapping itself (one per fd: buffers and views
 * sharing memory share it). */
export let describeHostBuffer: (buffer: HostBuffer) => { mappingLength: number; sealed: boolean; mapping: object };
/**
 * For the transfer handler: keeps the buffer's memory mapped (and its fd open) until the returned
 * function runs (once; later calls do nothing), even if every HostBuffer over it is closed.
 */
export let leaseHostBuffer: (buffer: HostBuffer) => () => void;
/**
 * For the transfer handler: runs `done` once the buffer's memory is unmapped, or once the memory
 * was garbage-collected without being closed (a leaked import must not pin its sender's memory
 * for the life of the link). At once if it is unmapped already.
 */
export let whenHostBufferReleased: (buffer: HostBuffer, done: () => void) => void;
/**
 * For a tensor set's encoder: a new HostBuffer over the whole mapping of `buffer` (which may be a
 * view of part of it), sharing it like a view. Close it too.
 */
export let wholeHostBuffer: (buffer: HostBuffer) => HostBuffer;
/**
 * For channel messages in slots larger than one typed array: a new Uint8Array over `length` bytes
 * at `offset` of the buffer (detached when its memory is unmapped, like `bytes`).
 */
export let hostBufferRange: (buffer: HostBuffer, offset: number, length: number) => Uint8Array;

/** Runs the callbacks of a mapping that was garbage-collected without being unmapped. */
const collected = new FinalizationRegistry<Array<() => void>>((callbacks) => runAll(callbacks));

function runAll(callbacks: Array<() => void>): void {
  for (const cb of callbacks.splice(0)) {
    try {
      cb();
    } catch (e) {
      process.emitWarning(`a HostBuffer release callback threw: ${String((e as Error)?.message ?? e)}`, { code: 'CUDA_IPC_RELEASE_CALLBACK' });
    }
  }
}

/**
 * The mapping shared by a HostBuffer, its views and the leases on it (sends over links): unmapped
 * when the last of them lets go, or at once by a forced close.
 */
class Mapping {
  /** Open HostBuffers over the mapping, plus outstanding leases. */
  users = 1;
  leases = 0;
  unmapped = false;
  /** Run once unmapped (or garbage-collected); not holding the mapping, so GC can see it. */
  readonly #onRelease: Array<() => void> = [];
  #released: Promise<void> | undefined;
  #resolveReleased: (() => void) | undefined;

  constructor(
    readonly native: NativeSharedMemory,
    /** The memfd and the mapping's length, as the caller mapped them (no native getter calls). */
    readonly fd: number,
    readonly length: number,
    /** Sealed against shrinking: no one can truncate the file under a mapping (SIGBUS). */
    readonly sealed: boolean,
  ) {}

  release(): void {
    if (--this.users === 0) this.unmap();
  }

  /** Unmaps and closes the fd now, whoever still uses the mapping (their views go dark). */
  unmap(): void {
    if (this.unmapped) return;
    this.unmapped = true;
    try {
      this.native.close();
    } finally {
      // Registered for collection with its first callback (whenReleased), so only then unregistered.
      const callbacks = this.#onRelease;
      if (callbacks.length) collected.unregister(this);
      this.#resolveReleased?.();
      if (callbacks.length) runAll(callbacks);
    }
  }

  lease(): () => void {
    if (this.unmapped) return () => {};
    this.users++;
    this.leases++;
    let done = false;
    return () => {
      if (done) return;
      done = true;
      this.leases--;
      this.release();
    };
  }

  whenReleased(done: () => void): void {
    if (this.unmapped) {
      runAll([done]);
      return;
    }
    if (this.#onRelease.length === 0) collected.register(this, this.#onRelease, this);
    this.#onRelease.push(done);
  }

  released(): Promise<void> {
    if (this.unmapped) return Promise.resolve();
    this.#released ??= new Promise<void>((resolve) => (this.#resolveReleased = resolve));
    return this.#released;
  }
}


const nothingToRelease = (): void => {};
/** fill() of a buffer larger than one typed array goes this many bytes at a time. */
const FILL_PIECE_BYTES = 2 ** 30;

function toSize(bytes: number | bigint, what: string): number {
  const n = typeof bytes === 'bigint' ? Number(bytes) : bytes;
  if (!Number.isSafeInteger(n) || n <= 0) {
    throw badNumber(bytes, `${what} must be a positive integer number of bytes; got ${String(bytes)}`);
  }
  return n;
}

function asBytes(v: ArrayBufferView | ArrayBuffer, what: string): Uint8Array {
  if (v instanceof Uint8Array) return v;
  if (ArrayBuffer.isView(v)) return new Uint8Array(v.buffer, v.byteOffset, v.byteLength);
  if (v instanceof ArrayBuffer) return new Uint8Array(v);
  throw invalidArgType(`${what} must be an ArrayBuffer or a typed array / DataView / Buffer`);
}

function checkOffset(offset: number, what: string): void {
  if (!Number.isSafeInteger(offset) || offset < 0) {
    throw badNumber(offset, `${what} must be a non-negative integer; got ${String(offset)}`);
  }
}

/**
 * Shared host memory. `bytes` is a zero-copy Uint8Array over the mapping.
 *
 * Lifetime: `close()` detaches this buffer's `bytes` (every typed array over it then has length 0,
 * so stale views can never touch unmapped memory). Views made with `view()` share the mapping: it
 * stays mapped, and the fd open, until the buffer and all its views are closed; closing the parent
 * only makes the parent unusable.
 *
 * Leases: sending a HostBuffer over a link leases its memory to the peer, which keeps it mapped
 * here (and the fd open) until the peer closes what it received, or the link closes, even after
 * this buffer and its views were closed. `leases` counts them; `released()` resolves once the
 * memory is finally unmapped. `close({ force: true })` unmaps it now regardless.
 */
export class HostBuffer implements Disposable {
  #mapping: Mapping | undefined;
  /** The same mapping, kept after close() for `leases` and `released()`. */
  readonly #shared: Mapping;
  /** Made on first use: a buffer that is only sent on never needs a JS view of its memory. */
  #bytes: Uint8Array | undefined;
  #dataView: DataView | undefined;
  readonly #offset: number;
  readonly #length: number;
  readonly #leak: LeakToken;

  private constructor(mapping: Mapping, offset: number, length: number) {
    this.#mapping = mapping;
    this.#shared = mapping;
    this.#offset = offset;
    this.#length = length;
    // Native finalizers close the fd and unmap once no ArrayBuffer needs the memory: only warn.
    this.#leak = trackLeak(this, 'A HostBuffer', nothingToRelease, undefined, length);
  }

  /** The Uint8Array over this buffer's range, made on first use. */
  #view(m: Mapping): Uint8Array {
    if (this.#bytes) return this.#bytes;
    checkViewBytes(this.#length, 'HostBuffer.bytes',
      'use view(offset, length).bytes for a part of it, or copy in pieces with read(dst, offset) and write(src, offset)');
    return (this.#bytes = new Uint8Array(m.native.arrayBuffer(this.#offset, this.#length)));
  }

  /**
   * Allocates `bytes` of zeroed shared memory in a new memfd, sealed against resizing.
   *
   * Pages are taken when first touched, as with malloc: a buffer larger than the free memory is
   * served, and touching more of it than the system can give ends in the kernel's out-of-memory
   * handling, not in an error here. Buffers larger than `buffer.constants.MAX_LENGTH` (4 GiB on
   * Node 20; 2^53 - 1 from Node 22), the most one typed array can span, are served and work with
   * `write`, `fill`, `view(offset, length)`, `read(dst, offset)`, `read(offset, length)` of a part,
   * links and channels; what would make one array of all of them throws ERR_VIEW_TOO_LARGE,
   * saying what to use instead: `bytes`, `dataView` and `read()` / `read(offset)` of more than
   * that.
   *
   * @throws RangeError ERR_OUT_OF_RANGE when `bytes` is not a positive safe integer;
   * TypeError ERR_INVALID_ARG_TYPE when it is no number or bigint.
   * @throws IpcError ERR_OUT_OF_MEMORY when the system cannot map that many bytes (ENOMEM);
   * ERR_FD_LIMIT when no file descriptor is left.
   */
  static allocate(bytes: number | bigint): HostBuffer {
    const size = toSize(bytes, 'HostBuffer.allocate(bytes)');
    let fd: number;
    try {
      fd = addon.memfdCreate('cuda-ipc-host', size, SEALED);
    } catch (e) {
      throw outOfMemoryError(fdLimitError(e, 'HostBuffer.allocate'), 'HostBuffer.allocate', size);
    }
    try {
      return new HostBuffer(new Mapping(new addon.SharedMemory(fd, size), fd, size, true), 0, size);
    } catch (e) {
      addon.close(fd);
      throw outOfMemoryError(e, 'HostBuffer.allocate', size);
    }
  }

  /**
   * Maps `bytes` (default: the whole file) of a shared-memory fd, e.g. one received from another
   * process. Takes ownership of `fd` when it returns; if it throws, the fd is still the caller's.
   * @throws RangeError ERR_OUT_OF_RANGE for more bytes than the file holds (a mapping past its end
   * would fault); TypeError ERR_INVALID_ARG_VALUE for an empty file; IpcError ERR_OUT_OF_MEMORY
   * when the mapping does not fit (ENOMEM); the system error (EBADF, ...) for an fd that is not a
   * mappable file.
   */
  static fromFd(fd: number, bytes?: number | bigint): HostBuffer {
    if (!Number.isInteger(fd) || fd < 0) throw badNumber(fd, `fd must be a non-negative integer; got ${String(fd)}`);
    const fileSize = addon.fstatSize(fd);
    const size = bytes === undefined ? fileSize : toSize(bytes, 'HostBuffer.fromFd(fd, bytes)');
    if (size === 0) throw invalidArgValue(`fd ${fd} refers to an empty file; there is nothing to map`);
    if (size > fileSize) {
      // Touching a mapping past the end of the file raises SIGBUS: refuse up front.
      throw outOfRange(`HostBuffer.fromFd: fd ${fd} holds ${fileSize} bytes, fewer than the ${size} asked for`);
    }
    let seals = 0;
    try {
      seals = addon.getSeals(fd);
    } catch {
      // Not a sealable file (EINVAL): it has no seals.
    }
    let native: NativeSharedMemory;
    try {
      native = new addon.SharedMemory(fd, size);
    } catch (e) {
      throw outOfMemoryError(e, 'HostBuffer.fromFd', size);
    }
    return new HostBuffer(new Mapping(native, fd, size, (seals & F_SEAL_SHRINK) !== 0), 0, size);
  }

  #open(what: string): Mapping {
    const m = this.#mapping;
    if (!m) throw new IpcError('ERR_CLOSED', `HostBuffer.${what}: the buffer is closed; keep it open while you use it`);
    if (m.unmapped) {
      throw new IpcError('ERR_CLOSED', `HostBuffer.${what}: the buffer's memory was unmapped by close({ force: true }) on it or on a buffer sharing it`);
    }
    return m;
  }

  #range(offset: number, length: number, what: string): void {
    checkOffset(offset, `${what}: offset`);
    if (offset + length > this.#length) {
      throw outOfRange(`HostBuffer.${what}: ${length} bytes at offset ${offset} do not fit in a buffer of ${this.#length} bytes`);
    }
  }

  /** The memfd (shared by this buffer and its views). Borrowed: do not close it. */
  get fd(): number {
    return this.#open('fd').fd;
  }
  get byteLength(): number {
    return this.#length;
  }
  /** Where this buffer starts in the shared memory file (0 unless it is a view). */
  get byteOffset(): number {
    return this.#offset;
  }
  /** Virtual address of the first byte in this process. */
  get address(): bigint {
    return this.#open('address').native.address + BigInt(this.#offset);
  }
  /**
   * A zero-copy Uint8Array over the buffer (the same object every time); empty once closed.
   *
   * @throws IpcError ERR_VIEW_TOO_LARGE for a buffer larger than one typed array can be here
   * (`buffer.constants.MAX_LENGTH`: 4 GiB on Node 20): use `view(offset, length).bytes` for a part
   * of it, or `read(dst, offset)` / `write(src, offset)` in pieces. ERR_CLOSED once closed.
   */
  get bytes(): Uint8Array {
    return this.#view(this.#open('bytes'));
  }
  /**
   * A DataView over the buffer (the same object every time, like `bytes`): numbers at byte
   * offsets without a new view per use, e.g. `slot.buffer.dataView.setUint32(0, n, true)`. Once
   * the buffer is closed its memory is detached and the DataView throws a TypeError on use.
   * @throws as `bytes` (ERR_VIEW_TOO_LARGE, ERR_CLOSED).
   */
  get dataView(): DataView {
    const bytes = this.bytes;
    return (this.#dataView ??= new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength));
  }
  /** True once closed, or once its memory was unmapped by a forced close of a buffer sharing it. */
  get closed(): boolean {
    return this.#mapping === undefined || this.#mapping.unmapped;
  }
  /**
   * Leases outstanding on this buffer's memory (shared with its views): sends over links whose
   * receivers have not closed what they got. The memory stays mapped while there are any.
   */
  get leases(): number {
    return this.#shared.leases;
  }

  /**
   * Resolves once the memory is unmapped and its fd closed: after this buffer, its views and every
   * lease on it (see `leases`) let go, or after a forced close. Rejects only when `options` give
   * up the wait: an AbortError on its signal, ERR_TIMEOUT after its timeout.
   */
  released(options?: WaitOptions): Promise<void> {
    return raceWait(this.#shared.released(), options, 'HostBuffer.released');
  }

  /**
   * Copies `src` into the buffer at `offset`.
   * @throws RangeError ERR_OUT_OF_RANGE when it does not fit; TypeError ERR_INVALID_ARG_TYPE for a
   * `src` that is no ArrayBuffer or view; IpcError ERR_CLOSED once closed.
   */
  write(src: ArrayBufferView | ArrayBuffer, offset = 0): void {
    const m = this.#open('write');
    const b = asBytes(src, 'HostBuffer.write(src)');
    this.#range(offset, b.byteLength, 'write');
    // Copied natively: a write never needs the Uint8Array over the whole buffer (see read()).
    m.native.copyIn(this.#offset + offset, b);
  }

  /** Copies bytes from `offset` into `dst` (as many as `dst` holds) and returns `dst`. */
  read<T extends ArrayBufferView>(dst: T, offset?: number): T;
  /** Returns a new Uint8Array holding a copy of `length` bytes at `offset` (default: to the end). */
  read(offset?: number, length?: number): Uint8Array;
  /**
   * Copies out of the buffer, into `dst` or a new Uint8Array.
   * @throws RangeError ERR_OUT_OF_RANGE for a range outside the buffer; IpcError ERR_CLOSED once
   * closed; ERR_VIEW_TOO_LARGE for a new array larger than one typed array can be (read into
   * arrays of your own, in pieces); ERR_OUT_OF_MEMORY when there is no memory for the new array.
   */
  read(a?: ArrayBufferView | number, b?: number): ArrayBufferView {
    // Copied natively, without making `bytes`: an external ArrayBuffer over the mapping costs more
    // than a small read, and a wake-up of the event loop when it is released (Node finalizes it
    // through a thread-safe immediate).
    const m = this.#open('read');
    if (a === undefined || typeof a === 'number') {
      const offset = a ?? 0;
      checkOffset(offset, 'read: offset');
      const length = b ?? this.#length - offset;
      checkOffset(length, 'read: length');
      this.#range(offset, length, 'read');
      checkViewBytes(length, 'HostBuffer.read', 'read into arrays of your own in pieces with read(dst, offset)');
      let out: Uint8Array;
      try {
        out = new Uint8Array(length);
      } catch (e) {
        throw outOfMemoryError(e, 'HostBuffer.read', length);
      }
      if (length > 0) m.native.copyOut(this.#offset + offset, out);
      return out;
    }
    const dst = asBytes(a, 'HostBuffer.read(dst)');
    const offset = b ?? 0;
    this.#range(offset, dst.byteLength, 'read');
    m.native.copyOut(this.#offset + offset, dst);
    return a;
  }

  /** Sets every byte to `byte` (0..255). */
  fill(byte: number): void {
    const m = this.#open('fill');
    if (!Number.isInteger(byte) || byte < 0 || byte > 255) {
      throw badNumber(byte, `HostBuffer.fill(byte): byte must be an integer 0..255; got ${String(byte)}`);
    }
    if (this.#length <= MAX_VIEW_BYTES) {
      this.#view(m).fill(byte);
      return;
    }
    // Larger than one typed array: a piece at a time, each view detached once filled.
    for (let at = 0; at < this.#length; at += FILL_PIECE_BYTES) {
      const piece = m.native.arrayBuffer(this.#offset + at, Math.min(FILL_PIECE_BYTES, this.#length - at));
      new Uint8Array(piece).fill(byte);
      addon.detachArrayBuffer(piece);
    }
  }

  /**
   * A HostBuffer over `length` bytes at `offset` (default: to the end) of this one. Close it too.
   * @throws RangeError ERR_OUT_OF_RANGE for a range outside the buffer; IpcError ERR_CLOSED once
   * closed.
   */
  view(offset: number, length?: number): HostBuffer {
    const m = this.#open('view');
    checkOffset(offset, 'view: offset');
    const len = length ?? this.#length - offset;
    if (!Number.isSafeInteger(len) || len <= 0) {
      throw badNumber(len, `HostBuffer.view: length must be a positive integer; got ${String(len)}`);
    }
    this.#range(offset, len, 'view');
    m.users++;
    try {
      return new HostBuffer(m, this.#offset + offset, len);
    } catch (e) {
      m.release();
      throw e;
    }
  }

  /**
   * Closes this buffer: its `bytes` go dark at once; the memory is unmapped (and the fd closed)
   * once its views and leases let go too. Idempotent.
   *
   * `{ force: true }` unmaps the memory now even while views or leases are outstanding (also on a
   * buffer that was already closed): the views read as closed and the links release their leases
   * later without effect. Peers that received the buffer keep their own mapping of the same
   * memory and can go on using it; what goes away is only this process's view of it.
   */
  close(options?: { force?: boolean }): void {
    const m = this.#mapping;
    if (m) {
      this.#mapping = undefined;
      untrackLeak(this.#leak);
      // Views may keep the mapping; this buffer's own typed arrays must go dark now regardless.
      // (When the memory is unmapped right here, the native close detaches every one of them.)
      const unmapsNow = options?.force || (m.users === 1 && !m.unmapped);
      if (this.#bytes && !unmapsNow) addon.detachArrayBuffer(this.#bytes.buffer as ArrayBuffer);
      if (!options?.force) {
        m.release();
        return;
      }
      m.users--;
    }
    if (options?.force) this.#shared.unmap();
  }

  /** Same as close(), for `using`. */
  [Symbol.dispose](): void {
    this.close();
  }

  static {
    describeHostBuffer = (buffer) => {
      const m = buffer.#open('describe');
      return { mappingLength: m.length, sealed: m.sealed, mapping: m };
    };
    leaseHostBuffer = (buffer) => buffer.#open('lease').lease();
    wholeHostBuffer = (buffer) => {
      const m = buffer.#open('encode');
      m.users++;
      try {
        return new HostBuffer(m, 0, m.length);
      } catch (e) {
        m.release();
        throw e;
      }
    };
    whenHostBufferReleased = (buffer, done) => buffer.#shared.whenReleased(done);
    hostBufferRange = (buffer, offset, length) => {
      const m = buffer.#open('bytes');
      buffer.#range(offset, length, 'bytes');
      checkViewBytes(length, 'HostBuffer.bytes', 'copy it in pieces with read(dst, offset)');
      if (length === 0) return new Uint8Array(0);
      return new Uint8Array(m.native.arrayBuffer(buffer.#offset + offset, length));
    };
  }
}
