// The 'nccl-tensor-set' record (docs/PROTOCOL.md 8.3): named tensors whose bytes follow over NCCL as
// one packed stream (packed-stream.ts), after the transfer head of every NCCL record
// (link/messages/nccl-records.ts). The table is section 4.2's with the stream as its one allocation. Pure.
import { dtypeInfo, type DType } from '../ipc/dtype.js';
import {
  TRANSFER_HEAD_BYTES as HEAD_BYTES, malformedRecord, readTransferHead, writeTransferHead, type TransferHead,
} from '../link/messages/nccl-records.js';
import { readU64, writeU64 } from '../link/transport/frame.js';
import { checkChunkBytes, checkPackedLayout } from './packed-stream.js';
import { cStrides, decodeTensorTable, encodeTensorTable, type TensorLayout, type TensorSpec } from './wire.js';

export const NCCL_TENSOR_SET_KIND = 'nccl-tensor-set';
/** After the head: the 'CINT' header of 48 bytes, then the table. */
const SET_HEADER_BYTES = 48;
const SET_MAGIC = 0x544e4943;  // 'CINT' read as a little-endian u32
const SET_VERSION = 1;

export interface NcclTensorSetRecord extends TransferHead {
  /** The tensors: names, dtypes, shapes, and their offsets in the packed stream. */
  readonly layout: TensorLayout;
  /** Bytes of the packed stream. */
  readonly packedLength: number;
  readonly chunkBytes: number;
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
  const tensors: TensorSpec[] = specs.map((s) => ({
    name: s.name, dtype: s.dtype, shape: s.shape, strides: cStrides(s.shape, dtypeInfo(s.dtype).itemsize), offset: s.offset, allocation: 0,
  }));
  return encodeTensorTable(tensors, 1);
}

export function encodeNcclTensorSet(head: TransferHead, table: Uint8Array, tensorCount: number, packedLength: number, chunkBytes: number): Uint8Array {
  const out = new Uint8Array(HEAD_BYTES + SET_HEADER_BYTES + table.byteLength);
  const v = new DataView(out.buffer);
  writeTransferHead(out, head);
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
  const head = readTransferHead(kind, data, v);
  const at = HEAD_BYTES;
  if (data.byteLength < at + SET_HEADER_BYTES) throw malformedRecord(kind, `${data.byteLength} bytes is shorter than its head and header`);
  if (v.getUint32(at, true) !== SET_MAGIC) throw malformedRecord(kind, 'bad magic');
  const version = v.getUint16(at + 4, true);
  if (version !== SET_VERSION) throw malformedRecord(kind, `version ${version}, this build reads ${SET_VERSION}`);
  if (v.getUint16(at + 6, true) !== 0 || data.subarray(at + 32, at + SET_HEADER_BYTES).some((b) => b !== 0)) throw malformedRecord(kind, 'reserved bytes are not zero');
  const count = v.getUint32(at + 8, true);
  const tableLength = v.getUint32(at + 12, true);
  const packedLength = readU64(v, at + 16);
  const chunkBytes = readU64(v, at + 24);
  if (count < 1) throw malformedRecord(kind, 'no tensors');
  if (packedLength < 1) throw malformedRecord(kind, `a packed length of ${packedLength}`);
  if (data.byteLength !== at + SET_HEADER_BYTES + tableLength) throw malformedRecord(kind, `its table should be ${tableLength} bytes, ${data.byteLength - at - SET_HEADER_BYTES} follow`);
  checkChunkBytes(chunkBytes, `a received ${kind}`);
  const layout = decodeTable(data.subarray(at + SET_HEADER_BYTES), count, packedLength);
  return { ...head, layout, packedLength, chunkBytes };
}

/** Decodes a packed table: section 4.2's checks with the stream as the one allocation, then 8.3's. */
export function decodePackedTable(table: Uint8Array, count: number, packedLength: number): TensorLayout {
  const layout = decodeTensorTable(table, count, [packedLength]);
  for (let i = 0; i < count; i++) {
    if (layout.contiguous[i] !== 1) throw malformedRecord(NCCL_TENSOR_SET_KIND, `tensor ${JSON.stringify(layout.names[i])} is not C-contiguous`);
  }
  checkPackedLayout(layout.offsets, layout.nbytes, layout.dtypes.map((d) => dtypeInfo(d).itemsize), packedLength);
  return layout;
}
