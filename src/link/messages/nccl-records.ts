// The NCCL records of a TCP link (docs/PROTOCOL.md 8): the head every one starts with (a
// communicator reference and the transfer's sequence number on that communicator) and the
// 'nccl-buffer' record (one device buffer or array); 'nccl-tensor-set' builds on the head in
// tensors/nccl-wire.ts. Pure: bytes in, bytes out; every field checked on decode (a lie fails the
// message with ERR_FRAME_INVALID).
import { IpcError } from '../../errors.js';
import { MAX_NDIM } from '../../ipc/array-meta.js';
import { dtypeFromWireCode, dtypeInfo, type DType } from '../../ipc/dtype.js';
import { readU64, writeU64 } from '../transport/frame.js';

export const NCCL_BUFFER_KIND = 'nccl-buffer';

export const COMM_ID_BYTES = 16;
/** Communicator reference, then the u64 sequence. */
const COMM_REF_BYTES = 160;
export const TRANSFER_HEAD_BYTES = COMM_REF_BYTES + 8;
const HEAD_BYTES = TRANSFER_HEAD_BYTES;
const FLAG_UNIQUE_ID = 1;
const FLAG_BROADCAST = 2;
/** nccl-buffer: head, u64 bytes, 16-byte device UUID, u8 dtype, u8 ndim, 6 reserved, shape. */
const BUFFER_FIXED_BYTES = HEAD_BYTES + 8 + 16 + 8;

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

export function malformedRecord(kind: string, why: string): IpcError {
  return new IpcError('ERR_FRAME_INVALID', `a received ${kind} is malformed: ${why}`);
}


/** Writes `head` at the start of `out` (which has room for it). */
export function writeTransferHead(out: Uint8Array, head: TransferHead): void {
  const v = new DataView(out.buffer, out.byteOffset, out.byteLength);
  const { comm } = head;
  out.set(comm.id, 0);
  v.setUint32(16, comm.nranks, true);
  v.setUint32(20, comm.rank, true);
  v.setUint32(24, (comm.uniqueId ? FLAG_UNIQUE_ID : 0) | (comm.broadcast ? FLAG_BROADCAST : 0), true);
  if (comm.uniqueId) out.set(comm.uniqueId, 32);
  writeU64(v, COMM_REF_BYTES, head.sequence);
}

/** Reads and checks the head of an NCCL record of `kind`. */
export function readTransferHead(kind: string, data: Uint8Array, v: DataView): TransferHead {
  if (data.byteLength < HEAD_BYTES) throw malformedRecord(kind, `${data.byteLength} bytes is shorter than its ${HEAD_BYTES}-byte head`);
  const nranks = v.getUint32(16, true);
  const rank = v.getUint32(20, true);
  const flags = v.getUint32(24, true);
  if (nranks < 2 || rank < 1 || rank >= nranks) throw malformedRecord(kind, `rank ${rank} of ${nranks} (a receiver is rank 1..nranks-1 of at least 2)`);
  if ((flags & ~(FLAG_UNIQUE_ID | FLAG_BROADCAST)) !== 0) throw malformedRecord(kind, `unknown communicator flags 0x${flags.toString(16)}`);
  if (v.getUint32(28, true) !== 0) throw malformedRecord(kind, 'reserved bytes are not zero');
  const hasId = (flags & FLAG_UNIQUE_ID) !== 0;
  if (!hasId && data.subarray(32, COMM_REF_BYTES).some((b) => b !== 0)) throw malformedRecord(kind, 'the unique id field is not zero without its flag');
  const sequence = readU64(v, COMM_REF_BYTES);
  if (sequence < 0) throw malformedRecord(kind, 'its sequence number is past 2^53');
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
  writeTransferHead(out, r);
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
  const head = readTransferHead(kind, data, v);
  if (data.byteLength < BUFFER_FIXED_BYTES) throw malformedRecord(kind, `${data.byteLength} bytes is shorter than its ${BUFFER_FIXED_BYTES} fixed bytes`);
  const byteLength = readU64(v, HEAD_BYTES);
  if (byteLength < 1) throw malformedRecord(kind, `a length of ${byteLength} bytes`);
  const code = data[HEAD_BYTES + 24]!;
  const ndim = data[HEAD_BYTES + 25]!;
  if (data.subarray(HEAD_BYTES + 26, BUFFER_FIXED_BYTES).some((b) => b !== 0)) throw malformedRecord(kind, 'reserved bytes are not zero');
  if (data.byteLength !== BUFFER_FIXED_BYTES + 8 * ndim) throw malformedRecord(kind, `${data.byteLength} bytes for ${ndim} dimensions`);
  let array: NcclBufferRecord['array'];
  if (code === 0) {
    if (ndim !== 0) throw malformedRecord(kind, 'dimensions without a dtype');
  } else {
    const dtype = dtypeFromWireCode(code);
    if (!dtype) throw malformedRecord(kind, `unknown dtype code ${code}`);
    if (ndim > MAX_NDIM) throw malformedRecord(kind, `${ndim} dimensions (at most ${MAX_NDIM})`);
    const shape: number[] = [];
    let elements = 1;
    for (let d = 0; d < ndim; d++) {
      const n = readU64(v, BUFFER_FIXED_BYTES + 8 * d);
      if (n < 0) throw malformedRecord(kind, `dimension ${d} is past 2^53`);
      shape.push(n);
      elements *= n;
    }
    if (elements * dtypeInfo(dtype).itemsize !== byteLength) {
      throw malformedRecord(kind, `shape [${shape}] of ${dtype} is ${elements * dtypeInfo(dtype).itemsize} bytes, not the ${byteLength} announced`);
    }
    array = { dtype, shape };
  }
  return { ...head, byteLength, deviceUuid: data.slice(HEAD_BYTES + 8, HEAD_BYTES + 24), array };
}
