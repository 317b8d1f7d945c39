// Boxes from placements, the way torch's DTensor computes a rank's shard (what FSDP2's
// state_dict() gives): for each mesh dimension in order, a Shard(d) placement cuts the current
// extent of tensor dimension d into mesh-size chunks of ceil(n / size) elements, the last shards
// smaller or empty (torch.chunk's rule; DTensor pads the missing chunks as empty ones); Replicate
// leaves the box as it is. Mirrors torch.distributed.tensor._utils.compute_local_shape_and_global_offset
// (python/cuda_ipc/tensors/sharded/placements.py is the Python twin, which also reads DTensors).
import { LayoutError, type Box } from './errors.js';

/** Shard(d) (split tensor dimension d) or Replicate, as DTensor names them. */
export type Placement = { readonly shard: number } | 'replicate';

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

/**
 * The box of the global tensor a rank holds under `spec` (lengths may be 0: an empty last shard).
 * Throws LayoutError ERR_LAYOUT_INVALID for a spec that does not fit together.
 */
export function placementBox(spec: PlacementSpec, name = '(tensor)'): Box {
  const { shape, mesh, placements, coordinate } = spec;
  const bad = (why: string): LayoutError => new LayoutError('ERR_LAYOUT_INVALID', `${name}: ${why}`, { tensor: name });
  if (mesh.length !== placements.length || mesh.length !== coordinate.length) {
    throw bad(`the mesh has ${mesh.length} dimensions, ${placements.length} placements and a coordinate of ${coordinate.length}; give one of each per mesh dimension`);
  }
  const start = shape.map(() => 0);
  const length = [...shape];
  for (let i = 0; i < mesh.length; i++) {
    const size = mesh[i]!;
    const at = coordinate[i]!;
    if (!Number.isInteger(size) || size < 1 || !Number.isInteger(at) || at < 0 || at >= size) {
      throw bad(`mesh dimension ${i} has size ${size} and coordinate ${at}; a coordinate is 0..size-1`);
    }
    const p = placements[i]!;
    if (p === 'replicate') continue;
    const d = p?.shard;
    if (!Number.isInteger(d) || d! < 0 || d! >= shape.length) {
      throw bad(`placement ${i} is ${JSON.stringify(p)}; use 'replicate' or { shard: d } with d in 0..${shape.length - 1}`);
    }
    const [off, len] = shardRange(length[d!]!, size, at);
    // torch: an empty shard's offset is the end of the dimension; otherwise shards nest.
    start[d!] = len === 0 ? shape[d!]! : start[d!]! + off;
    length[d!] = len;
  }
  return { start, length };
}
