// What DeviceArray and HostArray share: a typed view (dtype, shape, byte strides) over a buffer
// the array owns, its layout checked once against the buffer's length (viewLayout). How the
// elements are read and written is each one's own: a copy to or from the device, or the shared
// host mapping itself.
import { viewLayout, type ArrayMeta, type ArrayMetaInit } from '../ipc/array-meta.js';
import type { DType } from '../ipc/dtype.js';

/** What an array is a view over: a DeviceBuffer or a HostBuffer. */
export interface ArrayMemory {
  /** Bytes from the array's first element to the end of the buffer. */
  readonly byteLength: number;
  /** Releases the memory. */
  close(): void;
}

/**
 * A typed view over a buffer: dtype, shape and byte strides, the first element at the buffer's
 * first byte. The array owns the buffer: closing the array closes it. The base of DeviceArray
 * and HostArray.
 */
export abstract class BufferArray<T extends DType, B extends ArrayMemory> implements Disposable {
  /** The bytes of the array, from its first element (the array owns it: closing the array closes it). */
  readonly buffer: B;
  readonly dtype: T;
  readonly shape: readonly number[];
  /** Byte strides. */
  readonly strides: readonly number[];
  /** Number of elements. */
  readonly size: number;
  readonly #contiguous: boolean;
  /** @internal Bytes from the first element to the end of the last. */
  protected readonly viewExtent: number;

  /** A typed view over `buffer`, whose first byte is the first element. */
  constructor(buffer: B, meta: ArrayMetaInit & { dtype: T }) {
    const v = viewLayout(meta, buffer.byteLength);
    this.buffer = buffer;
    this.dtype = meta.dtype;
    this.shape = v.meta.shape;
    this.strides = v.meta.strides;
    this.size = v.size;
    this.#contiguous = v.contiguous;
    this.viewExtent = v.extent;
  }

  /** The dtype, shape and strides. */
  get meta(): ArrayMeta { return { dtype: this.dtype, shape: this.shape, strides: this.strides }; }

  /** Whether the elements are C-contiguous (row-major, no gaps). */
  get contiguous(): boolean { return this.#contiguous; }

  /** Closes the array's buffer. */
  close(): void { this.buffer.close(); }

  /** Same as close(), for `using`. */
  [Symbol.dispose](): void { this.close(); }
}
