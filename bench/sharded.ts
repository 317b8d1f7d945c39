// `npm run bench:sharded` (SHARDED_GB=8, SHARDED_GPUS=1|2, SHARDED_SYNCS=10, SHARDED_CHUNK_MB=64)
//
// The sharded sync's device data paths (issue 37), driven directly in one process (without the
// group): a dense bf16 transformer of about SHARDED_GB GiB (fused qkv and gate_up column parallel,
// o_proj and down row parallel, an embedding and lm_head with a vocabulary padded to 64 rows),
// held by 2 source ranks (FSDP, Shard(0)) and needed by 2 destination ranks (tensor parallel 2),
// source i and destination i on GPU i (both on GPU 0 with one GPU). Rows, each way in the same run:
//   - the limit: a plain cuMemcpyDtoDAsync of each pair's byte count, per destination on its own
//     stream (the bandwidth each destination gets from each source; the slowest decides);
//   - ours, CUDA IPC path: each destination's runs in one copy_runs launch (deviceRunCopier), the
//     first sync (rows built, table uploaded) and repeated syncs;
//   - the common way (issue 37's): an all-gather on the sources (each source rank copies every
//     shard into its own whole model, with the copier), a broadcast from rank 0 (its whole model
//     copied into each destination's with cuMemcpy), then each destination copies its slice out;
//   - with NCCL: the NCCL path (ncclRunMover; every rank declared on its own node and run as a
//     child process of this bench, sending and receiving in the same rounds, local runs copied
//     beside), against the limit of NCCL send/recv of the same byte counts (one group per rank);
//     the slowest rank's time of each sync counts. Three layouts: the same two ranks colocated
//     (each an FSDP source and a TP destination), sources on ranks 0-1 and destinations on 2-3,
//     and two TP2 replicas (data parallel) on ranks 2-5. On NCCL's own path (two GPUs: NVLink there) and
//     on its forced network path (P2P and SHM off, sockets over loopback, each rank an NCCL host of
//     its own via NCCL_HOSTID: as between two machines, and possible with both ranks on one GPU);
//     chunks per pair as the group cuts them (the plan's chunk over the busier rank's streams);
//     the mover's two staging slots (its default: copies overlap the transfers) and, for the
//     colocated layout, one (half the staging).
// Values are checked after each way: every contiguous piece of every destination tensor in full
// and sampled rows of the row-parallel ones, against the sources' pattern (verifyPattern on the GPU).
// SHARDED_NCCL=0 leaves the NCCL rows out.
// Without a GPU: the plan's figures only, and why nothing was measured (exit 0).
import { performance } from 'node:perf_hooks';
import { spawn as spawnChild } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { probeDriver, driver } from '../src/cuda/driver.js';
import { Device } from '../src/cuda/device.js';
import { DeviceBuffer } from '../src/cuda/buffer.js';
import { Stream } from '../src/cuda/stream.js';
import { BuiltinKernels } from '../src/cuda/builtins.js';
import { dtypeInfo } from '../src/ipc/dtype.js';
import { asNcclUniqueId, loadNccl, NcclCommunicator, type NcclLibrary } from '../src/nccl/index.js';
import {
  LayoutBuilder, planSharded, tensorParallelParameter, type LocalTensor, type RankLayout, type ShardPlan,
} from '../src/tensors/sharded/index.js';
import type { CopyBatch, RunCopier, RunMemory } from '../src/tensors/sharded/execute-types.js';
import { batchTable, deviceRunCopier } from '../src/tensors/sharded/device-copy.js';
import { CHUNK_BYTES, loadTensorKernels } from '../src/tensors/kernels.js';
import { ncclRunMover } from '../src/tensors/sharded/nccl-runs.js';
import { ncclChunkBytes } from '../src/tensors/sharded/pair-stream.js';
import { printTable, summarize, type Row, type Summary } from './stats.js';
import { asOwnHost } from './nccl-env.js';

const env = (name: string, fallback: number): number => {
  const v = process.env[name] === undefined ? fallback : Number(process.env[name]);
  if (!Number.isFinite(v) || v <= 0) {
    console.error(`bench:sharded: ${name} must be a positive number`);
    process.exit(2);
  }
  return v;
};
process.env.NCCL_NVLS_ENABLE ??= '0';  // before NCCL reads it: never NVLink SHARP (cuMulticastCreate)
const probe = probeDriver();
const noGpu = !probe.ok ? probe.error.message : driver.deviceGetCount() === 0 ? 'the CUDA driver sees no device' : undefined;
const deviceCount = noGpu ? 0 : driver.deviceGetCount();
const GIB = 2 ** 30;
const gib = env('SHARDED_GB', 8);
const gpus = Math.min(env('SHARDED_GPUS', Math.min(2, deviceCount || 1)), deviceCount) >= 2 ? 2 : 1;
const syncs = Math.max(1, Math.round(env('SHARDED_SYNCS', 10)));
const chunkBytes = Math.round(env('SHARDED_CHUNK_MB', 64) * 2 ** 20);
const DT = 'bfloat16' as const;
const ITEM = dtypeInfo(DT).itemsize;

// --- the model ---------------------------------------------------------------------------------
const H = 4096; const Q = 4096; const KV = 1024; const I = 14336;
// Odd: the TP halves are padded to 64 rows. Smaller for a model under 4 GiB, so that layers remain.
const VOCAB = gib >= 4 ? 128_259 : Math.max(259, Math.floor((gib * GIB) / 8 / (2 * H * ITEM)) | 1);
const layerBytes = (2 * Q * H + 2 * KV * H + 3 * I * H + 2 * H) * ITEM;
const headBytes = (2 * VOCAB * H + H) * ITEM;
const layers = Math.max(1, Math.round((gib * GIB - headBytes) / layerBytes));
const globals: Array<[string, number[]]> = [['embed', [VOCAB, H]], ['lm_head', [VOCAB, H]], ['norm', [H]]];
for (let l = 0; l < layers; l++) {
  const p = `layers.${l}.`;
  globals.push([`${p}in_norm`, [H]], [`${p}post_norm`, [H]], [`${p}q`, [Q, H]], [`${p}k`, [KV, H]], [`${p}v`, [KV, H]], [`${p}o`, [H, Q]],
    [`${p}gate`, [I, H]], [`${p}up`, [I, H]], [`${p}down`, [H, I]]);
}
const shapeOf = new Map(globals);
const modelBytes = globals.reduce((n, [, s]) => n + s.reduce((a, b) => a * b, ITEM), 0);

function holder(b: LayoutBuilder, i: number): LayoutBuilder {
  for (const [name, shape] of globals) b.hold(name, { dtype: DT, shape, mesh: [2], placements: [{ shard: 0 }], coordinate: [i] });
  return b;
}
function needer(b: LayoutBuilder, tp: number): LayoutBuilder {
  const part = (name: string) => ({ tensor: name, shape: shapeOf.get(name)! });
  const t = { dtype: DT, size: 2, rank: tp };
  for (const name of ['embed', 'lm_head']) b.needParameter(name, tensorParallelParameter({ ...t, dim: 0, padMultiple: 64, parts: [part(name)] }));
  b.need('norm', { dtype: DT, shape: [H] });
  for (let l = 0; l < layers; l++) {
    const p = `layers.${l}.`;
    b.need(`${p}in_norm`, { dtype: DT, shape: [H] }).need(`${p}post_norm`, { dtype: DT, shape: [H] });
    b.needParameter(`${p}qkv_proj`, tensorParallelParameter({ ...t, dim: 0, parts: ['q', 'k', 'v'].map((x) => part(p + x)) }));
    b.needParameter(`${p}o_proj`, tensorParallelParameter({ ...t, dim: 1, parts: [part(`${p}o`)] }));
    b.needParameter(`${p}gate_up_proj`, tensorParallelParameter({ ...t, dim: 0, parts: [part(`${p}gate`), part(`${p}up`)] }));
    b.needParameter(`${p}down_proj`, tensorParallelParameter({ ...t, dim: 1, parts: [part(`${p}down`)] }));
  }
  return b;
}
const gpuOf = (i: number): number => (gpus === 2 ? i : 0);

// --- memory: one allocation per rank, its local tensors at 256-byte boundaries ------------------
function extentOf(local: LocalTensor): number {
  if (local.shape.some((n) => n === 0)) return 0;
  let e = ITEM;
  local.shape.forEach((n, i) => { e += (n - 1) * local.strides[i]!; });
  return e;
}
interface Placed { buffer: DeviceBuffer; device: Device; src: RunMemory[]; dst: RunMemory[]; srcAt: number[]; dstAt: number[] }
function place(layout: RankLayout): Placed {
  const device = Device.get(layout.gpu);
  let end = 0;
  const offsets = (ts: readonly LocalTensor[]): number[] => ts.map((t) => {
    const at = end;
    end = Math.ceil((at + extentOf(t)) / 256) * 256;
    return at;
  });
  const srcAt = offsets(layout.sources);
  const dstAt = offsets(layout.destinations);
  const buffer = DeviceBuffer.allocate(Math.max(end, 256), { device });
  const mem = (at: number, t: LocalTensor): RunMemory => ({ kind: 'device', device, pointer: buffer.devicePointer + BigInt(at), extent: extentOf(t) });
  return { buffer, device, src: layout.sources.map((t, i) => mem(srcAt[i]!, t)), dst: layout.destinations.map((t, i) => mem(dstAt[i]!, t)), srcAt, dstAt };
}

// --- values: global u32 word j of tensor T holds seed(T) + j ------------------------------------
function seedOf(name: string, epoch: number): number {
  let h = 2166136261 ^ epoch;
  for (let i = 0; i < name.length; i++) h = Math.imul(h ^ name.charCodeAt(i), 16777619);
  return h >>> 0;
}
const rowBytesOf = (shape: readonly number[]): number => shape.slice(1).reduce((a, b) => a * b, ITEM);

/** Fills a rank's source tensors (FSDP row blocks: each one range of its global tensor's bytes). */
function fillSources(layout: RankLayout, p: Placed, epoch: number): void {
  const kernels = BuiltinKernels.for(p.device);
  layout.sources.forEach((t, i) => {
    for (const piece of t.pieces) {
      const global = shapeOf.get(piece.tensor)!;
      const rowBytes = rowBytesOf(global);
      const bytes = piece.length.reduce((a, b) => a * b, ITEM);
      if (bytes === 0) continue;
      const view = p.buffer.view(p.srcAt[i]! + (piece.at[0] ?? 0) * (t.strides[0] ?? 0), bytes);
      try {
        kernels.fillPattern(view, 'u32', (seedOf(piece.tensor, epoch) + (piece.start[0] ?? 0) * rowBytes / 4) >>> 0, 1);
      } finally {
        view.close();
      }
    }
  });
  p.device.synchronize();
}

/** Checks a rank's destinations: whole-row pieces in full, column slices on 8 sampled rows each. Returns the mismatching ranges. */
async function checkDestinations(layout: RankLayout, p: Placed, epoch: number): Promise<string[]> {
  const kernels = BuiltinKernels.for(p.device);
  const bad: string[] = [];
  const check = async (what: string, offset: number, bytes: number, globalByte: number, tensor: string): Promise<void> => {
    const view = p.buffer.view(offset, bytes);
    const r = await kernels.verifyPattern(view, 'u32', (seedOf(tensor, epoch) + globalByte / 4) >>> 0, 1).finally(() => view.close());
    if (r.mismatches !== 0n && bad.length < 5) bad.push(`${what}: ${r.mismatches} words differ`);
  };
  for (const [i, t] of layout.destinations.entries()) {
    for (const piece of t.pieces) {
      const global = shapeOf.get(piece.tensor)!;
      const rowBytes = rowBytesOf(global);
      const at = p.dstAt[i]! + (piece.at[0] ?? 0) * (t.strides[0] ?? 0);
      if (global.length === 1 || (piece.start[1] === 0 && piece.length[1] === global[1] && t.shape[1] === global[1])) {
        await check(`${t.name} <- ${piece.tensor}`, at, piece.length.reduce((a, b) => a * b, ITEM), (piece.start[0] ?? 0) * rowBytes, piece.tensor);
        continue;
      }
      const rows = piece.length[0]!;
      for (const k of new Set([0, 1, rows >> 2, rows >> 1, (3 * rows) >> 2, rows - 2, rows - 1].filter((x) => x >= 0 && x < rows))) {
        const local = at + k * t.strides[0]! + piece.at[1]! * ITEM;
        const g = (piece.start[0]! + k) * rowBytes + piece.start[1]! * ITEM;
        await check(`${t.name} <- ${piece.tensor} row ${k}`, local, piece.length[1]! * ITEM, g, piece.tensor);
      }
    }
  }
  return bad;
}

// --- timing -------------------------------------------------------------------------------------
async function timed(n: number, once: () => Promise<void>): Promise<number[]> {
  const out: number[] = [];
  for (let i = 0; i < n; i++) {
    const t0 = performance.now();
    await once();
    out.push(performance.now() - t0);
  }
  return out;
}
const rows: Row[] = [];
/** Wrong values found after a way ran (printed after the table; the exit code is then 1). */
const wrong: string[] = [];
const gb = (bytes: number, ms: number): string => `${(bytes / ms / 1e6).toFixed(1)} GB/s`;
const row = (name: string, s: Summary | number, bytes: number, notes: string[] = []): void => {
  const sum = typeof s === 'number' ? { median: s, p99: undefined, n: 1 } : s;
  const r: Row = { name, unit: 'ms', median: sum.median, p99: sum.p99, n: sum.n, notes: [gb(bytes, sum.median), ...notes] };
  rows.push(r);
  // As it is measured too (the whole run takes minutes; one cut short by a time limit keeps its rows).
  console.error(`  [${name}] median ${sum.median.toFixed(2)} ms${sum.p99 === undefined ? '' : `, p99 ${sum.p99.toFixed(2)} ms`}; ${r.notes!.join('; ')}`);
};
const verdict = (ok: boolean): string => (ok ? 'MET' : 'MISSED');

// --- the CUDA IPC path --------------------------------------------------------------------------
/** The IPC case's layouts and plans: ours, and the common way's gather and slices. */
function ipcPlans() {
  const sources = [0, 1].map((i) => holder(new LayoutBuilder({ rank: i, node: 'n', gpu: gpuOf(i) }), i).build());
  const dests = [0, 1].map((i) => needer(new LayoutBuilder({ rank: 2 + i, node: 'n', gpu: gpuOf(i) }), i).build());
  // The common way's whole copies: destinations of the sources (the all-gather), then sources of the destinations.
  const wholeNeed = new LayoutBuilder({ rank: 4, node: 'n', gpu: 0 });
  const wholeHold = new LayoutBuilder({ rank: 4, node: 'n', gpu: 0 });
  for (const [name, shape] of globals) {
    wholeNeed.need(name, { dtype: DT, shape });
    wholeHold.hold(name, { dtype: DT, shape });
  }
  const t0 = performance.now();
  const plan = planSharded([...sources, ...dests]);
  const planMs = performance.now() - t0;
  const whole = wholeNeed.build();
  const gatherPlan = planSharded([...sources, whole]);
  const slicePlan = planSharded([wholeHold.build(), ...dests]);
  const moved = plan.pairs.reduce((n, p) => n + p.bytes, 0);
  console.log(`model: ${layers} layers, ${globals.length} tensors, ${(modelBytes / GIB).toFixed(2)} GiB bf16; 2 FSDP sources -> 2 TP destinations on ${gpus} GPU(s)`);
  console.log(`plan: ${plan.pairs.length} pairs (${[...new Set(plan.pairs.map((p) => p.path))].join(', ')}), ${(moved / GIB).toFixed(2)} GiB moved, ${plan.pairs.reduce((n, p) => n + p.runs.length / 8, 0)} runs, planned in ${planMs.toFixed(0)} ms; ` +
    `the common way: ${(2 * gatherPlan.pairs.reduce((n, p) => n + p.bytes, 0) / GIB).toFixed(2)} GiB all-gathered (each source rank the whole), ${(2 * modelBytes / GIB).toFixed(2)} GiB broadcast (the whole to each destination), ${(slicePlan.pairs.reduce((n, p) => n + p.bytes, 0) / GIB).toFixed(2)} GiB sliced`);
  return { sources, dests, whole, plan, gatherPlan, slicePlan, moved };
}

async function ipcPath(): Promise<void> {
  const devices = [...new Set([0, 1].map(gpuOf))].map((g) => Device.get(g));
  if (devices.length === 2) {
    devices[0]!.enablePeerAccess(devices[1]!);
    devices[1]!.enablePeerAccess(devices[0]!);
  }
  console.log(`GPUs: ${devices.map((d) => `${d.ordinal}: ${d.name}`).join(', ')}`);
  const { sources, dests, whole: wholeLayout, plan, gatherPlan, slicePlan, moved } = ipcPlans();
  const placed = new Map<number, Placed>();
  for (const l of [...sources, ...dests]) placed.set(l.rank, place(l));
  // The common way's whole copies: one per source rank (the all-gather's), one per destination (what rank 0 broadcasts).
  const sourceWholes = sources.map((l) => place({ ...wholeLayout, gpu: l.gpu }));
  const destWholes = dests.map((l) => place({ ...wholeLayout, gpu: l.gpu }));

  const batch = (p: ShardPlan, dst: number, sourcesOf: (rank: number) => readonly RunMemory[], into: readonly RunMemory[]): CopyBatch =>
    ({ pairs: p.pairs.filter((x) => x.dst === dst).map((pair) => ({ pair, sources: sourcesOf(pair.src) })), destinations: into });
  const ourBatches = dests.map((d) => ({ device: Device.get(d.gpu), batch: batch(plan, d.rank, (r) => placed.get(r)!.src, placed.get(d.rank)!.dst) }));
  // One copier per destination (two destinations on one GPU share none: a copier runs one batch at a time).
  // As the group does at its setup: the copy kernels loaded before the first sync.
  for (const d of dests) loadTensorKernels(Device.get(d.gpu));
  const ourCopiers = dests.map((d) => deviceRunCopier(Device.get(d.gpu)));
  const ours = (): Promise<void> => Promise.all(ourBatches.map((b, i) => ourCopiers[i]!.copy(b.batch))).then(() => {});
  let epoch = 1;
  const fill = (): void => { epoch++; for (const s of sources) fillSources(s, placed.get(s.rank)!, epoch); };
  const verify = async (way: string): Promise<void> => {
    for (const d of dests) {
      const bad = await checkDestinations(d, placed.get(d.rank)!, epoch);
      if (bad.length) wrong.push(`${way}: destination rank ${d.rank} holds wrong values: ${bad.join('; ')}`);
    }
  };
  const clear = (): void => {
    for (const d of dests) {
      Device.get(d.gpu).activate();  // memset in the memory's own context
      placed.get(d.rank)!.buffer.fill(0);
    }
    for (const d of devices) d.synchronize();
  };

  // The limit: each pair's bytes as one plain copy, per destination on its stream.
  const streams = dests.map((d) => Stream.create(Device.get(d.gpu)));
  const limit = async (): Promise<void> => {
    dests.forEach((d, i) => {
      const into = placed.get(d.rank)!.buffer.devicePointer;
      Device.get(d.gpu).activate();
      for (const pair of plan.pairs.filter((x) => x.dst === d.rank)) driver.memcpyDtoDAsync(into, placed.get(pair.src)!.buffer.devicePointer, pair.bytes, streams[i]!.handle);
    });
    await Promise.all(streams.map((s) => s.synchronize()));
  };
  const limitMs = summarize(await timed(syncs + 1, limit).then((t) => t.slice(1)));
  row('limit: plain cuMemcpy of each pair\'s bytes', limitMs, moved);

  fill();
  clear();
  const first = (await timed(1, ours))[0]!;
  await verify('ours, first sync');
  const repeated = summarize(await timed(syncs, async () => { await ours(); }));
  fill();
  await ours();
  await verify('ours, repeated sync with new values');
  // Where the first sync goes: the same first sync with fresh copiers (the kernels' module already
  // loaded in this process), and the tables' CPU build alone (rows and copy_runs table, per destination).
  const fresh = dests.map((d) => deviceRunCopier(Device.get(d.gpu)));
  const t0 = performance.now();
  await Promise.all(ourBatches.map((b, i) => fresh[i]!.copy(b.batch)));
  const freshMs = performance.now() - t0;
  for (const c of fresh) await c.close();
  const builds = ourBatches.map((b) => {
    const t = performance.now();
    const table = batchTable(b.batch, CHUNK_BYTES);
    return { ms: performance.now() - t, rows: table.runs };
  });
  const phases = `first sync with the module loaded: ${freshMs.toFixed(1)} ms; building each destination's table on the CPU: ${builds.map((b) => `${b.ms.toFixed(1)} ms (${b.rows} rows)`).join(', ')}`;
  row('ours (CUDA IPC path): first sync', first, moved, [`${(first / repeated.median).toFixed(1)}x a repeated sync (target <= 10x: ${verdict(first <= 10 * repeated.median)}); ${phases}`]);
  row('ours (CUDA IPC path): repeated sync', repeated, moved, [`${(repeated.median / limitMs.median).toFixed(2)}x the limit (target <= 1.3x: ${verdict(repeated.median <= 1.3 * limitMs.median)})`]);

  // The common way (the issue's): an all-gather on the sources (each source rank copies every
  // source's shard into its whole model), a broadcast from rank 0 (rank 0's whole model copied into
  // each destination's), then each destination copies its slice out of its whole copy.
  const gatherCopiers = sources.map((l) => deviceRunCopier(Device.get(l.gpu)));
  const gatherBatches = sourceWholes.map((w) => batch(gatherPlan, 4, (r) => placed.get(r)!.src, w.dst));
  const sliceBatches = dests.map((d, j) => batch(slicePlan, d.rank, () => destWholes[j]!.dst, placed.get(d.rank)!.dst));
  const wholeBytes = sourceWholes[0]!.buffer.byteLength;
  const common = async (): Promise<void> => {
    await Promise.all(gatherBatches.map((b, i) => gatherCopiers[i]!.copy(b)));
    destWholes.forEach((w, j) => {
      w.device.activate();
      driver.memcpyDtoDAsync(w.buffer.devicePointer, sourceWholes[0]!.buffer.devicePointer, wholeBytes, streams[j]!.handle);
    });
    await Promise.all(streams.map((st) => st.synchronize()));
    await Promise.all(sliceBatches.map((b, i) => ourCopiers[i]!.copy(b)));
  };
  fill();
  clear();
  await common();
  await verify('the common way');
  const commonMs = summarize(await timed(syncs, common));
  row('common way: all-gather, broadcast from rank 0, slices', commonMs, moved, [`ours is ${(commonMs.median / repeated.median).toFixed(1)}x faster (target >= 4x: ${verdict(commonMs.median >= 4 * repeated.median)})`]);
  for (const c of [...ourCopiers, ...gatherCopiers]) await c.close();
  for (const s of streams) s.close();
  for (const p of [...placed.values(), ...sourceWholes, ...destWholes]) p.buffer.close();
}

// --- the NCCL path: each rank a child process of this bench ------------------------------------
// Three layouts, every rank declared on its own node (so every pair between two ranks goes over
// NCCL): 'colocated' (rank i holds FSDP half i and needs TP half i: a local pair beside the NCCL
// ones), 'split' (FSDP sources on ranks 0-1, TP2 destinations on ranks 2-3: issue 37's four-GPU
// layout) and 'replicas' (the same sources, two TP2 replicas on ranks 2-5, each needing everything).
// A child (SHARDED_NCCL_RANK set) runs one rank and prints its timings as one JSON line.
type NcclLayout = 'colocated' | 'split' | 'replicas';
interface RankTimes {
  limit: number[]; first: number; repeated: number[]; staging: number; wrong: string[];
  /** Per repeated sync: ms the host spent queueing the rounds (each comm.group until NCCL took it). */
  queued: number[];
}
function ncclLayouts(kind: NcclLayout): RankLayout[] {
  const at = (rank: number): LayoutBuilder => new LayoutBuilder({ rank, node: `node${rank}`, gpu: 0 });
  if (kind === 'colocated') return [0, 1].map((i) => needer(holder(at(i), i), i).build());
  const sources = [0, 1].map((i) => holder(at(i), i).build());
  const tps = kind === 'split' ? [0, 1] : [0, 1, 0, 1];
  return [...sources, ...tps.map((tp, j) => needer(at(2 + j), tp).build())];
}

async function ncclRank(kind: NcclLayout, rank: number, gpu: number, id: Uint8Array, slots: 1 | 2): Promise<RankTimes> {
  const library = await loadNccl();
  const device = Device.get(gpu);
  const layouts = ncclLayouts(kind);
  const layout = layouts[rank]!;
  const plan = planSharded(layouts);
  const placed = place({ ...layout, gpu });
  const comm = await NcclCommunicator.init({ uniqueId: asNcclUniqueId(id), nranks: layouts.length, rank, device, library, timeout: 120_000 });
  const mover = ncclRunMover(device, { slots });
  const copier = deviceRunCopier(device);
  const chunkOf = ncclChunkBytes(plan.pairs, chunkBytes);  // as the group cuts them
  const mine = (path: 'nccl' | 'local') => plan.pairs.filter((p) => p.path === path && (p.src === rank || p.dst === rank));
  const pairs = { sends: mine('nccl').filter((p) => p.src === rank), recvs: mine('nccl').filter((p) => p.dst === rank) };
  const local = { pairs: mine('local').filter((p) => p.dst === rank).map((pair) => ({ pair, sources: placed.src })), destinations: placed.dst };
  let staging = 0;
  // The phase a miss needs: the mover awaits each round's group until NCCL took it before it queues
  // the next, so where that host time per round passes the round's transfer, the host holds the sync.
  let queued = 0;
  const timedComm = new Proxy(comm, {
    get(target, key) {
      if (key === 'group') {
        return async (...args: Parameters<NcclCommunicator['group']>): Promise<void> => {
          const t0 = performance.now();
          try { await target.group(...args); } finally { queued += performance.now() - t0; }
        };
      }
      const v: unknown = Reflect.get(target, key);
      return typeof v === 'function' ? (v as (...a: unknown[]) => unknown).bind(target) : v;
    },
  });
  const ours = async (): Promise<void> => {
    await Promise.all([
      mover.move(timedComm, (x) => x, pairs, placed.src, placed.dst, chunkOf).then((m) => { staging = Math.max(staging, m.staging); }),
      local.pairs.length ? copier.copy(local) : undefined,
    ]);
  };
  // The limit: each nccl pair's bytes in one send/recv (one group), the local pair's bytes one plain copy beside.
  const stream = Stream.create(device);
  const copyStream = Stream.create(device);
  const into = placed.buffer.devicePointer + BigInt(placed.dstAt[0] ?? 0);
  const limit = async (): Promise<void> => {
    const ops = [...pairs.sends.map((p) => ({ op: 'send' as const, buffer: placed.buffer.devicePointer, bytes: p.bytes, peer: p.dst })),
      ...pairs.recvs.map((p) => ({ op: 'recv' as const, buffer: into, bytes: p.bytes, peer: p.src }))];
    await comm.group(ops, { stream });
    device.activate();
    for (const p of local.pairs) driver.memcpyDtoDAsync(into, placed.buffer.devicePointer, p.pair.bytes, copyStream.handle);
    await Promise.all([stream.synchronize(), copyStream.synchronize()]);
  };
  const limitTimes = (await timed(syncs + 1, limit)).slice(1);
  // One epoch for every rank: a tensor's values depend on its name and the epoch only.
  const epoch = 200;
  fillSources(layout, placed, epoch);
  const first = (await timed(1, ours))[0]!;
  const bad = await checkDestinations(layout, placed, epoch);
  const queuedPerSync: number[] = [];
  const repeated = await timed(syncs, async () => {
    queued = 0;
    await ours();
    queuedPerSync.push(queued);
  });
  await mover.close();
  await copier.close();
  await comm.close({ timeout: 120_000 });
  stream.close();
  copyStream.close();
  placed.buffer.close();
  return { limit: limitTimes, first, repeated, staging, queued: queuedPerSync, wrong: bad.length ? [`rank ${rank} holds wrong values: ${bad.join('; ')}`] : [] };
}

/** Runs a layout's ranks as children (`network`: NCCL's forced network path; `slots`: the mover's staging slots) and prints its rows; or why not. */
async function ncclPath(kind: NcclLayout, network: boolean, slots: 1 | 2): Promise<string | undefined> {
  if (process.env.SHARDED_NCCL === '0') return 'SHARDED_NCCL=0';
  const layouts = ncclLayouts(kind);
  const n = layouts.length;
  if (!network && deviceCount < n) return `NCCL's own path needs ${n} GPUs here (NCCL refuses two ranks on one GPU of one host); this machine shows ${deviceCount}`;
  let library: NcclLibrary;
  try {
    library = await loadNccl();
  } catch (e) {
    return `no usable NCCL: ${(e as Error).message}`;
  }
  const id = Buffer.from(library.uniqueId()).toString('hex');
  const self = fileURLToPath(import.meta.url);
  const results = await Promise.all(layouts.map((_, rank) => new Promise<RankTimes>((resolve, reject) => {
    const child = spawnChild(process.execPath, [self], {
      stdio: ['ignore', 'pipe', 'inherit'],
      env: {
        ...process.env, SHARDED_NCCL_LAYOUT: kind, SHARDED_NCCL_RANK: String(rank), SHARDED_NCCL_GPU: String(rank % deviceCount), SHARDED_NCCL_ID: id, SHARDED_NCCL_SLOTS: String(slots),
        ...(network && asOwnHost(`sharded-${rank}`)),
      },
    });
    let out = '';
    child.stdout!.setEncoding('utf8').on('data', (d: string) => { out += d; });
    child.on('error', reject);
    child.on('exit', (code, signal) => {
      const line = out.split('\n').find((l) => l.startsWith('{'));
      if (code === 0 && line) resolve(JSON.parse(line) as RankTimes);
      else reject(new Error(`rank ${rank} exited ${signal ?? code}: ${out.slice(-500)}`));
    });
  })));
  // The slowest rank decides each sync: every rank's time of one sync, the largest.
  const slowest = (pick: (r: RankTimes) => number[]): number[] => pick(results[0]!).map((_, k) => Math.max(...results.map((r) => pick(r)[k]!)));
  const plan = planSharded(layouts);
  const moved = plan.pairs.reduce((m, p) => m + p.bytes, 0);
  const ncclPairs = plan.pairs.filter((p) => p.path === 'nccl');
  const ncclBytes = ncclPairs.reduce((m, p) => m + p.bytes, 0);
  const what = { colocated: '2 colocated ranks', split: '2 sources -> 2 destinations', replicas: '2 sources -> 2 TP2 replicas' }[kind];
  const path = `${what}, ${network ? `NCCL network path${deviceCount < n ? ` on ${deviceCount} GPU(s)` : ''}` : 'NCCL\'s own path'}, ${slots} staging slot${slots === 1 ? '' : 's'}`;
  const chunkOf = ncclChunkBytes(plan.pairs, chunkBytes);
  const limitMs = summarize(slowest((r) => r.limit));
  row(`limit (${path}): NCCL send/recv of each pair's bytes${kind === 'colocated' ? ' + local copy' : ''}`, limitMs, moved);
  const first = Math.max(...results.map((r) => r.first));
  const repeated = summarize(slowest((r) => r.repeated));
  const staging = Math.max(...results.map((r) => r.staging));
  const rounds = Math.max(...ncclPairs.map((x) => Math.ceil(x.bytes / chunkOf(x))));
  const queued = summarize(slowest((r) => r.queued)).median;
  row(`ours (${path}): first sync`, first, moved, [`${(first / repeated.median).toFixed(1)}x a repeated sync (target <= 10x: ${verdict(first <= 10 * repeated.median)})`]);
  row(`ours (${path}): repeated sync`, repeated, moved, [
    `${(repeated.median / limitMs.median).toFixed(2)}x the limit (target <= 1.3x: ${verdict(repeated.median <= 1.3 * limitMs.median)})`,
    `${(ncclBytes / GIB).toFixed(2)} GiB over NCCL in ${rounds} rounds (chunks of ${[...new Set(ncclPairs.map((x) => (chunkOf(x) / 2 ** 20).toFixed(0)))].join(', ')} MiB)`,
    `the host queueing the rounds (each group until NCCL took it; earlier rounds run on the GPU meanwhile), the busiest rank: ${queued.toFixed(2)} ms, ${(queued * 1000 / rounds).toFixed(0)} us a round`,
    `staging ${(staging / 2 ** 20).toFixed(0)} MiB per rank at most (${(staging / chunkBytes).toFixed(1)} chunks; target <= 2: ${verdict(staging <= 2 * chunkBytes)})`,
  ]);
  for (const r of results) wrong.push(...r.wrong.map((w) => `${path}: ${w}`));
  return undefined;
}

if (process.env.SHARDED_NCCL_RANK !== undefined) {
  // A child rank of ncclPath.
  const e = process.env;
  const times = await ncclRank(e.SHARDED_NCCL_LAYOUT as NcclLayout, Number(e.SHARDED_NCCL_RANK), Number(e.SHARDED_NCCL_GPU), Buffer.from(e.SHARDED_NCCL_ID!, 'hex'), e.SHARDED_NCCL_SLOTS === '2' ? 2 : 1);
  process.stdout.write(`${JSON.stringify(times)}\n`);
  process.exit(0);
}
if (noGpu) {
  ipcPlans();
  console.log(`bench:sharded: nothing measured: ${noGpu}`);
  process.exit(0);
}
await ipcPath();
// A failing or hanging NCCL path is reported; the other rows still print.
const NCCL_LIMIT_MS = 600_000;
let hung = false;
const notMeasured: string[] = [];
const ncclRuns: Array<[NcclLayout, boolean, 1 | 2]> = [
  ['colocated', false, 2], ['colocated', false, 1], ['colocated', true, 2], ['colocated', true, 1],
  ['split', false, 2], ['split', true, 2], ['replicas', false, 2], ['replicas', true, 2],
];
for (const [kind, network, slots] of ncclRuns) {
  const skipped = await Promise.race([
    ncclPath(kind, network, slots).catch((e: Error) => `failed: ${e.message}`),
    new Promise<string>((resolve) => setTimeout(() => { hung = true; resolve(`gave up after ${NCCL_LIMIT_MS / 1000} s (a hang?)`); }, NCCL_LIMIT_MS).unref()),
  ]);
  if (skipped) notMeasured.push(`${kind}, ${network ? 'NCCL network path' : 'NCCL\'s own path'}, ${slots} staging slot(s): not measured: ${skipped}`);
  if (hung) break;
}
printTable(`Sharded sync, ${(modelBytes / GIB).toFixed(2)} GiB bf16, 2 FSDP sources -> 2 TP destinations, ${gpus} GPU(s), ${syncs} syncs each (values checked)`, rows);
for (const n of notMeasured) console.log(n);
for (const w of wrong) console.log(`VALUES WRONG: ${w}`);
console.log(wrong.length ? 'values: WRONG (see above)' : 'values: every way checked, all exact');
process.exitCode = wrong.length || hung ? 1 : 0;
if (hung) process.exit();  // the NCCL work that hangs would keep the process alive
