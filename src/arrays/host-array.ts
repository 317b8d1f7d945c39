// Typed views over shared host memory: the host twin of DeviceArray (dtype, shape, byte strides
// over a HostBuffer), so that the tensor machinery (sets over links, in-place updates,
// safetensors) runs on machines without a GPU and with the same code paths.
import { IpcError, checkViewBytes } from '../errors.js';
import { HostBuffer } from '../host/host-buffer.js';
import { bytesToWrite, elementCount, forEachOffset, newHostArray } from '../ipc/array-meta.js';
import { BufferArray } from './buffer-array.js';
import { dtypeInfo, type DType, type HostArrayTypes } from '../ipc/dtype.js';

/** A typed view (dtype, shape, byte strides) over shared host memory: DeviceArray's host twin. */
export class HostArray<T extends DType = DType> extends BufferArray<T, HostBuffer> {
  /** A new zeroed C-contiguous array in its own shared memory (a memfd). */
  static allocate<T extends DType>(dtype: T, shape: readonly number[]): HostArray<T> {
    const bytes = elementCount(shape) * dtypeInfo(dtype).itemsize;
    return new HostArray(HostBuffer.allocate(Math.max(bytes, 1)), { dtype, shape });
  }

  /** Bytes from the first element to the end of the last. */
  get extent(): number { return this.viewExtent; }

  /**
   * A zero-copy typed array over the elements (raw bits for float16/bfloat16/float8): for
   * C-contiguous arrays whose first element is aligned to its size (always so for arrays made
   * here or received in tensor sets). Writes through it change the shared memory.
   */
  values(): HostArrayTypes[T] {
    const info = dtypeInfo(this.dtype);
    if (!this.contiguous) throw new IpcError('ERR_INVALID_STATE', `values() needs a C-contiguous array; this one has strides [${this.strides}]: use read()`);
    checkViewBytes(this.buffer.byteLength, 'HostArray.values()', 'make arrays over parts of it: new HostArray(buffer.view(offset, length), { dtype, shape })');
    const bytes = this.buffer.bytes;
    if (bytes.byteOffset % info.itemsize !== 0) throw new IpcError('ERR_INVALID_STATE', `the array starts at byte ${bytes.byteOffset}, not aligned to its ${info.itemsize}-byte elements: use read()`);
    return new info.hostArray(bytes.buffer as ArrayBuffer, bytes.byteOffset, this.size) as HostArrayTypes[T];
  }

  /** All elements in C (row-major) order, copied. */
  read(): HostArrayTypes[T] {
    const info = dtypeInfo(this.dtype);
    const out = newHostArray(info.hostArray, this.size, info.itemsize, 'HostArray.read()');
    const dst = new Uint8Array((out as ArrayBufferView).buffer);
    if (this.contiguous) {
      this.buffer.read(dst, 0);
      return out;
    }
    const src = this.buffer.bytes;
    forEachOffset(this.shape, this.strides, (at, i) => dst.set(src.subarray(at, at + info.itemsize), i * info.itemsize));
    return out;
  }

  /** Writes all elements from `values` in C order. */
  write(values: HostArrayTypes[T]): void {
    const bytes = bytesToWrite(values, this.meta, this.size);
    if (this.contiguous) {
      this.buffer.write(bytes, 0);
      return;
    }
    const itemsize = dtypeInfo(this.dtype).itemsize;
    const dst = this.buffer.bytes;
    forEachOffset(this.shape, this.strides, (at, i) => dst.set(bytes.subarray(i * itemsize, (i + 1) * itemsize), at));
  }
}
