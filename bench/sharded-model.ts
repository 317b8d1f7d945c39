// Layouts of a large MoE model for the sharded planner (bench/sharded-plan.ts and, scaled down,
// test/cpu/sharded-scale.test.ts): a trainer with FSDP (Shard(0) over every rank) and expert
// parallelism (stacked experts on a (ep, fsdp) mesh: Shard(0) on experts, Shard(1) inside),
// and an inference engine with tensor parallelism inside a node (fused qkv and gate_up column
// parallel, o_proj and down row parallel, a vocabulary padded to a multiple of 64) and expert
// parallelism over every GPU (each GPU its experts' fused w13 and w2).
import { LayoutBuilder, tensorParallelParameter, type RankLayout } from '../src/tensors/sharded/index.js';

export interface ModelShape {
  layers: number; // layer 0 dense, the others MoE
  experts: number;
  hidden: number;
  qDim: number;
  kvDim: number;
  moeInter: number;
  sharedInter: number;
  denseInter: number;
  vocab: number;
}

export interface Cluster {
  trainerGpus: number;
  /** Expert-parallel degree of the trainer (the rest of its ranks shard each expert with FSDP). */
  trainerEp: number;
  inferenceGpus: number;
  /** Tensor-parallel degree of the engine (inside a node); expert parallel over all its GPUs. */
  tp: number;
  gpusPerNode: number;
}

/** The 1T-parameter case of issue 37: 61 layers, 384 experts, 256 trainer GPUs, 128 inference GPUs. */
export const ONE_T: { model: ModelShape; cluster: Cluster } = {
  model: { layers: 61, experts: 384, hidden: 7168, qDim: 8192, kvDim: 1024, moeInter: 2048, sharedInter: 2048, denseInter: 18432, vocab: 163_900 },
  cluster: { trainerGpus: 256, trainerEp: 64, inferenceGpus: 128, tp: 8, gpusPerNode: 8 },
};

const DT = 'bfloat16' as const;

interface Tensors { dense: Array<[string, number[]]>; experts: Array<[string, number[]]> }

function tensors(m: ModelShape): Tensors {
  const H = m.hidden;
  const dense: Array<[string, number[]]> = [['embed', [m.vocab, H]], ['lm_head', [m.vocab, H]], ['norm', [H]]];
  const experts: Array<[string, number[]]> = [];
  for (let l = 0; l < m.layers; l++) {
    const p = `layers.${l}.`;
    dense.push([`${p}in_norm`, [H]], [`${p}post_norm`, [H]], [`${p}q`, [m.qDim, H]], [`${p}k`, [m.kvDim, H]], [`${p}v`, [m.kvDim, H]], [`${p}o`, [H, m.qDim]]);
    if (l === 0) {
      dense.push([`${p}gate`, [m.denseInter, H]], [`${p}up`, [m.denseInter, H]], [`${p}down`, [H, m.denseInter]]);
      continue;
    }
    dense.push([`${p}router`, [m.experts, H]], [`${p}shared.gate`, [m.sharedInter, H]], [`${p}shared.up`, [m.sharedInter, H]], [`${p}shared.down`, [H, m.sharedInter]]);
    experts.push([`${p}experts.gate`, [m.experts, m.moeInter, H]], [`${p}experts.up`, [m.experts, m.moeInter, H]], [`${p}experts.down`, [m.experts, H, m.moeInter]]);
  }
  return { dense, experts };
}

/** Every rank's layout: trainer ranks 0..trainerGpus-1 (sources), then the engine's (destinations). */
export function modelLayouts(m: ModelShape, c: Cluster): RankLayout[] {
  const t = tensors(m);
  const out: RankLayout[] = [];
  const fsdpInEp = c.trainerGpus / c.trainerEp;
  for (let r = 0; r < c.trainerGpus; r++) {
    const b = new LayoutBuilder({ rank: r, node: `train${Math.floor(r / c.gpusPerNode)}`, gpu: r % c.gpusPerNode });
    for (const [name, shape] of t.dense) b.hold(name, { dtype: DT, shape, mesh: [c.trainerGpus], placements: [{ shard: 0 }], coordinate: [r] });
    for (const [name, shape] of t.experts) {
      b.hold(name, { dtype: DT, shape, mesh: [c.trainerEp, fsdpInEp], placements: [{ shard: 0 }, { shard: 1 }], coordinate: [Math.floor(r / fsdpInEp), r % fsdpInEp] });
    }
    out.push(b.build());
  }
  const perGpu = Math.ceil(m.experts / c.inferenceGpus);
  for (let i = 0; i < c.inferenceGpus; i++) {
    const r = c.trainerGpus + i;
    const tp = { size: c.tp, rank: i % c.tp };
    const b = new LayoutBuilder({ rank: r, node: `infer${Math.floor(i / c.gpusPerNode)}`, gpu: i % c.gpusPerNode });
    const shape = (name: string): number[] => t.dense.find(([n]) => n === name)?.[1] ?? t.experts.find(([n]) => n === name)![1];
    for (const name of ['embed', 'lm_head']) {
      b.needParameter(name, tensorParallelParameter({ dtype: DT, dim: 0, ...tp, padMultiple: 64, parts: [{ tensor: name, shape: shape(name) }] }));
    }
    b.need('norm', { dtype: DT, shape: [m.hidden] });
    for (let l = 0; l < m.layers; l++) {
      const p = `layers.${l}.`;
      b.need(`${p}in_norm`, { dtype: DT, shape: [m.hidden] }).need(`${p}post_norm`, { dtype: DT, shape: [m.hidden] });
      b.needParameter(`${p}qkv_proj`, tensorParallelParameter({ dtype: DT, dim: 0, ...tp, parts: ['q', 'k', 'v'].map((x) => ({ tensor: p + x, shape: shape(p + x) })) }));
      b.needParameter(`${p}o_proj`, tensorParallelParameter({ dtype: DT, dim: 1, ...tp, parts: [{ tensor: `${p}o`, shape: shape(`${p}o`) }] }));
      const mlp = l === 0 ? p : `${p}shared.`;
      b.needParameter(`${mlp}gate_up_proj`, tensorParallelParameter({ dtype: DT, dim: 0, ...tp, parts: ['gate', 'up'].map((x) => ({ tensor: mlp + x, shape: shape(mlp + x) })) }));
      b.needParameter(`${mlp}down_proj`, tensorParallelParameter({ dtype: DT, dim: 1, ...tp, parts: [{ tensor: `${mlp}down`, shape: shape(`${mlp}down`) }] }));
      if (l === 0) continue;
      b.need(`${p}router`, { dtype: DT, shape: [m.experts, m.hidden] });
      const e0 = Math.min(m.experts, i * perGpu);
      const n = Math.min(m.experts, e0 + perGpu) - e0;
      if (n === 0) continue;
      const gate = shape(`${p}experts.gate`);
      b.needParameter(`${p}experts.w13`, {
        dtype: DT, shape: [n, 2 * m.moeInter, m.hidden], pieces: [
          { tensor: `${p}experts.gate`, shape: gate, start: [e0, 0, 0], length: [n, m.moeInter, m.hidden], at: [0, 0, 0] },
          { tensor: `${p}experts.up`, shape: gate, start: [e0, 0, 0], length: [n, m.moeInter, m.hidden], at: [0, m.moeInter, 0] },
        ],
      });
      b.need(`${p}experts.w2`, { dtype: DT, shape: shape(`${p}experts.down`), start: [e0, 0, 0], length: [n, m.hidden, m.moeInter], tensor: `${p}experts.down` });
    }
    out.push(b.build());
  }
  return out;
}

/** Parameters of the model (elements of every global tensor). */
export function parameterCount(m: ModelShape): number {
  const t = tensors(m);
  return [...t.dense, ...t.experts].reduce((n, [, s]) => n + s.reduce((a, b) => a * b, 1), 0);
}
