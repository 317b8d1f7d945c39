// Sharded sync groups on host memory for the CPU tests (test/cpu/sharded-group*.test.ts and their
// child test/fixtures/shard-member.ts): the layouts of a small transformer (FSDP Shard(0) sources,
// tensor-parallel destinations with a fused qkv, a row-parallel o_proj and a padded vocabulary),
// HostArrays for a rank's local tensors, sources filled from whole global tensors whose bytes
// depend on a version, and the reference: each destination byte compared with the whole global
// tensor sliced as its pieces say (padding left as allocated).
import { dtypeInfo } from '../../src/ipc/dtype.js';
import { HostArray } from '../../src/tensors/index.js';
import { LayoutBuilder, tensorParallelParameter, type LocalTensor, type RankLayout } from '../../src/tensors/sharded/index.js';
import { byteOffset, eachElement, flatIndex } from './piece-elements.js';

/** What padding and unwritten bytes hold. */
export const SENTINEL = 0xee;
const H = 8; const Q = 8; const KV = 4; const V = 10;
export const GLOBALS: Record<string, number[]> = { q: [Q, H], k: [KV, H], v: [KV, H], o: [H, Q], embed: [V, H], norm: [H] };

/**
 * Ranks of the FSDP -> TP scenario: `sources` trainer ranks (FSDP Shard(0) of every tensor), then
 * `tp` engine ranks; all on node 'n' (host memory: the 'ipc' path). `colocated`: engine i is also
 * trainer i (its own rank holds its shard: a 'local' pair beside the 'ipc' ones).
 */
export interface Scenario {
  sources: number;
  tp: number;
  colocated?: boolean;
  vocab?: number;
  /** GPUs the ranks spread over (rank r on GPU r % gpus); default: GPU r (host memory ignores it). */
  gpus?: number;
  /** Each rank its own node id (`n<rank>`): pairs between ranks go over NCCL. */
  nodePerRank?: boolean;
  /** Engine replicas (data parallel), each of `tp` ranks needing its own slices (not with `colocated`); default 1. */
  replicas?: number;
  /** Engine ranks that do not need 'norm' (a layout change one rank can make alone: relayout). */
  withoutNorm?: number[];
}

export function scenarioLayout(rank: number, opts: Scenario): RankLayout {
  const dtype = 'bfloat16' as const;
  const globals: Record<string, number[]> = { ...GLOBALS, embed: [opts.vocab ?? V, H] };
  const b = new LayoutBuilder({ rank, node: opts.nodePerRank ? `n${rank}` : 'n', gpu: opts.gpus ? rank % opts.gpus : rank });
  const trainer = rank < opts.sources;
  const engine = opts.colocated ? rank < opts.tp : rank >= opts.sources && rank < opts.sources + opts.tp * (opts.replicas ?? 1);
  if (trainer) for (const [name, shape] of Object.entries(globals)) b.hold(`${name}.shard`, { dtype, shape, tensor: name, mesh: [opts.sources], placements: [{ shard: 0 }], coordinate: [rank] });
  if (engine) {
    const t = opts.colocated ? rank : (rank - opts.sources) % opts.tp;
    b.needParameter('qkv_proj', tensorParallelParameter({ dtype, dim: 0, size: opts.tp, rank: t, parts: [{ tensor: 'q', shape: globals.q! }, { tensor: 'k', shape: globals.k! }, { tensor: 'v', shape: globals.v! }] }));
    b.needParameter('o_proj', tensorParallelParameter({ dtype, dim: 1, size: opts.tp, rank: t, parts: [{ tensor: 'o', shape: globals.o! }] }));
    b.needParameter('embed_tokens', tensorParallelParameter({ dtype, dim: 0, size: opts.tp, rank: t, padMultiple: 8, parts: [{ tensor: 'embed', shape: globals.embed! }] }));
    if (!opts.withoutNorm?.includes(rank)) b.need('norm', { dtype, shape: globals.norm! });
  }
  return b.build();
}

/** The byte at `flat` of global tensor `tensor` in version `version`. */
export function globalByte(tensor: string, flat: number, version: number): number {
  let h = 2166136261 ^ version;
  for (let i = 0; i < tensor.length; i++) h = Math.imul(h ^ tensor.charCodeAt(i), 16777619);
  h = Math.imul(h ^ flat, 2246822519);
  h ^= h >>> 13;
  h = Math.imul(h, 3266489917);
  return (h ^ (h >>> 16)) & 0xff;
}

/** HostArrays for a layout's local tensors (filled with SENTINEL). */
export function allocate(locals: readonly LocalTensor[]): HostArray[] {
  return locals.map((l) => {
    const a = HostArray.allocate(l.dtype, l.shape);
    a.buffer.bytes.fill(SENTINEL);
    return a;
  });
}

/** Writes version `version` of the global tensors into a rank's source arrays. */
export function fillSources(layout: RankLayout, arrays: readonly HostArray[], version: number): void {
  const shapes = new Map(layout.tensors.map((t) => [t.name, t.shape]));
  layout.sources.forEach((local, i) => {
    const mem = arrays[i]!.buffer.bytes;
    const size = dtypeInfo(local.dtype).itemsize;
    for (const p of local.pieces) {
      eachElement(p.start, p.length, p.at, (g, l) => {
        const f = flatIndex(shapes.get(p.tensor)!, g) * size;
        const o = byteOffset(local.strides, l);
        for (let b = 0; b < size; b++) mem[o + b] = globalByte(p.tensor, f + b, version);
      });
    }
  });
}

/** Problems of a rank's destinations against version `version` sliced from whole tensors (empty: exact). */
export function checkDestinations(layout: RankLayout, arrays: readonly HostArray[], version: number): string[] {
  const shapes = new Map(layout.tensors.map((t) => [t.name, t.shape]));
  const problems: string[] = [];
  layout.destinations.forEach((local, i) => {
    const mem = arrays[i]!.buffer.bytes.subarray(0, arrays[i]!.extent);
    const size = dtypeInfo(local.dtype).itemsize;
    const expected = new Int16Array(mem.length).fill(SENTINEL);
    for (const p of local.pieces) {
      // The whole global tensor of this version, then its box sliced out.
      const shape = shapes.get(p.tensor)!;
      const whole = new Uint8Array(shape.reduce((a, b) => a * b, size));
      for (let f = 0; f < whole.length; f++) whole[f] = globalByte(p.tensor, f, version);
      eachElement(p.start, p.length, p.at, (g, l) => {
        const f = flatIndex(shape, g) * size;
        const o = byteOffset(local.strides, l);
        for (let b = 0; b < size; b++) expected[o + b] = whole[f + b]!;
      });
    }
    for (let o = 0; o < mem.length && problems.length < 10; o++) {
      if (mem[o] !== expected[o]) problems.push(`rank ${layout.rank} ${local.name} byte ${o}: ${mem[o]} instead of ${expected[o]}`);
    }
  });
  return problems;
}
