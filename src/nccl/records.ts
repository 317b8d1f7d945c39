// The NCCL records of a TCP link (docs/PROTOCOL.md 8): 'nccl-buffer' (one device buffer or array)
// and 'nccl-tensor-set' (named tensors as a packed stream), each starting with a communicator
// reference and the transfer's sequence number on that communicator. Pure: bytes in, bytes out;
// every field checked on decode (a lie fails the message with ERR_FRAME_INVALID).
import { IpcError } from '../errors.js';
import { MAX_NDIM } from '../ipc/array-meta.js';
import { dtypeFromWireCode, dtypeInfo, type DType } from '../ipc/dtype.js';
import { decodeTensorTable, encodeTensorTable, type TensorLayout, type TensorSpec } from '../tensors/wire.js';
import { checkChunkBytes, checkPackedLayout } from './packed-stream.js';

export const NCCL_BUFFER_KIND = 'nccl-buffer';
export const NCCL_TENSOR_SET_KIND = 'nccl-tensor-set';

export const COMM_ID_BYTES = 16;
export const UNIQUE_ID_BYTES = 128;
/** Communicator reference, then the u64 sequence. */
const COMM_REF_BYTES = 160;
const HEAD_BYTES = COMM_REF_BYTES + 8;
const FLAG_UNIQUE_ID = 1;
const FLAG_BROADCAST = 2;
/** nccl-buffer: head, u64 bytes, 16-byte device UUID, u8 dtype, u8 ndim, 6 reserved, shape. */
const BUFFER_FIXED_BYTES = HEAD_BYTES + 8 + 16 + 8;
/** nccl-tensor-set: head, then 'CINT' header of 48 bytes, then the table. */
const SET_HEADER_BYTES = 48;
const SET_MAGIC = 0x544e4943;  // 'CINT' read as a little-endian u32
const SET_VERSION = 1;

/** Which communicator a transfer uses, and this receiver's place in it. */
export interface CommReference {
  /** 16 random bytes naming the communicator on every link it spans. */
  readonly id: Uint8Array;
  readonly nranks: number;
  /** The receiver's rank (1..nranks-1; the sender is rank 0). */
  readonly rank: number;
  /** Chunks are ncclBroadcast from rank 0 (else ncclRecv from rank 0). */
  readonly broadcast: boolean;
  /** The ncclUniqueId, in the first record naming the communicator on a link. */
  readonly uniqueId: Uint8Array | undefined;
}

/** The head every NCCL record starts with. */
export interface TransferHead {
  readonly comm: CommReference;
  /** The transfer's number on its communicator: 0, 1, 2, ... */
  readonly sequence: number;
}

export interface NcclBufferRecord extends TransferHead {
  readonly byteLength: number;
  /** The sender's device UUID, raw (informational). */
  readonly deviceUuid: Uint8Array;
  /** Array metadata, when a DeviceArray was sent (C-contiguous). */
  readonly array: { readonly dtype: DType; readonly shape: readonly number[] } | undefined;
}

export interface NcclTensorSetRecord extends TransferHead {
  /** The tensors: names, dtypes, shapes, and their offsets in the packed stream. */
  readonly layout: TensorLayout;
  /** Bytes of the packed stream. */
  readonly packedLength: number;
  readonly chunkBytes: number;
}

function malformed(kind: string, why: string): IpcError {
  return new IpcError('ERR_FRAME_INVALID', `a received ${kind} is malformed: ${why}`);
}

function readU64(v: DataView, at: number): number {
  const high = v.getUint32(at + 4, true);
  return high >= 0x20_0000 ? -1 : high * 0x1_0000_0000 + v.getUint32(at, true);
}
function writeU64(v: DataView, at: number, n: number): void {
  v.setUint32(at, n % 0x1_0000_0000, true);
  v.setUint32(at + 4, Math.floor(n / 0x1_0000_0000), true);
}

function writeHead(out: Uint8Array, head: TransferHead): void {
  const v = new DataView(out.buffer, out.byteOffset, out.byteLength);
  const { comm } = head;
  out.set(comm.id, 0);
  v.setUint32(16, comm.nranks, true);
  v.setUint32(20, comm.rank, true);
  v.setUint32(24, (comm.uniqueId ? FLAG_UNIQUE_ID : 0) | (comm.broadcast ? FLAG_BROADCAST : 0), true);
  if (comm.uniqueId) out.set(comm.uniqueId, 32);
  writeU64(v, COMM_REF_BYTES, head.sequence);
}

function readHead(kind: string, data: Uint8Array, v: DataView): TransferHead {
  if (data.byteLength < HEAD_BYTES) throw malformed(kind, `${data.byteLength} bytes is shorter than its ${HEAD_BYTES}-byte head`);
  const nranks = v.getUint32(16, true);
  const rank = v.getUint32(20, true);
  const flags = v.getUint32(24, true);
  if (nranks < 2 || rank < 1 || rank >= nranks) throw malformed(kind, `rank ${rank} of ${nranks} (a receiver is rank 1..nranks-1 of at least 2)`);
  if ((flags & ~(FLAG_UNIQUE_ID | FLAG_BROADCAST)) !== 0) throw malformed(kind, `unknown communicator flags 0x${flags.toString(16)}`);
  if (v.getUint32(28, true) !== 0) throw malformed(kind, 'reserved bytes are not zero');
  const hasId = (flags & FLAG_UNIQUE_ID) !== 0;
  if (!hasId && data.subarray(32, COMM_REF_BYTES).some((b) => b !== 0)) throw malformed(kind, 'the unique id field is not zero without its flag');
  const sequence = readU64(v, COMM_REF_BYTES);
  if (sequence < 0) throw malformed(kind, 'its sequence number is past 2^53');
  return {
    comm: {
      id: data.slice(0, COMM_ID_BYTES), nranks, rank, broadcast: (flags & FLAG_BROADCAST) !== 0,
      uniqueId: hasId ? data.slice(32, COMM_REF_BYTES) : undefined,
    },
    sequence,
  };
}

export function encodeNcclBuffer(r: Omit<NcclBufferRecord, 'array'> & { array?: NcclBufferRecord['array'] }): Uint8Array {
  const ndim = r.array?.shape.length ?? 0;
  const out = new Uint8Array(BUFFER_FIXED_BYTES + 8 * ndim);
  const v = new DataView(out.buffer);
  writeHead(out, r);
  writeU64(v, HEAD_BYTES, r.byteLength);
  out.set(r.deviceUuid, HEAD_BYTES + 8);
  if (r.array) {
    out[HEAD_BYTES + 24] = dtypeInfo(r.array.dtype).wireCode;
    out[HEAD_BYTES + 25] = ndim;
    r.array.shape.forEach((n, d) => writeU64(v, BUFFER_FIXED_BYTES + 8 * d, n));
  }
  return out;
}

export function decodeNcclBuffer(data: Uint8Array): NcclBufferRecord {
  const kind = NCCL_BUFFER_KIND;
  const v = new DataView(data.buffer, data.byteOffset, data.byteLength);
  const head = readHead(kind, data, v);
  if (data.byteLength < BUFFER_FIXED_BYTES) throw malformed(kind, `${data.byteLength} bytes is shorter than its ${BUFFER_FIXED_BYTES} fixed bytes`);
  const byteLength = readU64(v, HEAD_BYTES);
  if (byteLength < 1) throw malformed(kind, `a length of ${byteLength} bytes`);
  const code = data[HEAD_BYTES + 24]!;
  const ndim = data[HEAD_BYTES + 25]!;
  if (data.subarray(HEAD_BYTES + 26, BUFFER_FIXED_BYTES).some((b) => b !== 0)) throw malformed(kind, 'reserved bytes are not zero');
  if (data.byteLength !== BUFFER_FIXED_BYTES + 8 * ndim) throw malformed(kind, `${data.byteLength} bytes for ${ndim} dimensions`);
  let array: NcclBufferRecord['array'];
  if (code === 0) {
    if (ndim !== 0) throw malformed(kind, 'dimensions without a dtype');
  } else {
    const dtype = dtypeFromWireCode(code);
    if (!dtype) throw malformed(kind, `unknown dtype code ${code}`);
    if (ndim > MAX_NDIM) throw malformed(kind, `${ndim} dimensions (at most ${MAX_NDIM})`);
    const shape: number[] = [];
    let elements = 1;
    for (let d = 0; d < ndim; d++) {
      const n = readU64(v, BUFFER_FIXED_BYTES + 8 * d);
      if (n < 0) throw malformed(kind, `dimension ${d} is past 2^53`);
      shape.push(n);
      elements *= n;
    }
    if (elements * dtypeInfo(dtype).itemsize !== byteLength) {
      throw malformed(kind, `shape [${shape}] of ${dtype} is ${elements * dtypeInfo(dtype).itemsize} bytes, not the ${byteLength} announced`);
    }
    array = { dtype, shape };
  }
  return { ...head, byteLength, deviceUuid: data.slice(HEAD_BYTES + 8, HEAD_BYTES + 24), array };
}

/** A tensor of a set to send: name, dtype, shape (C-contiguous) and packed offset. */
export interface PackedSpec {
  readonly name: string;
  readonly dtype: DType;
  readonly shape: readonly number[];
  readonly offset: number;
}

/** The table of a set to send (what a repeated send of the same tensors repeats byte for byte). */
export function encodePackedTable(specs: readonly PackedSpec[]): Uint8Array {
  const tensors: TensorSpec[] = specs.map((s) => {
    const { itemsize } = dtypeInfo(s.dtype);
    const strides = new Array<number>(s.shape.length);
    let step = itemsize;
    for (let d = s.shape.length - 1; d >= 0; d--) {
      strides[d] = step;
      step *= s.shape[d]!;
    }
    return { name: s.name, dtype: s.dtype, shape: s.shape, strides, offset: s.offset, allocation: 0 };
  });
  return encodeTensorTable(tensors, 1);
}

export function encodeNcclTensorSet(head: TransferHead, table: Uint8Array, tensorCount: number, packedLength: number, chunkBytes: number): Uint8Array {
  const out = new Uint8Array(HEAD_BYTES + SET_HEADER_BYTES + table.byteLength);
  const v = new DataView(out.buffer);
  writeHead(out, head);
  const at = HEAD_BYTES;
  v.setUint32(at, SET_MAGIC, true);
  v.setUint16(at + 4, SET_VERSION, true);
  v.setUint32(at + 8, tensorCount, true);
  v.setUint32(at + 12, table.byteLength, true);
  writeU64(v, at + 16, packedLength);
  writeU64(v, at + 24, chunkBytes);
  out.set(table, HEAD_BYTES + SET_HEADER_BYTES);
  return out;
}

/** Decodes and checks a set; `decodeTable` may be a cached decodePackedTable (a repeated sync repeats its table byte for byte). */
export function decodeNcclTensorSet(data: Uint8Array, decodeTable: (table: Uint8Array, count: number, packedLength: number) => TensorLayout = decodePackedTable): NcclTensorSetRecord {
  const kind = NCCL_TENSOR_SET_KIND;
  const v = new DataView(data.buffer, data.byteOffset, data.byteLength);
  const head = readHead(kind, data, v);
  const at = HEAD_BYTES;
  if (data.byteLength < at + SET_HEADER_BYTES) throw malformed(kind, `${data.byteLength} bytes is shorter than its head and header`);
  if (v.getUint32(at, true) !== SET_MAGIC) throw malformed(kind, 'bad magic');
  const version = v.getUint16(at + 4, true);
  if (version !== SET_VERSION) throw malformed(kind, `version ${version}, this build reads ${SET_VERSION}`);
  if (v.getUint16(at + 6, true) !== 0 || data.subarray(at + 32, at + SET_HEADER_BYTES).some((b) => b !== 0)) throw malformed(kind, 'reserved bytes are not zero');
  const count = v.getUint32(at + 8, true);
  const tableLength = v.getUint32(at + 12, true);
  const packedLength = readU64(v, at + 16);
  const chunkBytes = readU64(v, at + 24);
  if (count < 1) throw malformed(kind, 'no tensors');
  if (packedLength < 1) throw malformed(kind, `a packed length of ${packedLength}`);
  if (data.byteLength !== at + SET_HEADER_BYTES + tableLength) throw malformed(kind, `its table should be ${tableLength} bytes, ${data.byteLength - at - SET_HEADER_BYTES} follow`);
  checkChunkBytes(chunkBytes, `a received ${kind}`);
  const layout = decodeTable(data.subarray(at + SET_HEADER_BYTES), count, packedLength);
  return { ...head, layout, packedLength, chunkBytes };
}

/** Decodes a packed table: section 4.2's checks with the stream as the one allocation, then 8.3's. */
export function decodePackedTable(table: Uint8Array, count: number, packedLength: number): TensorLayout {
  const layout = decodeTensorTable(table, count, [packedLength]);
  for (let i = 0; i < count; i++) {
    if (layout.contiguous[i] !== 1) throw malformed(NCCL_TENSOR_SET_KIND, `tensor ${JSON.stringify(layout.names[i])} is not C-contiguous`);
  }
  checkPackedLayout(layout.offsets, layout.nbytes, layout.dtypes.map((d) => dtypeInfo(d).itemsize), packedLength);
  return layout;
}
