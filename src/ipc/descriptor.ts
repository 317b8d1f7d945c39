/**
 * Descriptors: what one process sends another so it can open exported GPU memory or an event.
 * Two forms: JSON (for humans and Python) and a compact binary form (for links and channels).
 * Both are parsed strictly, as untrusted input: anything malformed fails with an IpcError whose
 * code is ERR_DESCRIPTOR_INVALID (bad field, naming it), ERR_DESCRIPTOR_VERSION (a version
 * this release does not know) or ERR_DESCRIPTOR_KIND (a kind it does not know, or not the
 * kind the caller asked for); never with another exception, a hang or a large allocation.
 *
 * ## Binary layout, version 1 (all integers little-endian; reserved bytes must be zero)
 *
 * Common header, 16 bytes:
 *
 * | offset | size | field                                                            |
 * | -----: | ---: | ---------------------------------------------------------------- |
 * |      0 |    4 | magic 'CIPC' (43 49 50 43)                                       |
 * |      4 |    2 | u16 format version = 1                                           |
 * |      6 |    2 | u16 type tag: 1 legacy memory handle, 2 IPC event; 3 (pool pointer) |
 * |        |      | and 4 (host buffer) are reserved for later kinds                 |
 * |      8 |    4 | u32 total length in bytes, header included; must equal the input |
 * |     12 |    4 | reserved, zero                                                   |
 *
 * Type 1, 'cuda-legacy-handle' (128 + 16*ndim bytes in all):
 *
 * | offset | size    | field                                                          |
 * | -----: | ------: | -------------------------------------------------------------- |
 * |     16 |      64 | CUipcMemHandle                                                 |
 * |     80 |      16 | device UUID, raw CUuuid bytes                                  |
 * |     96 |       8 | u64 offset of the pointer inside its allocation (<= 2^53-1)    |
 * |    104 |       8 | u64 byteLength (offset + byteLength <= 2^53-1)                 |
 * |    112 |       4 | u32 pid (1..2^31-1)                                            |
 * |    116 |       4 | reserved, zero                                                 |
 * |    120 |       1 | u8 dtype code, 0 = no array metadata (codes: dtype.ts wireCode)|
 * |    121 |       1 | u8 ndim, 0..32 (0 when dtype code is 0)                        |
 * |    122 |       6 | reserved, zero                                                 |
 * |    128 |  8*ndim | u64 shape[ndim]                                                |
 * | 128+8n |  8*ndim | i64 strides[ndim] in bytes (must be >= 0, multiples of itemsize)|
 *
 * Type 2, 'cuda-ipc-event' (104 bytes in all):
 *
 * | offset | size | field                         |
 * | -----: | ---: | ----------------------------- |
 * |     16 |   64 | CUipcEventHandle              |
 * |     80 |   16 | device UUID, raw CUuuid bytes |
 * |     96 |    4 | u32 pid (1..2^31-1)           |
 * |    100 |    4 | reserved, zero                |
 *
 * Decoding checks, in order: magic, version (ERR_DESCRIPTOR_VERSION), type tag
 * (ERR_DESCRIPTOR_KIND), total length against the input, then every field. Encoding is
 * canonical: decode(bytes) succeeds only when encode(decode(bytes)) equals bytes.
 *
 * ## JSON form
 *
 * `{"kind":"cuda-legacy-handle","version":1,"handle":"<128 hex>","offset":0,"byteLength":24,
 *   "deviceUuid":"GPU-...","pid":1234,"array":{"dtype":"float32","typestr":"<f4","shape":[2,3],
 *   "strides":[12,4]}}`. Unknown keys are rejected (new fields come with a version bump). On input,
 * `array.strides` may be left out (C-contiguous) and so may `array.typestr`; when present it must
 * match dtype. Hex and UUIDs are lower-case.
 *
 * ## Opening a JSON descriptor from Python (`d = json.loads(text)`, `a = d['array']`)
 *
 * Select the device whose UUID is `d['deviceUuid']` first (ordinals differ between processes):
 * Numba: `next(g for g in cuda.gpus if g.uuid == d['deviceUuid'])`; CuPy:
 * `'GPU-' + str(uuid.UUID(bytes=cupy.cuda.runtime.getDeviceProperties(i)['uuid']))`.
 *
 * Numba (closes the handle when the block ends):
 * ```python
 * with cuda.open_ipc_array(bytes.fromhex(d['handle']), shape=tuple(a['shape']),
 *                          dtype=np.dtype(a['typestr']), strides=tuple(a['strides']),
 *                          offset=d['offset']) as arr:
 *     ...
 * ```
 * CuPy (close with `cupy.cuda.runtime.ipcCloseMemHandle(base)` after the last use of `arr`):
 * ```python
 * base = cupy.cuda.runtime.ipcOpenMemHandle(bytes.fromhex(d['handle']))
 * mem = cupy.cuda.UnownedMemory(base + d['offset'], d['byteLength'], owner=None)
 * arr = cupy.ndarray(tuple(a['shape']), dtype=np.dtype(a['typestr']),
 *                    memptr=cupy.cuda.MemoryPointer(mem, 0), strides=tuple(a['strides']))
 * ```
 * PyTorch: `torch.as_tensor(arr, device='cuda')` on the CuPy array shares the memory.
 * bfloat16 ('<V2') is not a NumPy/Numba/CuPy type: open it as dtype '<u2' and, in PyTorch,
 * `.view(torch.bfloat16)`.
 *
 * Events: `ev = cupy.cuda.runtime.ipcOpenEventHandle(bytes.fromhex(d['handle']))`, then
 * `cupy.cuda.runtime.streamWaitEvent(stream.ptr, ev)`.
 */

import { IpcError } from '../errors.js';
import { at, checkIntInRange, checkPlainObject, describe, fail, type Field } from './checks.js';
import type { ArrayMetaInit } from './array-meta.js';
import {
  DESCRIPTOR_VERSION,
  type Descriptor,
  type DescriptorJsonOf,
  type DescriptorKind,
  type DescriptorOf,
  type IpcEventDescriptor,
  type LegacyHandleDescriptor,
} from './descriptor-types.js';
import type { KindCodec } from './kinds/codec.js';
import { ipcEventCodec } from './kinds/ipc-event.js';
import { legacyHandleCodec } from './kinds/legacy-handle.js';
import { WireReader, WireWriter } from './wire.js';

export * from './descriptor-types.js';

/** The 4 ASCII bytes that open every binary descriptor. */
export const DESCRIPTOR_MAGIC = 'CIPC';
const MAGIC_BYTES = new TextEncoder().encode(DESCRIPTOR_MAGIC);
export const DESCRIPTOR_HEADER_BYTES = 16;
/** JSON text longer than this is rejected before parsing; real descriptors are under 2 KiB. */
export const MAX_DESCRIPTOR_JSON_CHARS = 64 * 1024;

/** The IpcError codes descriptor parsing can throw. */
export const DESCRIPTOR_ERROR_CODES = Object.freeze([
  'ERR_DESCRIPTOR_INVALID',
  'ERR_DESCRIPTOR_VERSION',
  'ERR_DESCRIPTOR_KIND',
] as const);

// Adding a kind (pool pointer, host buffer): its interfaces and JSON shape in
// descriptor-types.ts (joined to the Descriptor unions), a codec in kinds/ with an unused type
// tag, and a row here. The mapped type makes a missing row a compile error.
const CODECS: { readonly [K in DescriptorKind]: KindCodec<K> } = {
  'cuda-legacy-handle': legacyHandleCodec,
  'cuda-ipc-event': ipcEventCodec,
};
const KINDS = Object.keys(CODECS) as DescriptorKind[];
const CODEC_BY_TAG: ReadonlyMap<number, KindCodec<DescriptorKind>> = new Map(
  KINDS.map((kind) => [CODECS[kind].typeTag, CODECS[kind] as KindCodec<DescriptorKind>]),
);

const ROOT: Field = { code: 'ERR_DESCRIPTOR_INVALID', path: 'descriptor' };

export type LegacyHandleDescriptorInit = Omit<LegacyHandleDescriptor, 'kind' | 'version' | 'array'> & {
  readonly array?: ArrayMetaInit;
};
export type IpcEventDescriptorInit = Omit<IpcEventDescriptor, 'kind' | 'version'>;

/** Builds a checked legacy-handle descriptor (strides default to C-contiguous). The handle is
 *  copied. Throws ERR_DESCRIPTOR_INVALID naming the bad field. */
export function legacyHandleDescriptor(init: LegacyHandleDescriptorInit): LegacyHandleDescriptor {
  return validateDescriptor({ ...init, kind: 'cuda-legacy-handle', version: DESCRIPTOR_VERSION }, 'cuda-legacy-handle');
}

/** Builds a checked IPC event descriptor. The handle is copied. */
export function ipcEventDescriptor(init: IpcEventDescriptorInit): IpcEventDescriptor {
  return validateDescriptor({ ...init, kind: 'cuda-ipc-event', version: DESCRIPTOR_VERSION }, 'cuda-ipc-event');
}

/** Any kind of descriptor. */
export function validateDescriptor(value: unknown): Descriptor;
/** Only a descriptor of `expectedKind` (ERR_DESCRIPTOR_KIND otherwise), typed as that kind. */
export function validateDescriptor<K extends DescriptorKind>(value: unknown, expectedKind: K): DescriptorOf<K>;
/**
 * Checks an in-memory descriptor (handles as Uint8Array) and returns a normalised copy that
 * shares no buffers with `value`. Fields this version does not know are dropped. With
 * `expectedKind`, any other kind fails with ERR_DESCRIPTOR_KIND.
 *
 * @throws IpcError ERR_DESCRIPTOR_INVALID naming the field that is wrong, ERR_DESCRIPTOR_VERSION,
 * ERR_DESCRIPTOR_KIND.
 */
export function validateDescriptor(value: unknown, expectedKind?: DescriptorKind): Descriptor {
  if (typeof value !== 'object' || value === null || Array.isArray(value)) {
    fail(ROOT, `must be a descriptor object, got ${describe(value)}`);
  }
  const obj = value as Record<string, unknown>;
  const codec = codecForKind(obj.kind, expectedKind);
  checkVersion(obj.version);
  return codec.check(obj, ROOT);
}

/** The JSON form: a plain object for JSON.stringify that Python can use directly (see the
 *  module comment). Validates first. */
export function descriptorToJson<D extends Descriptor>(desc: D): DescriptorJsonOf<D['kind']> {
  const checked = validateDescriptor(desc);
  return (CODECS[checked.kind] as KindCodec<DescriptorKind>).toJson(checked) as DescriptorJsonOf<D['kind']>;
}

/** Any kind of descriptor. */
export function parseDescriptorJson(input: unknown): Descriptor;
/** Only a descriptor of `expectedKind` (ERR_DESCRIPTOR_KIND otherwise), typed as that kind. */
export function parseDescriptorJson<K extends DescriptorKind>(input: unknown, expectedKind: K): DescriptorOf<K>;
/**
 * Parses a JSON descriptor, given as text or as an already parsed value, strictly: unknown or
 * missing keys, wrong types, out-of-range numbers, bad hex or UUIDs and inconsistent array
 * metadata all fail with an IpcError (codes above). With `expectedKind`, any other kind fails
 * with ERR_DESCRIPTOR_KIND.
 *
 * @throws IpcError ERR_DESCRIPTOR_INVALID naming the field that is wrong, ERR_DESCRIPTOR_VERSION,
 * ERR_DESCRIPTOR_KIND.
 */
export function parseDescriptorJson(input: unknown, expectedKind?: DescriptorKind): Descriptor {
  let value = input;
  if (typeof input === 'string') {
    if (input.length > MAX_DESCRIPTOR_JSON_CHARS) {
      fail(ROOT, `JSON text is ${input.length} characters; descriptors are at most ${MAX_DESCRIPTOR_JSON_CHARS}`);
    }
    try {
      value = JSON.parse(input);
    } catch (cause) {
      throw new IpcError('ERR_DESCRIPTOR_INVALID', `descriptor is not valid JSON: ${(cause as Error).message}`, { cause });
    }
  }
  const obj = checkPlainObject(value, ROOT);
  const codec = codecForKind(obj.kind, expectedKind);
  checkVersion(obj.version);
  return codec.fromJson(obj, ROOT);
}

/** The binary form (layout in the module comment). Validates first. */
export function encodeDescriptor(desc: Descriptor): Uint8Array {
  return encodeCheckedDescriptor(validateDescriptor(desc));
}

/**
 * @internal The binary form of a descriptor that is valid by construction (validateDescriptor's
 * output, or built by this package from the driver's own values): no second validation, which
 * would cost more than the rest of a link send.
 */
export function encodeCheckedDescriptor(checked: Descriptor): Uint8Array {
  const codec = CODECS[checked.kind] as KindCodec<DescriptorKind>;
  const length = DESCRIPTOR_HEADER_BYTES + codec.bodyLength(checked);
  const out = new WireWriter(length);
  out.raw(MAGIC_BYTES);
  out.u16(DESCRIPTOR_VERSION);
  out.u16(codec.typeTag);
  out.u32(length);
  out.skip(4);
  codec.encodeBody(checked, out);
  return out.finish();
}

/** Any kind of descriptor. */
export function decodeDescriptor(bytes: Uint8Array): Descriptor;
/** Only a descriptor of `expectedKind` (ERR_DESCRIPTOR_KIND otherwise), typed as that kind. */
export function decodeDescriptor<K extends DescriptorKind>(bytes: Uint8Array, expectedKind: K): DescriptorOf<K>;
/**
 * Decodes a binary descriptor; the whole input must be exactly one descriptor. The result
 * shares no memory with `bytes`. With `expectedKind`, any other kind fails with
 * ERR_DESCRIPTOR_KIND.
 *
 * @throws IpcError ERR_DESCRIPTOR_INVALID (truncated, trailing bytes, a field out of range),
 * ERR_DESCRIPTOR_VERSION, ERR_DESCRIPTOR_KIND.
 */
export function decodeDescriptor(bytes: Uint8Array, expectedKind?: DescriptorKind): Descriptor {
  if (!(bytes instanceof Uint8Array)) fail(ROOT, `must be a Uint8Array, got ${describe(bytes)}`);
  if (bytes.byteLength < DESCRIPTOR_HEADER_BYTES) {
    fail(ROOT, `is ${bytes.byteLength} bytes, shorter than the ${DESCRIPTOR_HEADER_BYTES}-byte header`);
  }
  for (let i = 0; i < MAGIC_BYTES.length; i++) {
    if (bytes[i] !== MAGIC_BYTES[i]) {
      fail(at(ROOT, 'magic'), "is not 'CIPC': these bytes are not a cuda-ipc binary descriptor");
    }
  }
  const input = new WireReader(bytes, 'descriptor');
  input.u32('magic'); // checked above, byte by byte
  const version = input.u16('version');
  if (version !== DESCRIPTOR_VERSION) throw versionError(version);
  const tag = input.u16('type');
  const codec = CODEC_BY_TAG.get(tag);
  if (codec === undefined) {
    throw new IpcError(
      'ERR_DESCRIPTOR_KIND',
      `descriptor type tag ${tag} is not one this version of cuda-ipc understands (known: ${KINDS.map((k) => `${CODECS[k].typeTag} ${k}`).join(', ')}); upgrade the receiver`,
    );
  }
  if (expectedKind !== undefined && codec.kind !== expectedKind) throw kindMismatch(codec.kind, expectedKind);
  const length = input.u32('length');
  if (length !== bytes.byteLength) {
    fail(at(ROOT, 'length'), `says ${length} bytes but the input is ${bytes.byteLength}; it was cut off, padded or mis-framed`);
  }
  input.zeros(4, 'reserved');
  const desc = codec.decodeBody(input);
  input.end();
  return desc;
}

function codecForKind(kind: unknown, expectedKind: DescriptorKind | undefined): KindCodec<DescriptorKind> {
  if (typeof kind !== 'string') fail(at(ROOT, 'kind'), `must be a string naming the descriptor kind, got ${describe(kind)}`);
  if (!Object.prototype.hasOwnProperty.call(CODECS, kind)) {
    throw new IpcError(
      'ERR_DESCRIPTOR_KIND',
      `descriptor.kind ${describe(kind)} is not one this version of cuda-ipc understands (${KINDS.join(', ')}); upgrade the receiver`,
    );
  }
  if (expectedKind !== undefined && kind !== expectedKind) throw kindMismatch(kind, expectedKind);
  return CODECS[kind as DescriptorKind] as KindCodec<DescriptorKind>;
}

function checkVersion(version: unknown): void {
  const v = checkIntInRange(version, 0, Number.MAX_SAFE_INTEGER, at(ROOT, 'version'));
  if (v !== DESCRIPTOR_VERSION) throw versionError(v);
}

function versionError(version: number): IpcError {
  return new IpcError(
    'ERR_DESCRIPTOR_VERSION',
    `descriptor version ${version} is not supported; this version of cuda-ipc reads version ${DESCRIPTOR_VERSION}: ` +
      'upgrade the receiver or have the sender write version 1',
  );
}

function kindMismatch(kind: string, expected: DescriptorKind): IpcError {
  return new IpcError('ERR_DESCRIPTOR_KIND', `expected a ${expected} descriptor, got ${JSON.stringify(kind)}`);
}
