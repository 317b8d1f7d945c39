// Boxes from placements, the way torch's DTensor computes a rank's shard (what FSDP2's
// state_dict() gives): for each mesh dimension in order, a Shard(d) placement cuts the current
// extent of tensor dimension d into mesh-size chunks of ceil(n / size) elements, the last shards
// smaller or empty (torch.chunk's rule; DTensor pads the missing chunks as empty ones); Replicate
// leaves the box as it is. Mirrors torch.distributed.tensor._utils.compute_local_shape_and_global_offset
// (python/cuda_ipc/tensors/sharded/placements.py is the Python twin, which also reads DTensors).
// A strided shard ({ shard: d, splitFactor: n }, torch's _StridedShard(d, split_factor=n), what
// FSDP2 over tensor parallelism gives: dimension d split by TP, then by FSDP) cuts the current
// extent of dimension d into n chunks, each of those into mesh-size chunks, and keeps this rank's
// chunk of each, concatenated (torch's _StridedShard._split_tensor): a local tensor that is
// generally several boxes of the global one (placementPieces), not one.
import { LayoutError, type Box } from './errors.js';

/**
 * Shard(d) (split tensor dimension d), _StridedShard(d, split_factor=n) as `{ shard: d, splitFactor: n }`,
 * or Replicate, as DTensor names them.
 */
export type Placement = { readonly shard: number; readonly splitFactor?: number } | 'replicate';

/** A rank's place on a device mesh and how a tensor is laid over it. */
export interface PlacementSpec {
  /** The global tensor's shape. */
  readonly shape: readonly number[];
  /** The device mesh's shape (one entry per mesh dimension). */
  readonly mesh: readonly number[];
  /** One placement per mesh dimension. */
  readonly placements: readonly Placement[];
  /** This rank's coordinate on the mesh. */
  readonly coordinate: readonly number[];
}

/** Shard `index` of `size` elements cut in `chunks`: [start, length], torch.chunk's rule (ceil). */
export function shardRange(size: number, chunks: number, index: number): [number, number] {
  const chunk = Math.ceil(size / chunks);
  const start = chunk * index;
  if (start >= size) return [size, 0];
  return [start, Math.min(size, start + chunk) - start];
}

/** The local tensor of a rank under placements: its shape and its pieces (boxes of the global tensor at offsets `at` of it). */
export interface PlacedPieces {
  readonly shape: number[];
  readonly pieces: Array<{ start: number[]; length: number[]; at: number[] }>;
}

type Segments = Array<[number, number]>;

/** The part `[from, from + length)` of the extent that `segments` (global [start, length] runs, concatenated) make. */
function take(segments: Segments, from: number, length: number, out: Segments): void {
  let at = 0;
  for (const [s, n] of segments) {
    const lo = Math.max(from, at);
    const hi = Math.min(from + length, at + n);
    if (hi > lo) {
      const last = out[out.length - 1];
      const start = s + lo - at;
      if (last && last[0] + last[1] === start) last[1] += hi - lo;
      else out.push([start, hi - lo]);
    }
    at += n;
  }
}

const extentOf = (segments: Segments): number => segments.reduce((n, [, l]) => n + l, 0);

function checked(spec: PlacementSpec, name: string): { bad: (why: string) => LayoutError; strided: boolean } {
  const { shape, mesh, placements, coordinate } = spec;
  const bad = (why: string): LayoutError => new LayoutError('ERR_LAYOUT_INVALID', `${name}: ${why}`, { tensor: name });
  if (mesh.length !== placements.length || mesh.length !== coordinate.length) {
    throw bad(`the mesh has ${mesh.length} dimensions, ${placements.length} placements and a coordinate of ${coordinate.length}; give one of each per mesh dimension`);
  }
  let strided = false;
  for (let i = 0; i < mesh.length; i++) {
    const size = mesh[i]!;
    const at = coordinate[i]!;
    if (!Number.isInteger(size) || size < 1 || !Number.isInteger(at) || at < 0 || at >= size) {
      throw bad(`mesh dimension ${i} has size ${size} and coordinate ${at}; a coordinate is 0..size-1`);
    }
    const p = placements[i]!;
    if (p === 'replicate') continue;
    const d = p?.shard;
    const f = p?.splitFactor;
    if (!Number.isInteger(d) || d! < 0 || d! >= shape.length || (f !== undefined && (!Number.isInteger(f) || f < 1))) {
      throw bad(`placement ${i} is ${JSON.stringify(p)}; use 'replicate', { shard: d } or { shard: d, splitFactor: n } with d in 0..${shape.length - 1} and n >= 1`);
    }
    if (f !== undefined) strided = true;
  }
  return { bad, strided };
}

/**
 * The local tensor a rank holds under `spec`: for each tensor dimension, the global runs whose
 * concatenation it is, and the pieces (one per combination of runs; none when it is empty).
 * Throws LayoutError ERR_LAYOUT_INVALID for a spec that does not fit together.
 */
export function placementPieces(spec: PlacementSpec, name = '(tensor)'): PlacedPieces {
  checked(spec, name);
  const { shape, mesh, placements, coordinate } = spec;
  let runs: Segments[] = shape.map((n) => [[0, n]]);
  for (let i = 0; i < mesh.length; i++) {
    const p = placements[i]!;
    if (p === 'replicate') continue;
    const d = p.shard;
    const n = extentOf(runs[d]!);
    const out: Segments = [];
    if (p.splitFactor === undefined) {
      const [off, len] = shardRange(n, mesh[i]!, coordinate[i]!);
      take(runs[d]!, off, len, out);
    } else {
      // torch's _StridedShard: split_factor chunks, each cut in mesh-size chunks, this rank's of each.
      for (let j = 0; j < p.splitFactor; j++) {
        const [a, la] = shardRange(n, p.splitFactor, j);
        const [b, lb] = shardRange(la, mesh[i]!, coordinate[i]!);
        take(runs[d]!, a + b, lb, out);
      }
    }
    runs = runs.map((r, k) => (k === d ? out : r));
  }
  const local = runs.map(extentOf);
  const pieces: PlacedPieces['pieces'] = [];
  if (local.some((n) => n === 0)) return { shape: local, pieces };
  const k = runs.map(() => 0);
  const offsets = runs.map((r) => { let at = 0; return r.map(([, n]) => { const o = at; at += n; return o; }); });
  for (;;) {
    pieces.push({ start: k.map((x, d) => runs[d]![x]![0]), length: k.map((x, d) => runs[d]![x]![1]), at: k.map((x, d) => offsets[d]![x]!) });
    let d = runs.length - 1;
    while (d >= 0 && ++k[d]! === runs[d]!.length) k[d--] = 0;
    if (d < 0) break;
  }
  return { shape: local, pieces };
}

/**
 * The box of the global tensor a rank holds under `spec` (lengths may be 0: an empty last shard).
 * Throws LayoutError ERR_LAYOUT_INVALID for a spec that does not fit together, or whose strided
 * shards give a local tensor of several boxes (placementPieces gives those).
 */
export function placementBox(spec: PlacementSpec, name = '(tensor)'): Box {
  const { bad, strided } = checked(spec, name);
  const { shape, mesh, placements, coordinate } = spec;
  if (strided) {
    const { shape: local, pieces } = placementPieces(spec, name);
    if (pieces.length > 1) throw bad(`its strided shards make this rank's part ${pieces.length} boxes of the tensor; use placementPieces`);
    if (pieces.length === 1) return { start: pieces[0]!.start, length: pieces[0]!.length };
    return { start: shape.map((n, d) => (local[d] === 0 ? n : 0)), length: local };
  }
  const start = shape.map(() => 0);
  const length = [...shape];
  for (let i = 0; i < mesh.length; i++) {
    const p = placements[i]!;
    if (p === 'replicate') continue;
    const d = p.shard;
    const [off, len] = shardRange(length[d]!, mesh[i]!, coordinate[i]!);
    // torch: an empty shard's offset is the end of the dimension; otherwise shards nest.
    start[d] = len === 0 ? shape[d]! : start[d]! + off;
    length[d] = len;
  }
  return { start, length };
}
