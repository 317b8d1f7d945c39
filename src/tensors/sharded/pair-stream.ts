// The pure half of the sharded sync's device paths (PROTOCOL.md 9.3): the bounds of a pair's runs
// checked against the memories they touch, a pair's runs as copy rows, and a pair's packed byte
// stream (its runs in plan order, each run's count*bytes bytes back to back) cut into NCCL chunks,
// each chunk either one contiguous range of this side's memory (sent from / received into it
// directly) or pieces copied through staging. No CUDA here: device-copy.ts and nccl-runs.ts
// turn these into copy_runs tables and NCCL rounds.
import { IpcError } from '../../errors.js';
import { RUN_FIELDS } from './runs.js';
import type { ChunkSize, CopyBatch, RunMemory } from './execute-types.js';
import type { PlanPair } from './plan.js';

/** Which side of a pair's runs: the source rank's tensors or the destination rank's. */
export type RunSide = 'src' | 'dst';

/**
 * A piece of a chunk: `count` blocks of `bytes` bytes, packed at byte `at` of the chunk, block i
 * at byte `offset + i*stride` of local tensor `tensor` (count 1: one contiguous range, stride 0).
 */
export interface ChunkPiece {
  readonly at: number;
  readonly tensor: number;
  readonly offset: number;
  readonly bytes: number;
  readonly count: number;
  readonly stride: number;
}

/**
 * One chunk of a pair's stream on one side: `direct` when its `bytes` bytes are bytes
 * `offset`.. of local tensor `tensor`, one range; otherwise the pieces that fill it, in stream order.
 */
export type PairChunk =
  | { readonly direct: true; readonly bytes: number; readonly tensor: number; readonly offset: number }
  | { readonly direct: false; readonly bytes: number; readonly pieces: readonly ChunkPiece[] };

const FIELD = { src: { tensor: 0, offset: 2, stride: 6 }, dst: { tensor: 1, offset: 3, stride: 7 } } as const;

/**
 * Checks every run of `runs` on `side` against the memories it touches: integers, a tensor index
 * `extents` has, and its last byte inside that tensor's extent. Throws IpcError ERR_OUT_OF_RANGE
 * naming the run, the tensor index and the byte range (`what` names the pair), so that a wrong
 * plan or memory can never become a write outside a tensor.
 */
export function checkRunBounds(runs: Float64Array, side: RunSide, extents: readonly number[], what: string): void {
  const f = FIELD[side];
  const kind = side === 'src' ? 'source' : 'destination';
  if (runs.length % RUN_FIELDS !== 0) throw new IpcError('ERR_OUT_OF_RANGE', `${what}: its run table has ${runs.length} numbers, not a multiple of ${RUN_FIELDS}`);
  for (let i = 0; i < runs.length; i += RUN_FIELDS) {
    const n = i / RUN_FIELDS;
    const tensor = runs[i + f.tensor]!;
    const offset = runs[i + f.offset]!;
    const stride = runs[i + f.stride]!;
    const bytes = runs[i + 4]!;
    const count = runs[i + 5]!;
    for (const x of [tensor, offset, stride, bytes, count]) {
      if (!Number.isSafeInteger(x) || x < 0) {
        throw new IpcError('ERR_OUT_OF_RANGE', `${what}: run #${n} has ${x} where a non-negative integer belongs: the plan is corrupt; re-plan`);
      }
    }
    if (tensor >= extents.length) {
      throw new IpcError('ERR_OUT_OF_RANGE', `${what}: run #${n} names ${kind} tensor #${tensor}, but this side has ${extents.length} ${kind} tensors; the memories given do not match the layout`);
    }
    if (bytes === 0 || count === 0) continue;
    const end = offset + (count - 1) * stride + bytes;
    const extent = extents[tensor]!;
    if (!Number.isSafeInteger(end) || end > extent) {
      throw new IpcError('ERR_OUT_OF_RANGE',
        `${what}: run #${n} reaches bytes [${offset}, ${end}) of ${kind} tensor #${tensor}, past its ${extent} bytes; nothing was copied: the memory given is smaller than its layout says`);
    }
  }
}

/**
 * The copy rows of a pair's runs (each block of a strided run a row): dsts[i] <- srcs[i],
 * sizes[i] bytes, from the tensors' first-element addresses. Zero-byte runs give no row.
 */
export function runRows(runs: Float64Array, srcAddress: (tensor: number) => number, dstAddress: (tensor: number) => number, into: CopyRows = newRows()): CopyRows {
  for (let i = 0; i < runs.length; i += RUN_FIELDS) {
    const bytes = runs[i + 4]!;
    const count = runs[i + 5]!;
    if (bytes === 0) continue;
    const s = srcAddress(runs[i]!) + runs[i + 2]!;
    const d = dstAddress(runs[i + 1]!) + runs[i + 3]!;
    const ss = runs[i + 6]!;
    const ds = runs[i + 7]!;
    for (let c = 0; c < count; c++) {
      into.srcs.push(s + c * ss);
      into.dsts.push(d + c * ds);
      into.sizes.push(bytes);
    }
  }
  return into;
}

/** Bytes of a pair's packed stream: the sum of its runs' count*bytes. */
export function streamBytes(runs: Float64Array): number {
  let n = 0;
  for (let i = 0; i < runs.length; i += RUN_FIELDS) n += runs[i + 4]! * runs[i + 5]!;
  return n;
}

interface Segment { pos: number; tensor: number; offset: number; bytes: number; count: number; stride: number }

/**
 * The chunk of each NCCL pair of a plan (PROTOCOL.md 9.3): `chunkBytes` over the NCCL streams
 * (pairs it sends or receives) of the busier of the pair's two ranks, down to a multiple of 256
 * where that leaves at least 512. A round holds one chunk of each of a rank's streams, so a rank's
 * round stays within `chunkBytes` whatever its fan-out; both ranks of a pair, knowing the whole
 * plan, compute the same size.
 */
export function ncclChunkBytes(pairs: readonly PlanPair[], chunkBytes: number): (pair: PlanPair) => number {
  const streams = new Map<number, number>();
  for (const p of pairs) {
    if (p.path !== 'nccl') continue;
    streams.set(p.src, (streams.get(p.src) ?? 0) + 1);
    streams.set(p.dst, (streams.get(p.dst) ?? 0) + 1);
  }
  return (p) => {
    const c = Math.floor(chunkBytes / Math.max(streams.get(p.src) ?? 1, streams.get(p.dst) ?? 1));
    return c >= 512 ? c - (c % SLOT_ALIGN) : Math.max(1, c);
  };
}

/**
 * A pair's packed stream on `side`, cut into chunks of `chunkBytes` (the last one shorter). A
 * chunk whose bytes are one contiguous range of one local tensor is direct (runs that continue
 * each other, a strided run whose blocks touch, or a part of one block); any other lists its
 * pieces, a strided run cut at a chunk boundary split into a partial block, whole blocks, a
 * partial block. Both sides of a pair cut the same stream, so their chunks match in size.
 */
export function pairChunks(runs: Float64Array, side: RunSide, chunkBytes: number): PairChunk[] {
  if (!Number.isSafeInteger(chunkBytes) || chunkBytes <= 0) throw new IpcError('ERR_OUT_OF_RANGE', `a chunk of ${chunkBytes} bytes: chunks must be a positive whole number of bytes`);
  const f = FIELD[side];
  // The stream as segments of this side: contiguous ranges (count 1) or strided blocks.
  const segs: Segment[] = [];
  let pos = 0;
  for (let i = 0; i < runs.length; i += RUN_FIELDS) {
    const bytes = runs[i + 4]!;
    const count = runs[i + 5]!;
    if (bytes === 0 || count === 0) continue;
    const tensor = runs[i + f.tensor]!;
    const offset = runs[i + f.offset]!;
    const stride = runs[i + f.stride]!;
    const contiguous = count === 1 || stride === bytes;
    const last = segs[segs.length - 1];
    if (contiguous && last && last.count === 1 && last.tensor === tensor && last.offset + last.bytes === offset) {
      last.bytes += bytes * count;
    } else if (contiguous) {
      segs.push({ pos, tensor, offset, bytes: bytes * count, count: 1, stride: 0 });
    } else {
      segs.push({ pos, tensor, offset, bytes, count, stride });
    }
    pos += bytes * count;
  }
  const length = pos;
  const chunks: PairChunk[] = [];
  let first = 0;
  for (let lo = 0; lo < length; lo += chunkBytes) {
    const hi = Math.min(lo + chunkBytes, length);
    while (segs[first]!.pos + segs[first]!.bytes * segs[first]!.count <= lo) first++;
    const pieces: ChunkPiece[] = [];
    const push = (p: ChunkPiece): void => {
      const prev = pieces[pieces.length - 1];
      if (prev && prev.count === 1 && p.count === 1 && prev.tensor === p.tensor && prev.offset + prev.bytes === p.offset) {
        pieces[pieces.length - 1] = { ...prev, bytes: prev.bytes + p.bytes };
      } else {
        pieces.push(p);
      }
    };
    for (let s = first; s < segs.length && segs[s]!.pos < hi; s++) {
      const g = segs[s]!;
      // This segment's packed bytes [a, e) that fall in the chunk.
      let a = Math.max(lo, g.pos) - g.pos;
      const e = Math.min(hi, g.pos + g.bytes * g.count) - g.pos;
      if (g.count === 1) {
        push({ at: g.pos + a - lo, tensor: g.tensor, offset: g.offset + a, bytes: e - a, count: 1, stride: 0 });
        continue;
      }
      let block = Math.floor(a / g.bytes);
      const into = a - block * g.bytes;
      if (into > 0) {
        // The chunk starts inside a block: its rest (or part of it) first.
        const n = Math.min(g.bytes - into, e - a);
        push({ at: g.pos + a - lo, tensor: g.tensor, offset: g.offset + block * g.stride + into, bytes: n, count: 1, stride: 0 });
        a += n;
        block++;
      }
      const whole = Math.floor((e - a) / g.bytes);
      if (whole > 0) {
        push({ at: g.pos + a - lo, tensor: g.tensor, offset: g.offset + block * g.stride, bytes: g.bytes, count: whole, stride: whole > 1 ? g.stride : 0 });
        a += whole * g.bytes;
        block += whole;
      }
      if (a < e) {
        // The chunk ends inside a block.
        push({ at: g.pos + a - lo, tensor: g.tensor, offset: g.offset + block * g.stride, bytes: e - a, count: 1, stride: 0 });
      }
    }
    const only = pieces[0]!;
    if (pieces.length === 1 && only.count === 1) chunks.push({ direct: true, bytes: hi - lo, tensor: only.tensor, offset: only.offset });
    else chunks.push({ direct: false, bytes: hi - lo, pieces });
  }
  return chunks;
}

/**
 * The copy rows of staged chunk pieces: gathering (tensor -> staging at `slot`) or scattering
 * (staging -> tensor), each block of a strided piece a row.
 */
export function pieceRows(pieces: readonly ChunkPiece[], address: (tensor: number) => number, slot: number, gather: boolean, into: CopyRows = newRows()): CopyRows {
  for (const p of pieces) {
    const base = address(p.tensor) + p.offset;
    for (let c = 0; c < p.count; c++) {
      const here = base + c * p.stride;
      const there = slot + p.at + c * p.bytes;
      into.dsts.push(gather ? there : here);
      into.srcs.push(gather ? here : there);
      into.sizes.push(p.bytes);
    }
  }
  return into;
}

/** Where staged chunks start in a staging slot: as aligned as NCCL's and copy_runs' fast paths like. */
export const SLOT_ALIGN = 256;

/** One operation of an NCCL round: chunk `chunk` of stream `stream`, at `slotOffset` of the round's slot when staged. */
export interface RoundEntry {
  readonly stream: number;
  readonly chunk: PairChunk;
  /** Byte offset in the round's staging slot; -1 for a direct chunk. */
  readonly slotOffset: number;
}

/**
 * The rounds of one sync on one rank: round k holds chunk k of every stream that has one (streams
 * in the order given), and its staged chunks laid out back to back in one slot (each at a multiple
 * of SLOT_ALIGN). `slotBytes`: the largest round's staged bytes, what each of the two slots needs.
 */
export function planRounds(streams: ReadonlyArray<readonly PairChunk[]>): { rounds: RoundEntry[][]; slotBytes: number } {
  let count = 0;
  for (const s of streams) count = Math.max(count, s.length);
  const rounds: RoundEntry[][] = [];
  let slotBytes = 0;
  for (let k = 0; k < count; k++) {
    const round: RoundEntry[] = [];
    let end = 0;
    streams.forEach((chunks, stream) => {
      const chunk = chunks[k];
      if (!chunk) return;
      if (chunk.direct) {
        round.push({ stream, chunk, slotOffset: -1 });
        return;
      }
      const at = Math.ceil(end / SLOT_ALIGN) * SLOT_ALIGN;
      round.push({ stream, chunk, slotOffset: at });
      end = at + chunk.bytes;
    });
    slotBytes = Math.max(slotBytes, end);
    rounds.push(round);
  }
  return { rounds, slotBytes };
}

/** Copy rows: dsts[i] <- srcs[i], sizes[i] bytes; addresses as numbers (device addresses are below 2^53: toAddress). */
export interface CopyRows { dsts: number[]; srcs: number[]; sizes: number[] }

export function newRows(): CopyRows {
  return { dsts: [], srcs: [], sizes: [] };
}

/** A device address as a number (exact: virtual addresses are below 2^53), or ERR_UNSUPPORTED. */
export function toAddress(pointer: bigint): number {
  if (pointer < 0n || pointer > BigInt(Number.MAX_SAFE_INTEGER)) throw new IpcError('ERR_UNSUPPORTED', `the address 0x${pointer.toString(16)} is beyond 2^53: the sharded copier computes addresses as numbers`);
  return Number(pointer);
}

/**
 * The addresses of one round on one rank: per entry the buffer NCCL sends from or receives into
 * (the tensor's bytes for a direct chunk, the entry's place in `slot` otherwise), the gather rows
 * of its staged sends (to run before the round) and the scatter rows of its staged receives (after).
 * `send[stream]`: whether stream `stream` is sent; `address(send, tensor)`: a local tensor's first byte.
 */
export function roundAddresses(round: readonly RoundEntry[], send: readonly boolean[], address: (send: boolean, tensor: number) => number, slot: number):
  { buffers: number[]; gather: CopyRows; scatter: CopyRows } {
  const gather = newRows();
  const scatter = newRows();
  const buffers = round.map((e) => {
    const out = send[e.stream]!;
    const c = e.chunk;
    if (c.direct) return address(out, c.tensor) + c.offset;
    const at = slot + e.slotOffset;
    pieceRows(c.pieces, (t) => address(out, t), at, out, out ? gather : scatter);
    return at;
  });
  return { buffers, gather, scatter };
}

/** Bytes of a copy_runs row (struct CopyRun in kernels/tensors.cu: dst, src, bytes, first chunk; u64 each). */
export const COPY_RUN_ROW_BYTES = 32;

/**
 * The copy_runs table of `rows`, byte for byte what kernels.ts planRuns makes of the same rows
 * (a row whose two addresses share a misalignment split at the next 16-byte boundary, zero-byte
 * rows left out, chunks of `chunkBytes` counted from 0), built with numbers instead of bigints
 * (CopyRunsTableBuilder).
 */
export function copyRunsTable(rows: CopyRows, chunkBytes: number): { data: Uint8Array; runs: number; chunks: number } {
  const table = new CopyRunsTableBuilder(chunkBytes);
  table.addRows(rows);
  return table.finish();
}

/**
 * Builds a copy_runs table row by row into one growing buffer, straight from plan runs (addRuns:
 * no intermediate arrays; a model's hundred thousand rows of strided slices are most of a first
 * sync's CPU time) or from copy rows (addRows). Words are written little-endian, as the addon's
 * hosts are.
 */
export class CopyRunsTableBuilder {
  #words = new Uint32Array(8 * 1024);
  #w = 0;
  runs = 0;
  chunks = 0;
  constructor(readonly chunkBytes: number) {}

  /** Adds every block of `runs` (a pair's table) between tensors whose first bytes `src` / `dst` give. */
  addRuns(runs: Float64Array, src: readonly number[], dst: readonly number[]): void {
    let rows = 0;
    for (let i = 0; i < runs.length; i += RUN_FIELDS) rows += runs[i + 5]!;
    this.#reserve(2 * rows);
    for (let i = 0; i < runs.length; i += RUN_FIELDS) {
      const bytes = runs[i + 4]!;
      const count = runs[i + 5]!;
      if (bytes === 0) continue;
      const s = src[runs[i]!]! + runs[i + 2]!;
      const d = dst[runs[i + 1]!]! + runs[i + 3]!;
      const ss = runs[i + 6]!;
      const ds = runs[i + 7]!;
      for (let c = 0; c < count; c++) this.#add(d + c * ds, s + c * ss, bytes);
    }
  }

  /** Adds copy rows as they are (dsts[i] <- srcs[i], sizes[i] bytes). */
  addRows(rows: CopyRows): void {
    const n = rows.dsts.length;
    this.#reserve(2 * n);
    for (let i = 0; i < n; i++) if (rows.sizes[i]! > 0) this.#add(rows.dsts[i]!, rows.srcs[i]!, rows.sizes[i]!);
  }

  /** The table: its bytes (a view of the builder's buffer), rows and chunks. */
  finish(): { data: Uint8Array; runs: number; chunks: number } {
    return { data: new Uint8Array(this.#words.buffer, 0, COPY_RUN_ROW_BYTES * this.runs), runs: this.runs, chunks: this.chunks };
  }

  #reserve(rows: number): void {
    const need = this.#w + rows * (COPY_RUN_ROW_BYTES / 4);
    if (need <= this.#words.length) return;
    const grown = new Uint32Array(Math.max(need, 2 * this.#words.length));
    grown.set(this.#words.subarray(0, this.#w));
    this.#words = grown;
  }

  // `x >>> 0` is x mod 2^32 and `x & 15` its last four bits for any safe integer (ToUint32/ToInt32
  // reduce modulo 2^32): no floating-point division on the hot path.
  #add(d: number, s: number, bytes: number): void {
    const mis = d & 15;
    if (mis !== 0 && mis === (s & 15)) {
      const head = Math.min(16 - mis, bytes);
      this.#row(d, s, head);
      d += head;
      s += head;
      bytes -= head;
      if (bytes === 0) return;
    }
    this.#row(d, s, bytes);
  }

  #row(d: number, s: number, bytes: number): void {
    const words = this.#words;
    const w = this.#w;
    const c = this.chunks;
    let lo = d >>> 0;
    words[w] = lo; words[w + 1] = (d - lo) / TWO32;
    lo = s >>> 0;
    words[w + 2] = lo; words[w + 3] = (s - lo) / TWO32;
    lo = bytes >>> 0;
    words[w + 4] = lo; words[w + 5] = (bytes - lo) / TWO32;
    lo = c >>> 0;
    words[w + 6] = lo; words[w + 7] = (c - lo) / TWO32;
    this.#w = w + 8;
    this.runs++;
    this.chunks = c + (bytes <= this.chunkBytes ? 1 : Math.ceil(bytes / this.chunkBytes));
  }
}

const TWO32 = 0x1_0000_0000;

/** Whether two lists name the same memories (device: pointer and extent; host: the same view). */
export function sameMemories(a: readonly RunMemory[], b: readonly RunMemory[]): boolean {
  if (a === b) return true;
  if (a.length !== b.length) return false;
  return a.every((x, i) => {
    const y = b[i]!;
    if (x === y) return true;
    if (x.kind === 'device' && y.kind === 'device') return x.pointer === y.pointer && x.extent === y.extent && x.device === y.device;
    return x.kind === 'host' && y.kind === 'host' && x.bytes === y.bytes;
  });
}

/**
 * Whether a copy of `b` would copy what one of `a` did: the same plan pairs (the same objects:
 * a re-plan makes new ones) from and into the same memories. A group that wraps the same pairs
 * and memories in a new batch each sync still reuses its table.
 */
export function sameBatch(a: CopyBatch, b: CopyBatch): boolean {
  if (a === b) return true;
  return a.pairs.length === b.pairs.length && sameMemories(a.destinations, b.destinations) &&
    a.pairs.every((x, i) => x.pair === b.pairs[i]!.pair && sameMemories(x.sources, b.pairs[i]!.sources));
}
