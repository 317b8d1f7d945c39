// The channel's shared words with the atomics done in JS: a drop-in NativeSharedWords.
//
// Every call into the addon costs ~70 ns of N-API overhead, against ~10 ns for a JS `Atomics` op
// on a typed array, and the ring makes several such calls per message. So the atomics here run on
// typed arrays over `bytes`: another mapping of the same memfd (its HostBuffer's), which makes
// them the same words as the native object's, for this process and every peer. The semantics are
// the native ones (native/channel.cc): the same results (32-bit values unsigned; 64-bit values as
// numbers below 2^53, a larger stored value reading -1), the same offset checks and RangeErrors.
//
// The native object stays underneath for what JS cannot do (the bounded spins, which must not
// allocate or call back into JS while they run), and for close().
//
// The mapping under `bytes` belongs to the HostBuffer: when its owner closes it, `bytes` is
// detached and every typed array over it reads as length 0. Checking offsets against the arrays'
// current lengths therefore also catches that (and close(), which swaps in empty arrays), at no
// extra cost on the hot path; the slow path then says which it was.
import type { NativeSharedWords } from '../native/channel-types.js';

const MAX_U53 = 2 ** 53;
const MAX_U53N = 2n ** 53n;
const EBADF = 9;

function closedError(why: string): Error {
  // Shaped like the native EBADF (code, errno, syscall), which callers may test for.
  return Object.assign(new Error(`SharedWords: ${why}`), { code: 'EBADF', errno: EBADF, syscall: 'SharedWords' });
}

// A 64-bit argument: a non-negative integer below 2^53 (as ArgU53 in the addon).
function u53(value: number, what: string): bigint {
  if (!(value >= 0 && value <= MAX_U53 && Math.floor(value) === value)) {
    if (typeof value !== 'number') throw new TypeError(`${what} must be a number`);
    throw new RangeError(`${what} must be an integer in 0..2^53`);
  }
  return BigInt(value);
}

function fromU64(v: bigint): number {
  return v > MAX_U53N ? -1 : Number(v);
}

// A 32-bit argument converts like the addon's Uint32Value (ToUint32); only its type is checked.
function num(value: number, what: string): number {
  if (typeof value !== 'number') throw new TypeError(`${what} must be a number`);
  return value;
}

export class JsWords implements NativeSharedWords {
  /** The native object on the same memfd. */
  readonly native: NativeSharedWords;
  /** Bytes of the native mapping: the bound every offset is checked against. */
  readonly #length: number;
  #u32: Uint32Array;
  #u64: BigUint64Array;
  readonly #n32: number;
  #closed = false;

  /**
   * `bytes` must be a view of the same memfd as `native`, from its start (a HostBuffer's `bytes`),
   * at least native.byteLength long and 8-byte aligned (mappings are page aligned).
   */
  constructor(native: NativeSharedWords, bytes: Uint8Array) {
    const length = native.byteLength;
    if (length === 0) throw closedError('the native shared words are closed');
    if (bytes.byteLength < length) throw new RangeError(`bytes (${bytes.byteLength}) is shorter than the shared words (${length})`);
    if (bytes.byteOffset % 8 !== 0) throw new RangeError('bytes must be 8-byte aligned');
    this.native = native;
    this.#length = length;
    // Each view covers exactly the whole words inside the native mapping, so an index in range is
    // an offset the addon would accept.
    this.#n32 = Math.floor(length / 4);
    this.#u32 = new Uint32Array(bytes.buffer, bytes.byteOffset, this.#n32);
    this.#u64 = new BigUint64Array(bytes.buffer, bytes.byteOffset, Math.floor(length / 8));
  }

  // Index of the 32-bit word at `offset`. Fast path: an aligned integer offset below 2^32 inside
  // the array (`>>> 0` rejects fractions, negatives, NaN and non-numbers).
  #at32(offset: number): number {
    if ((offset >>> 0) === offset && (offset & 3) === 0 && offset >>> 2 < this.#u32.length) return offset >>> 2;
    return this.#slowIndex(offset, 4, this.#u32.length);
  }

  #at64(offset: number): number {
    if ((offset >>> 0) === offset && (offset & 7) === 0 && offset >>> 3 < this.#u64.length) return offset >>> 3;
    return this.#slowIndex(offset, 8, this.#u64.length);
  }

  // Throws what the addon would (in its order: closed, type, bounds, alignment), or returns the
  // index of a valid offset the fast path does not take (2^32 and above).
  #slowIndex(offset: number, size: number, n: number): number {
    if (this.#closed) throw closedError('the shared words are closed');
    if (this.#u32.length !== this.#n32) throw closedError("the shared words' memory was unmapped: the HostBuffer over it was closed");
    if (typeof offset !== 'number') throw new TypeError('offset must be a number');
    if (!(offset >= 0) || Math.floor(offset) !== offset || offset + size > this.#length) throw new RangeError('offset outside the shared words');
    if (offset % size !== 0) throw new RangeError('offset is not aligned to the word size');
    const i = offset / size;
    if (i >= n) throw new RangeError('offset outside the shared words');  // unreachable: the views cover the mapping
    return i;
  }

  load32(offset: number): number {
    return Atomics.load(this.#u32, this.#at32(offset));
  }

  store32(offset: number, value: number): void {
    Atomics.store(this.#u32, this.#at32(offset), num(value, 'value'));
  }

  cas32(offset: number, expected: number, desired: number): number {
    const i = this.#at32(offset);
    return Atomics.compareExchange(this.#u32, i, num(expected, 'expected'), num(desired, 'desired'));
  }

  add32(offset: number, delta: number): number {
    // Atomics.add on a Uint32Array wraps modulo 2^32, as the addon's fetch_add of (uint32)delta.
    return Atomics.add(this.#u32, this.#at32(offset), num(delta, 'delta'));
  }

  and32(offset: number, mask: number): number {
    return Atomics.and(this.#u32, this.#at32(offset), num(mask, 'mask'));
  }

  or32(offset: number, mask: number): number {
    return Atomics.or(this.#u32, this.#at32(offset), num(mask, 'mask'));
  }

  load64(offset: number): number {
    return fromU64(Atomics.load(this.#u64, this.#at64(offset)));
  }

  store64(offset: number, value: number): void {
    Atomics.store(this.#u64, this.#at64(offset), u53(value, 'value'));
  }

  cas64(offset: number, expected: number, desired: number): number {
    const i = this.#at64(offset);
    return fromU64(Atomics.compareExchange(this.#u64, i, u53(expected, 'expected'), u53(desired, 'desired')));
  }

  add64(offset: number, delta: number): number {
    // Wraps modulo 2^64 like the addon; a result past 2^53 reads -1.
    return fromU64(Atomics.add(this.#u64, this.#at64(offset), u53(delta, 'delta')));
  }

  claimFirst32(offset: number, stride: number, count: number, start: number, mask: number, expect: number, desired: number): number {
    const first = this.#at32(offset);
    num(stride, 'stride');
    num(count, 'count');
    num(start, 'start');
    const m = num(mask, 'mask') >>> 0;
    const e = num(expect, 'expect') >>> 0;
    const d = num(desired, 'desired') >>> 0;
    if (!(stride >= 4) || stride > 1 << 24 || stride % 4 !== 0 || Math.floor(stride) !== stride) throw new RangeError('stride must be a positive multiple of 4');
    if (!(count >= 1) || count > 1 << 20 || Math.floor(count) !== count) throw new RangeError('count out of range');
    if (!(start >= 0) || Math.floor(start) !== start) throw new RangeError('start must be a non-negative integer');
    if (offset + (count - 1) * stride + 4 > this.#length) throw new RangeError('words outside the shared words');
    const a = this.#u32;
    const step = stride / 4;
    const s = start % count;
    for (let k = 0; k < count; k++) {
      let idx = s + k;
      if (idx >= count) idx -= count;
      const j = first + idx * step;
      const v = Atomics.load(a, j);
      if (((v & m) >>> 0) !== e) continue;
      if (Atomics.compareExchange(a, j, v, d) === v) return idx;
    }
    return -1;
  }

  spinWait32(offset: number, expected: number, micros: number): boolean {
    // The addon returns at once when the word already differs: so can we, without the call.
    if (typeof expected === 'number' && Atomics.load(this.#u32, this.#at32(offset)) !== expected >>> 0) return true;
    return this.native.spinWait32(offset, expected, micros);
  }

  spinCas32(offset: number, expected: number, desired: number, micros: number): boolean {
    // Uncontended, the first try succeeds: only a lock that is taken needs the native spin.
    const i = this.#at32(offset);
    const e = num(expected, 'expected') >>> 0;
    if (Atomics.compareExchange(this.#u32, i, e, num(desired, 'desired')) === e) return true;
    return this.native.spinCas32(offset, expected, desired, micros);
  }

  /** Closes the native object too; every later operation throws (EBADF, as the addon's). */
  close(): void {
    this.#closed = true;
    // Empty views: the fast path's bounds checks then fail, and the slow path says why.
    this.#u32 = new Uint32Array(0);
    this.#u64 = new BigUint64Array(0);
    this.native.close();
  }

  get byteLength(): number {
    return this.native.byteLength;
  }

  get address(): bigint {
    return this.native.address;
  }
}
