// PyTorch's CUDA IPC handle format, both ways. `tensor.untyped_storage()._share_cuda_()` (what
// torch.multiprocessing sends) returns (device, handle, storage size bytes, storage offset bytes,
// ref counter handle, ref counter offset, event handle, event_sync_required), where `handle` is 66
// bytes: a version byte (2 up to torch 2.12, 3 from 2.13, same payload), a type byte 'c' (a
// cudaMalloc block; 'e' = an expandable segment, which legacy handles cannot open), then the
// 64-byte cudaIpcMemHandle of the caching allocator's *block*. The storage lies `storage offset
// bytes` into that block, so a cuda-ipc descriptor's offset is that plus any offset of the tensor
// inside its storage (`tensor.storage_offset() * tensor.element_size()`).
import { IpcError } from '../errors.js';
import type { ArrayMetaInit } from './array-meta.js';
import { legacyHandleDescriptor, validateDescriptor, type LegacyHandleDescriptor } from './descriptor.js';
import { hexToBytes } from './hex.js';

export const TORCH_HANDLE_BYTES = 66;
/** The version byte written by torchHandleOf(): what torch <= 2.12 writes and every version reads. */
export const TORCH_HANDLE_VERSION = 2;
const TYPE_CUDA_MALLOC = 0x63; // 'c'
const TYPE_EXPANDABLE = 0x65; // 'e'

/** What `_share_cuda_()` says about a storage: its elements [1], [2] and [3]. */
export interface TorchCudaHandle {
  /** The 66-byte handle ([1]), as bytes or as Python's `.hex()` (132 digits). */
  readonly handle: Uint8Array | string;
  /** Element 2: bytes in the storage. */
  readonly storageSizeBytes: number;
  /** Element 3: where the storage starts in the caching allocator's block. */
  readonly storageOffsetBytes: number;
}

/** Where a PyTorch handle came from: the device (by UUID) and the exporting process. */
export interface FromTorchOptions {
  /** The device's UUID (`'GPU-' + str(torch.cuda.get_device_properties(i).uuid)`), not its ordinal. */
  readonly deviceUuid: string;
  /** The exporting process. */
  readonly pid: number;
  /** Where the data starts inside the storage: `tensor.storage_offset() * tensor.element_size()`. */
  readonly byteOffset?: number;
  /** Bytes described (default: the rest of the storage). */
  readonly byteLength?: number;
  readonly array?: ArrayMetaInit;
}

function bad(why: string): IpcError {
  return new IpcError('ERR_DESCRIPTOR_INVALID', `torch handle: ${why}`);
}

/** The 64-byte cudaIpcMemHandle inside PyTorch's 66-byte handle (checked). */
export function cudaHandleFromTorch(handle: Uint8Array | string): Uint8Array {
  const h = typeof handle === 'string'
    ? hexToBytes(handle, TORCH_HANDLE_BYTES, { code: 'ERR_DESCRIPTOR_INVALID', path: 'torch handle' })
    : handle;
  if (!(h instanceof Uint8Array) || h.byteLength !== TORCH_HANDLE_BYTES) {
    throw bad(`must be ${TORCH_HANDLE_BYTES} bytes (a version byte, the type byte 'c', the 64-byte cudaIpcMemHandle), got ${h instanceof Uint8Array ? h.byteLength : typeof h}`);
  }
  if (h[1] === TYPE_EXPANDABLE) {
    throw new IpcError('ERR_NOT_EXPORTABLE',
      'this PyTorch handle is of an expandable segment (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True), which CUDA legacy IPC handles ' +
      'cannot open; allocate the tensor with expandable_segments:False');
  }
  if (h[1] !== TYPE_CUDA_MALLOC || (h[0] !== 2 && h[0] !== 3)) {
    throw bad(`unknown handle (version ${h[0]}, type ${h[1]}); expected version 2 or 3 and type 'c'`);
  }
  return h.slice(2);
}

/**
 * A cuda-ipc descriptor for memory PyTorch shared with `_share_cuda_()`, for openIpcHandle() /
 * openIpcArray(). The storage offset is added (the handle names the caching allocator's block).
 * PyTorch keeps the block in its IPC limbo until a torch consumer releases it: the exporter should
 * keep the tensor alive while Node uses it and then release torch's ref counter itself.
 */
export function legacyHandleFromTorch(torch: TorchCudaHandle, options: FromTorchOptions): LegacyHandleDescriptor {
  const handle = cudaHandleFromTorch(torch.handle);
  const size = torch.storageSizeBytes;
  const start = torch.storageOffsetBytes;
  const byteOffset = options.byteOffset ?? 0;
  if (!Number.isSafeInteger(size) || size < 0 || !Number.isSafeInteger(start) || start < 0) {
    throw bad(`storageSizeBytes and storageOffsetBytes must be non-negative integers, got ${size} and ${start}`);
  }
  if (!Number.isSafeInteger(byteOffset) || byteOffset < 0 || byteOffset > size) {
    throw new IpcError('ERR_OUT_OF_RANGE', `byteOffset ${byteOffset} lies outside the ${size}-byte storage`);
  }
  const byteLength = options.byteLength ?? size - byteOffset;
  if (!Number.isSafeInteger(byteLength) || byteLength < 0 || byteOffset + byteLength > size) {
    throw new IpcError('ERR_OUT_OF_RANGE', `${byteLength} bytes at ${byteOffset} run past the ${size}-byte storage`);
  }
  return legacyHandleDescriptor({
    handle, offset: start + byteOffset, byteLength, deviceUuid: options.deviceUuid, pid: options.pid,
    ...(options.array ? { array: options.array } : {}),
  });
}

/**
 * PyTorch's form of a legacy-handle descriptor, for
 * `torch.UntypedStorage._new_shared_cuda(device, bytes(handle), storageSizeBytes,
 * storageOffsetBytes, b'', 0, bytes(64), False)` in Python: a storage of exactly the described
 * bytes. There is no torch ref counter or event behind it: the exporter keeps the memory alive.
 */
export function torchHandleOf(desc: LegacyHandleDescriptor): { handle: Uint8Array; storageSizeBytes: number; storageOffsetBytes: number } {
  const d = validateDescriptor(desc, 'cuda-legacy-handle');
  const handle = new Uint8Array(TORCH_HANDLE_BYTES);
  handle[0] = TORCH_HANDLE_VERSION;
  handle[1] = TYPE_CUDA_MALLOC;
  handle.set(d.handle, 2);
  return { handle, storageSizeBytes: d.byteLength, storageOffsetBytes: d.offset };
}
