// The in-memory and JSON shapes of every descriptor kind. A descriptor is plain data that lets
// another process open something this process exported; `kind` tells the kinds apart.

import type { ArrayMeta } from './array-meta.js';
import type { DType } from './dtype.js';

/** Descriptor format version understood by this release (JSON `version`, binary header). */
export const DESCRIPTOR_VERSION = 1;

/** A legacy CUDA IPC memory handle (cuIpcGetMemHandle): a bearer token for a whole allocation,
 *  plus where the exported bytes lie inside it. The interop path with CuPy, Numba and PyTorch. */
export interface LegacyHandleDescriptor {
  readonly kind: 'cuda-legacy-handle';
  readonly version: 1;
  /** Exactly 64 bytes: the CUipcMemHandle. */
  readonly handle: Uint8Array;
  /** Byte offset of the exported pointer inside its allocation (the handle names the base). */
  readonly offset: number;
  /** Bytes described, starting at `offset`. */
  readonly byteLength: number;
  /** 'GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx', lower-case, as nvidia-smi prints it. */
  readonly deviceUuid: string;
  /** The exporter's process id. */
  readonly pid: number;
  /** What the bytes hold, when known. Its extent never exceeds byteLength. */
  readonly array?: ArrayMeta;
}

/** An interprocess CUDA event (cuIpcGetEventHandle), for ordering GPU work across processes. */
export interface IpcEventDescriptor {
  readonly kind: 'cuda-ipc-event';
  readonly version: 1;
  /** Exactly 64 bytes: the CUipcEventHandle. */
  readonly handle: Uint8Array;
  readonly deviceUuid: string;
  readonly pid: number;
}

/** A descriptor of shared memory or of an interprocess event, as parsed or built. */
export type Descriptor = LegacyHandleDescriptor | IpcEventDescriptor;
/** The `kind` of a descriptor: 'cuda-legacy-handle' or 'cuda-ipc-event'. */
export type DescriptorKind = Descriptor['kind'];
/** The descriptor type of one kind. */
export type DescriptorOf<K extends DescriptorKind> = Extract<Descriptor, { kind: K }>;

/** Array metadata (dtype, shape, strides) in a descriptor's JSON form. */
export interface ArrayMetaJson {
  dtype: DType;
  /** NumPy typestr of dtype, for Python consumers ('<f4'; bfloat16: '<V2'). */
  typestr: string;
  shape: number[];
  /** Byte strides. */
  strides: number[];
}

/** A legacy handle descriptor as JSON (descriptorToJson): the handle in hex, for Python and files. */
export interface LegacyHandleDescriptorJson {
  kind: 'cuda-legacy-handle';
  version: 1;
  /** 128 lower-case hex digits; Python: bytes.fromhex(d['handle']). */
  handle: string;
  offset: number;
  byteLength: number;
  deviceUuid: string;
  pid: number;
  array?: ArrayMetaJson;
}

/** An interprocess event descriptor as JSON. */
export interface IpcEventDescriptorJson {
  kind: 'cuda-ipc-event';
  version: 1;
  handle: string;
  deviceUuid: string;
  pid: number;
}

/** Any descriptor in its JSON form. */
export type DescriptorJson = LegacyHandleDescriptorJson | IpcEventDescriptorJson;
/** The JSON form of one kind of descriptor. */
export type DescriptorJsonOf<K extends DescriptorKind> = Extract<DescriptorJson, { kind: K }>;
