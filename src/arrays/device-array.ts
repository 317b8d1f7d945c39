// Typed views over shared device memory (parity with Numba's open_ipc_array): dtype, shape and
// byte strides over a DeviceBuffer, with host reads and writes in C order.
import { DeviceBuffer } from '../cuda/buffer.js';
import { Device } from '../cuda/device.js';
import { IpcError } from '../errors.js';
import { dtypeInfo, type DType, type HostArrayTypes } from '../ipc/dtype.js';
import { bytesToWrite, elementCount, forEachOffset, newHostArray } from '../ipc/array-meta.js';
import { BufferArray } from './buffer-array.js';
import { openIpcHandle, toLegacyDescriptor } from '../ipc/legacy.js';
import type { LegacyHandleDescriptor } from '../ipc/descriptor.js';

/**
 * A typed view of device memory: dtype, shape and strides over a DeviceBuffer; `read()`/`write()`
 * copy to and from typed arrays, `ipcHandle()` describes it for other processes (openIpcArray,
 * Python).
 */
export class DeviceArray<T extends DType = DType> extends BufferArray<T, DeviceBuffer> {
  /** A new C-contiguous array on the device (default device 0). */
  static allocate<T extends DType>(dtype: T, shape: readonly number[], options: { device?: Device } = {}): DeviceArray<T> {
    const bytes = elementCount(shape) * dtypeInfo(dtype).itemsize;
    return new DeviceArray(DeviceBuffer.allocate(Math.max(bytes, 1), options), { dtype, shape });
  }

  /** All elements in C (row-major) order, copied to the host. float16/bfloat16 come as raw bits. */
  read(): HostArrayTypes[T] {
    const info = dtypeInfo(this.dtype);
    const out = newHostArray(info.hostArray, this.size, info.itemsize, 'DeviceArray.read()');
    if (this.size === 0) return out;
    if (this.contiguous) {
      this.buffer.read(out as ArrayBufferView, 0);
      return out;
    }
    const span = newHostArray(Uint8Array, this.viewExtent, 1, 'DeviceArray.read()');
    this.buffer.read(span, 0);
    const dst = new Uint8Array((out as ArrayBufferView).buffer);
    forEachOffset(this.shape, this.strides, (src, i) => dst.set(span.subarray(src, src + info.itemsize), i * info.itemsize));
    return out;
  }

  /**
   * Writes all elements from `values` in C order. For a strided array the bytes between elements
   * are read and written back unchanged (so do not write them concurrently from elsewhere).
   */
  write(values: HostArrayTypes[T]): void {
    const bytes = bytesToWrite(values, this.meta, this.size);
    if (this.size === 0) return;
    if (this.contiguous) {
      this.buffer.write(bytes, 0);
      return;
    }
    const itemsize = dtypeInfo(this.dtype).itemsize;
    const span = newHostArray(Uint8Array, this.viewExtent, 1, 'DeviceArray.write()');
    this.buffer.read(span, 0);
    forEachOffset(this.shape, this.strides, (dst, i) => span.set(bytes.subarray(i * itemsize, (i + 1) * itemsize), dst));
    this.buffer.write(span, 0);
  }

  /** A descriptor carrying this array's dtype, shape and strides. */
  ipcHandle(): LegacyHandleDescriptor {
    return this.buffer.ipcHandle({ array: this.meta });
  }
}

/** Opens a descriptor that carries array metadata as a typed array (Numba's open_ipc_array). */
export function openIpcArray(input: LegacyHandleDescriptor | string | Uint8Array): DeviceArray {
  const desc = toLegacyDescriptor(input);
  if (!desc.array) {
    throw new IpcError('ERR_DESCRIPTOR_INVALID',
      'this descriptor has no array metadata (dtype, shape); open it with openIpcHandle, or export it with { array: { dtype, shape } }');
  }
  const buffer = openIpcHandle(desc);
  try {
    return new DeviceArray(buffer, desc.array);
  } catch (e) {
    buffer.close();
    throw e;
  }
}
