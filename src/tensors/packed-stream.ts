// The packed stream of an 'nccl-tensor-set' (docs/PROTOCOL.md 8.3): a state dict's bytes laid out
// as the sender keeps them, cut into chunks of equal size, one NCCL operation each. Pure: offsets,
// the receiver's checks, and for each side the route of each chunk (straight from or into memory
// where the chunk is one range there, else through a staging buffer with a run table to gather
// or scatter). No CUDA here.
import { IpcError } from '../errors.js';

/** Alignment a run keeps from its sender's address: its remainder modulo this. */
export const PACK_ALIGN = 256;
/** Smallest chunk the protocol allows, and the unit chunk sizes are multiples of. */
export const MIN_CHUNK_BYTES = 1 << 20;
/** Chunk size a sender uses unless told otherwise: large enough that NCCL's fixed cost per
 * operation stays small (queueing one on a non-blocking communicator took about 190 us on two H200s:
 * 32 chunks of 256 MiB spent 6 ms of a 30 ms sync queueing), small enough that two staging slots stay
 * modest (1 GiB a side, and only where a chunk is not one run of memory). */
export const DEFAULT_CHUNK_BYTES = 512 << 20;

/** One tensor of a set to send, as the packed layout needs it. */
export interface SourceTensor {
  /** Elements x itemsize. */
  readonly nbytes: number;
  /** Device address of its first element. */
  readonly address: bigint;
  /** Identity of the allocation it lives in (tensors of one allocation share it). */
  readonly allocation: unknown;
}

/**
 * Packed offsets of `tensors` in send order: a tensor directly after its predecessor in the same
 * allocation follows it without a gap (the two are one run); any other starts at the first offset
 * at or after the predecessor's end with its address's remainder modulo 256.
 */
export function packOffsets(tensors: readonly SourceTensor[]): { offsets: number[]; length: number } {
  const offsets = new Array<number>(tensors.length);
  let end = 0;
  for (let i = 0; i < tensors.length; i++) {
    const t = tensors[i]!;
    const p = i > 0 ? tensors[i - 1]! : undefined;
    let at: number;
    if (p && p.allocation === t.allocation && p.address + BigInt(p.nbytes) === t.address) {
      at = end;
    } else {
      const rem = Number(t.address % BigInt(PACK_ALIGN));
      at = end + ((rem - (end % PACK_ALIGN) + PACK_ALIGN) % PACK_ALIGN);
    }
    offsets[i] = at;
    end = at + t.nbytes;
  }
  return { offsets, length: end };
}

function malformed(why: string): IpcError {
  return new IpcError('ERR_FRAME_INVALID', `a received nccl-tensor-set is malformed: ${why}`);
}

/**
 * The receiver's checks of a packed layout (what its safety needs, PROTOCOL.md 8.3): offsets
 * non-decreasing, tensors not overlapping, each offset a multiple of its item size, `length` the
 * end of the last tensor. Offsets within `length` are the table decoder's check.
 */
export function checkPackedLayout(offsets: ArrayLike<number>, nbytes: ArrayLike<number>, itemsizes: ArrayLike<number>, length: number): void {
  let end = 0;
  for (let i = 0; i < offsets.length; i++) {
    const at = offsets[i]!;
    if (at < end) throw malformed(`tensor #${i} starts at byte ${at} of the stream, inside the tensor before it (which ends at ${end})`);
    if (at % itemsizes[i]! !== 0) throw malformed(`tensor #${i} starts at byte ${at}, not a multiple of its ${itemsizes[i]}-byte elements`);
    end = at + nbytes[i]!;
  }
  if (end !== length) throw malformed(`its packed length is ${length} bytes, but its last tensor ends at byte ${end}`);
}

/** Checks a chunk size read from the wire or given as an option. */
export function checkChunkBytes(chunkBytes: number, what: string): void {
  if (!Number.isSafeInteger(chunkBytes) || chunkBytes < MIN_CHUNK_BYTES || chunkBytes % PACK_ALIGN !== 0) {
    throw new IpcError('ERR_FRAME_INVALID', `${what}: a chunk of ${chunkBytes} bytes is not a multiple of ${PACK_ALIGN} of at least ${MIN_CHUNK_BYTES}`);
  }
}

/** Chunks of a stream of `length` bytes. */
function chunkCount(length: number, chunkBytes: number): number {
  return Math.ceil(length / chunkBytes);
}

/** Where one side's memory holds a tensor of the stream; undefined: nowhere (received bytes dropped). */
export interface PlacedTensor {
  readonly offset: number;
  readonly nbytes: number;
  readonly address: bigint | undefined;
}

/**
 * How one chunk moves on this side: straight from/into `address` (the chunk is one contiguous
 * range of this side's memory, every byte of it a tensor's), or through a staging buffer with
 * `copies` (offset in the chunk, address here, bytes) to gather before sending or scatter after
 * receiving.
 */
export type ChunkRoute =
  | { readonly direct: true; readonly address: bigint; readonly bytes: number }
  | { readonly direct: false; readonly bytes: number; readonly copies: ReadonlyArray<readonly [number, bigint, number]> };

/**
 * The route of every chunk for one side. A chunk goes direct when it lies inside one run: tensors
 * back to back both in the stream and in this side's memory, each with an address. Otherwise its
 * pieces are copied through staging (pieces of tensors without an address are left out).
 */
export function routeChunks(tensors: readonly PlacedTensor[], length: number, chunkBytes: number): ChunkRoute[] {
  // Runs: [first tensor, last tensor] with contiguous offsets and addresses.
  const runOf = new Int32Array(tensors.length);
  const runStart: number[] = [];
  for (let i = 0; i < tensors.length; i++) {
    const t = tensors[i]!;
    const p = i > 0 ? tensors[i - 1]! : undefined;
    const joins = p !== undefined && t.address !== undefined && p.address !== undefined &&
      p.offset + p.nbytes === t.offset && p.address + BigInt(p.nbytes) === t.address;
    if (!joins) runStart.push(i);
    runOf[i] = runStart.length - 1;
  }
  const routes: ChunkRoute[] = [];
  const count = chunkCount(length, chunkBytes);
  let first = 0;  // first tensor that may reach into the current chunk
  for (let k = 0; k < count; k++) {
    const lo = k * chunkBytes;
    const hi = Math.min(lo + chunkBytes, length);
    while (first < tensors.length && tensors[first]!.offset + tensors[first]!.nbytes <= lo) first++;
    const t0 = tensors[first];
    // Direct: the chunk starts inside a tensor with an address, and the run it belongs to reaches its end.
    if (t0 && t0.address !== undefined && t0.offset <= lo) {
      const r = runOf[first]!;
      let last = first;
      while (last + 1 < tensors.length && runOf[last + 1] === r && tensors[last]!.offset + tensors[last]!.nbytes < hi) last++;
      const tl = tensors[last]!;
      if (tl.offset + tl.nbytes >= hi) {
        routes.push({ direct: true, address: t0.address + BigInt(lo - t0.offset), bytes: hi - lo });
        continue;
      }
    }
    const copies: Array<readonly [number, bigint, number]> = [];
    for (let i = first; i < tensors.length && tensors[i]!.offset < hi; i++) {
      const t = tensors[i]!;
      if (t.address === undefined || t.nbytes === 0) continue;
      const a = Math.max(lo, t.offset);
      const b = Math.min(hi, t.offset + t.nbytes);
      if (b > a) copies.push([a - lo, t.address + BigInt(a - t.offset), b - a]);
    }
    routes.push({ direct: false, bytes: hi - lo, copies });
  }
  return routes;
}
