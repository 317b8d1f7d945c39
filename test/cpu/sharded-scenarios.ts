// Layouts of sharded-weight scenarios for the planner's tests (sharded-plan.test.ts, the Node/Python
// agreement test): FSDP sources (Shard(0), uneven), Shard(1), replicated (HSDP) sources on two nodes,
// tensor-parallel destinations with fused qkv / gate_up and a padded vocabulary, expert parallel.
import { LayoutBuilder, tensorParallelParameter, type Placement, type RankLayout } from '../../src/tensors/sharded/index.js';

export interface Scenario { name: string; layouts: RankLayout[] }

const H = 6; // hidden
const Q = 8; const KV = 4; const I = 6; const V = 10; const E = 4;

/** Trainer ranks 0..sources-1 hold every tensor with `placements` on a mesh; inference ranks need a TP layout. */
export function scenarios(): Scenario[] {
  const out: Scenario[] = [];
  const globals: Record<string, number[]> = {
    q: [Q, H], k: [KV, H], v: [KV, H], o: [H, Q], gate: [I, H], up: [I, H], down: [H, I], embed: [V, H], norm: [H], experts: [E, I, H],
  };
  const dtype = 'bfloat16' as const;
  const trainer = (rank: number, node: string, gpu: number, mesh: number[], coord: number[], place: (name: string) => Placement[]): LayoutBuilder => {
    const b = new LayoutBuilder({ rank, node, gpu });
    for (const [name, shape] of Object.entries(globals)) b.hold(name, { dtype, shape, mesh, placements: place(name), coordinate: coord });
    return b;
  };
  const engine = (rank: number, node: string, gpu: number, tp: number, tpRank: number): RankLayout => {
    const b = new LayoutBuilder({ rank, node, gpu });
    b.needParameter('qkv_proj', tensorParallelParameter({ dtype, dim: 0, size: tp, rank: tpRank, parts: [{ tensor: 'q', shape: globals.q! }, { tensor: 'k', shape: globals.k! }, { tensor: 'v', shape: globals.v! }] }));
    b.needParameter('o_proj', tensorParallelParameter({ dtype, dim: 1, size: tp, rank: tpRank, parts: [{ tensor: 'o', shape: globals.o! }] }));
    b.needParameter('gate_up_proj', tensorParallelParameter({ dtype, dim: 0, size: tp, rank: tpRank, parts: [{ tensor: 'gate', shape: globals.gate! }, { tensor: 'up', shape: globals.up! }] }));
    b.needParameter('down_proj', tensorParallelParameter({ dtype, dim: 1, size: tp, rank: tpRank, parts: [{ tensor: 'down', shape: globals.down! }] }));
    b.needParameter('embed_tokens', tensorParallelParameter({ dtype, dim: 0, size: tp, rank: tpRank, padMultiple: 8, parts: [{ tensor: 'embed', shape: globals.embed! }] }));
    b.need('norm', { dtype, shape: globals.norm! });
    // Expert parallel: expert tpRank's gate slice of the stacked experts, as a 3-D box.
    b.need('experts', { dtype, shape: globals.experts!, start: [tpRank % E, 0, 0], length: [1, I, H] });
    return b.build();
  };
  // FSDP over 4 ranks, Shard(0) (uneven: 10 rows -> 3,3,3,1; 4 -> 1 each; 6 -> 2,2,2,0), TP 2 engines on another node.
  out.push({ name: 'fsdp Shard(0) -> tp2', layouts: [
    ...[0, 1, 2, 3].map((r) => trainer(r, 'train', r, [4], [r], () => [{ shard: 0 }]).build()),
    engine(4, 'infer', 0, 2, 0), engine(5, 'infer', 1, 2, 1),
  ] });
  // Shard(1) sources (dim 0 for the 1-D norm), colocated with the engines (same node, same GPUs).
  out.push({ name: 'Shard(1) -> tp3 colocated', layouts: [
    ...[0, 1, 2].map((r) => trainer(r, 'n0', r, [3], [r], (name) => [{ shard: name === 'norm' ? 0 : 1 }]).build()),
    engine(3, 'n0', 0, 3, 0), engine(4, 'n0', 1, 3, 1), engine(5, 'n0', 2, 3, 2),
  ] });
  // HSDP: mesh (replicate 2, shard 2) over two nodes; two engine replicas (data parallel), one per node.
  out.push({ name: 'hsdp Replicate x Shard(0) -> 2 replicas of tp2', layouts: [
    ...[0, 1, 2, 3].map((r) => trainer(r, r < 2 ? 'a' : 'b', r % 2, [2, 2], [r >> 1, r & 1], () => ['replicate', { shard: 0 }]).build()),
    engine(4, 'a', 2, 2, 0), engine(5, 'a', 3, 2, 1), engine(6, 'b', 2, 2, 0), engine(7, 'b', 3, 2, 1),
  ] });
  // 2-D mesh nesting Shard(0) twice (2 x 3), plus a transposed (strided) local source on one rank.
  out.push({ name: 'Shard(0) x Shard(1) 2x3 -> tp2', layouts: [
    ...[0, 1, 2, 3, 4, 5].map((r) => trainer(r, 't', r, [2, 3], [Math.floor(r / 3), r % 3], (name) => (name === 'norm' ? [{ shard: 0 }, { shard: 0 }] : [{ shard: 0 }, { shard: 1 }])).build()),
    engine(6, 'i', 0, 2, 0), engine(7, 'i', 1, 2, 1),
  ] });
  // FSDP2 over tensor parallelism: _StridedShard(0, split_factor 2) on the FSDP mesh dimension, then
  // Shard(0) on the TP one (2 x 3): uneven extents make some ranks' local tensors several boxes.
  out.push({ name: '_StridedShard(0, 2) x Shard(0) 2x3 -> tp2', layouts: [
    ...[0, 1, 2, 3, 4, 5].map((r) => trainer(r, 's', r, [2, 3], [Math.floor(r / 3), r % 3], () => [{ shard: 0, splitFactor: 2 }, { shard: 0 }]).build()),
    engine(6, 'i', 0, 2, 0), engine(7, 'i', 1, 2, 1),
  ] });
  // Sources whose boxes partly overlap (not DTensor-shaped): the planner's grid of their edges.
  // A 0-d scalar held by two ranks (replicas), needed by both destinations.
  const part = (rank: number, node: string, start: number[], length: number[]) => {
    const b = new LayoutBuilder({ rank, node, gpu: rank }).hold('w', { dtype: 'float32', shape: [10, 4], start, length });
    if (rank < 2) b.hold('scale', { dtype: 'float32', shape: [] });
    return b.build();
  };
  out.push({ name: 'partly overlapping sources -> grid', layouts: [
    part(0, 'x', [0, 0], [6, 4]), part(1, 'x', [4, 0], [6, 4]), part(2, 'y', [0, 0], [10, 2]),
    new LayoutBuilder({ rank: 3, node: 'y', gpu: 3 }).need('w', { dtype: 'float32', shape: [10, 4] }).need('scale', { dtype: 'float32', shape: [] }).build(),
    new LayoutBuilder({ rank: 4, node: 'z', gpu: 0 }).need('w', { dtype: 'float32', shape: [10, 4], start: [2, 1], length: [6, 3] }).need('scale', { dtype: 'float32', shape: [] }).build(),
  ] });
  return out;
}
