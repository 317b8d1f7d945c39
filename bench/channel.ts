// Channel benchmarks: the floor of the wake-up (doorbells alone, no channel) next to a Node Unix
// socket round trip, round trips through a pair of channels in each wait mode (host and device
// slots), one-way throughput for slots of 4 KiB to 64 MiB, work sharing with 1 to 8 consumers,
// and (on a GPU) a consumer kernel on shared slots against the same kernel on its own memory.
// Every channel figure comes with the CPU time both processes spent per message.
//
// Stability (issues 30 and 38): every row runs `runs` times (3 by default), the rows taking turns,
// each round starting further down the list (stats.ts roundOrder: one row's runs spread over the
// bench, never back to back), after `warmupRuns` rounds whose figures are dropped (the bench
// process's own code reaches its steady state on every row's path first: the runs of one row
// otherwise rose from round to round); each run in fresh child processes, started only once the
// previous run's children have exited, and timed only after a warm-up of its own (one way and work
// sharing: ONE_WAY_WARMUP_MS; round trips: the warm-up iterations). A row's figure is the median of
// all its runs' samples, printed with the spread of the runs' medians; a target on a row whose
// spread is over 15% is UNDECIDED (stats.ts verdict). The bench process's main thread and each
// child's are pinned to physical cores of their own on one NUMA node (the GPU's), their other
// threads to the node's remaining CPUs (placement.ts); every row says where its processes ran.
import { childEnv, cpuPlacement, liveChildren, onCpu, type PinPlan } from './placement.js';
import { spawn, type Link } from '../src/link/index.js';
import { ChannelHub, createChannel, type ChannelMemory, type WaitMode } from '../src/channel/index.js';
import { cRingUnavailable, defaultRingKind, type RingKind } from '../src/channel/c-ring.js';
import { Device } from '../src/cuda/device.js';
import { Stream } from '../src/cuda/stream.js';
import { ONE_WAY_WARMUP_MS, RoundSchedule, roundOrder, spreadOf, summarize, type Spread, type Summary } from './stats.js';

export { spreadOf, type Spread };

import { nodeToPython, pythonToNode, pythonChannelUnavailable, PYTHON_BATCH, type PythonOneWay } from './channel-python.js';

const CHILD = new URL('./channel-child.js', import.meta.url);
const WAITS: readonly WaitMode[] = ['adaptive', 'sleep', 'spin'];

/** The issue's targets (GPU machine, same run). */
export const TARGETS = {
  /** Round trip median, default wait mode ('adaptive'). */
  rttDefaultHostUs: 15,
  rttDefaultDeviceUs: 20,
  /** ... and at most this times the Node socket round trip of the same run. */
  rttDefaultVsSocket: 1.0,
  /** Round trip median, 'spin'. */
  rttSpinHostUs: 3,
  rttSpinDeviceUs: 6,
  /** One way, every slot size (device slots: issue 30 raised it from 200k to 500k). */
  oneWayHostMsgsPerSec: 1_000_000,
  oneWayDeviceMsgsPerSec: 500_000,
  kernelRatio: 0.95,
  /** A Python end's one-way rate against Node -> Node's (host slots, adaptive, same slot size). */
  pythonVsNode: 0.5,
} as const;

type Memory = 'host' | 'device';

export interface RoundTrip {
  memory: Memory;
  wait: WaitMode;
  /** Which ring both ends ran (CUDA_IPC_CHANNEL_RING): the C ring (host slots' default) or the JavaScript ring (device slots'). */
  ring: RingKind;
  us: Summary;
  /** CPU time (user + system) of both processes per message; a round trip is two messages. */
  cpuUsPerMsg: number;
  /** Where the two processes ran when timing began (CPUs, NUMA nodes), each run. */
  placement: string;
  runs: Spread;
  /** Sleeps on the doorbell per 1,000 messages, both processes, each run (warm-up included). */
  sleepsPer1k?: number[];
  /** The core-to-core round trip between the row's two CPUs just before each run (FLOOR_PROBE). */
  floorsUs?: number[];
}

/** What a child reports of where its main thread ran, and how often its ends slept (channel-child.ts). */
interface ChildWhere { ranOn: number; allowed?: string; pinned?: boolean; sleeps?: number }

/** "CPUs 0 and 5 (one NUMA node)", and a warning where the child's pinning failed. */
function where(mine: number, theirs: ChildWhere): string {
  const p = cpuPlacement(mine, theirs.ranOn);
  return theirs.pinned === false ? `${p}; the child's pinning FAILED (allowed CPUs ${theirs.allowed ?? '?'})` : p;
}


export interface OneWay {
  memory: Memory;
  wait: WaitMode;
  ring: RingKind;
  slotBytes: number;
  /** Per-batch rates: median and the slowest 1% (p99 column). */
  msgsPerSec: Summary;
  slowest1pct: number;
  /** Bytes the producer writes into each slot (and says it used): the slot itself is handed over
   * in place, so nothing is copied and its size does not change the work per message. */
  bytesWrittenPerMsg: number;
  cpuUsPerMsg: number;
  /** Where the two processes ran, each run. */
  placement: string;
  runs: Spread;
  /** Sleeps on the doorbell per 1,000 messages, both processes, each run (warm-up included). */
  sleepsPer1k?: number[];
  /** The core-to-core round trip between the row's two CPUs just before each run (FLOOR_PROBE). */
  floorsUs?: number[];
}


export interface ChannelOptions {
  /** Rows with a Python end (default true). */
  python?: boolean;
  /** Only the rows whose names match (a row's references too, where they match). */
  only?: RegExp;
  /** Runs of each row, taking turns (default 3). */
  runs?: number;
  /** Rounds of every row run first and dropped (default 1). */
  warmupRuns?: number;
  /** Where the processes run (placement.ts); undefined: not pinned. */
  pin?: PinPlan;
  /** Measure the core-to-core round trip before each run of each row (default true; ~0.1 s a run). */
  floorProbe?: boolean;
}

/** Before each run of a row, a short spin ping-pong between the bench process and a child on the
 * CPU the row's child gets: on a virtual machine the guest's CPUs are host threads wherever the
 * host runs them at the moment, so the distance between the two may change between runs. On the
 * H200 machine it did (0.55-0.95 us) but did not predict the runs' rates (1.37 M msg/s at 0.81 us,
 * 810 k at 0.65 us in one row): it moves one line, and a line's cost there depends on which physical
 * line it is (bench/reference/line_pingpong.c). Printed by run so that a spread can be told from a moved machine. */
const FLOOR_PROBE = { iterations: 1000, warmup: 300 };

export interface ChannelResults {
  /** Runs of each row, rounds dropped before them; where the processes were pinned (or why not). */
  runs: number;
  warmupRuns: number;
  pinned: string;
  /** Children still alive when a run was to start (after waiting for them), and those alive before the first run. */
  leftovers: string[];
  /** Why the C ring's rows did not run (the addon has no C ring); absent when they did. */
  cRingSkipped?: string;
  floor: {
    doorbell?: { us: Summary; cpuUsPerMsg: number; runs: Spread };
    socket?: { us: Summary; runs: Spread };
    /** A shared word bounced between two processes, each spinning natively (no channel): the
     * floor under spin mode, two cache-line transfers and a JS turn each way; where they ran. */
    spin?: { us: Summary; placement: string; runs: Spread };
    /** The host spin round trip with both processes calling the C ring directly (no channel API):
     * the protocol's own cost (channel-floors.ts, protocolFloor). */
    protocol?: { us: Summary; placement: string; runs: Spread };
    /** The 4 KiB host one-way rows' messages with both processes calling the C ring directly
     * (protocolOneWayFloor): the rate the protocol allows. */
    protocolOneWay?: { msgsPerSec: Summary; slowest1pct: number; placement: string; runs: Spread };
  };
  roundTrip: Record<string, RoundTrip>;
  oneWay: Record<string, OneWay>;
  workSharing: Record<string, { consumers: number; msgsPerSec: number; runs: Spread }>;
  /** One way with a Python end (host slots, 4 KiB, adaptive), or why it did not run. */
  /** sleepsPer1k: both ends' sleeps per 1,000 messages, each run; details: each run's waits per end. */
  python?: { rows: Array<PythonOneWay & { runs: Spread; sleepsPer1k: number[]; details: string[]; floorsUs: number[] }> } | { skipped: string };
  kernel?: KernelResult;
}

import { cpuOf, doorbellFloor, protocolFloor, protocolOneWayFloor, ringEnv, socketRoundTrip, spinFloor, waitExit, waitsOf, withRing } from './channel-floors.js';

/** Median and p99 of per-iteration microseconds through out -> child -> back. */
async function roundTrip(memory: ChannelMemory, wait: WaitMode, iterations: number, warmup: number, env: NodeJS.ProcessEnv, ring: RingKind): Promise<{ us: Float64Array; cpuUsPerMsg: number; placement: string; sleepsPer1k: number }> {
  const { child, link } = await spawn(CHILD, ['echo', wait], { stdio: 'inherit', env: ringEnv(env, ring) });
  const opts = { slots: 4, slotBytes: 4096, memory, wait } as const;
  const out = await withRing(ring, () => createChannel(link, { ...opts, role: 'producer' }));
  const back = await withRing(ring, () => createChannel(link, { ...opts, role: 'consumer' }));
  const stream = out.device ? Stream.create(out.device) : undefined;
  const times: number[] = [];
  let mine = 0;
  let ranOn = -1;
  let sleeps = 0;
  let rounds = 0;
  try {
    let cpu0 = process.cpuUsage();
    const schedule = new RoundSchedule(warmup, iterations);
    for (let when = schedule.next(); when !== 'done'; rounds++, when = schedule.next()) {
      const i = rounds;
      if (when === 'first') {
        cpu0 = process.cpuUsage();
        ranOn = onCpu();
      }
      const t0 = process.hrtime.bigint();
      const slot = await out.acquire({ stream });
      if (!stream) slot.bytes[0] = i & 0xff;
      // Length 2 marks the first timed message: the child counts its CPU from there.
      out.publish(slot, { stream, length: when === 'first' ? 2 : 1 });
      const m = (await back.receive())!;
      m.release({ stream });
      if (when !== 'warm') times.push(Number(process.hrtime.bigint() - t0) / 1000);
    }
    mine = cpuOf(process.cpuUsage(cpu0));
  } finally {
    await out.end();
    sleeps = waitsOf(out).sleeps + waitsOf(back).sleeps;
    back.close();
    stream?.close();
  }
  const theirs = (await link.receive()) as { cpu: number } & ChildWhere;
  await waitExit(child);
  return {
    us: Float64Array.from(times), cpuUsPerMsg: (mine + theirs.cpu) / (2 * times.length), placement: where(ranOn, theirs),
    sleepsPer1k: ((sleeps + (theirs.sleeps ?? 0)) * 1000) / (2 * rounds),
  };
}

/** The slot size of the rows with a Python end (compared with Node's row of the same size). */
export const PYTHON_SLOT_BYTES = 4 << 10;

/** Bytes each one-way message says it uses (the producer writes one of them, on host slots). */
const ONE_WAY_LENGTH = 8;

/** One way for about `ms` after ONE_WAY_WARMUP_MS untimed: rates per batch of 2000 messages, and
 * CPU per message (over every message, the warm-up's too: both ends count from the start). */
async function oneWay(memory: ChannelMemory, wait: WaitMode, slotBytes: number, slots: number, ms: number, env: NodeJS.ProcessEnv, ring: RingKind) {
  const { child, link } = await spawn(CHILD, ['sink', wait], { stdio: 'inherit', env: ringEnv(env, ring) });
  const ch = await withRing(ring, () => createChannel(link, { role: 'producer', slots, slotBytes, memory, wait }));
  const stream = ch.device ? Stream.create(ch.device) : undefined;
  const rates: number[] = [];
  let total = 0;
  const batch = 2000;
  const timed = performance.now() + ONE_WAY_WARMUP_MS;
  const end = timed + ms;
  let mine = 0;
  let ranOn = -1;
  let sleeps = 0;
  try {
    const cpu0 = process.cpuUsage();
    while (performance.now() < end || rates.length < 5) {
      const t0 = process.hrtime.bigint();
      for (let i = 0; i < batch; i++) {
        const slot = await ch.acquire({ stream });
        if (!stream) slot.bytes[0] = 1;
        ch.publish(slot, { stream, length: ONE_WAY_LENGTH });
      }
      const t1 = process.hrtime.bigint();
      total += batch;
      if (performance.now() < timed) continue;
      rates.push(batch / (Number(t1 - t0) / 1e9));
      if (ranOn < 0) ranOn = onCpu();
    }
    await ch.end();
    mine = cpuOf(process.cpuUsage(cpu0));
  } finally {
    sleeps = waitsOf(ch).sleeps;
    if (!ch.closed) ch.close();
    stream?.close();
  }
  const r = (await link.receive()) as { n: number; sum: number; cpu: number } & ChildWhere;
  await waitExit(child);
  if (r.n !== total || (!stream && r.sum !== total)) throw new Error(`one-way benchmark: the consumer saw ${r.n} of ${total} messages`);
  return { rates, cpuUsPerMsg: (mine + r.cpu) / total, placement: where(ranOn, r), sleepsPer1k: ((sleeps + (r.sleeps ?? 0)) * 1000) / total };
}

async function workSharing(memory: ChannelMemory, consumers: number, ms: number, pin: PinPlan | undefined): Promise<number> {
  const hub = ChannelHub.create({ slots: 16, slotBytes: 4096, memory, consumers, maxPeers: consumers + 1 });
  const ch = hub.producer();
  const kids: Array<{ child: Parameters<typeof waitExit>[0]; link: Link }> = [];
  const stream = ch.device ? Stream.create(ch.device) : undefined;
  let total = 0;
  try {
    for (let i = 0; i < consumers; i++) {
      const k = await spawn(CHILD, ['worker'], { stdio: 'inherit', env: childEnv(pin, i) });
      await hub.attach(k.link, { role: 'consumer' });
      kids.push(k);
    }
    // Untimed first (ONE_WAY_WARMUP_MS), then timed for `ms`.
    let t0 = performance.now();
    const timed = t0 + ONE_WAY_WARMUP_MS;
    let counted = 0;
    let warming = true;
    while (warming || performance.now() - t0 < ms) {
      for (let i = 0; i < 1000; i++) {
        const slot = await ch.acquire({ stream });
        if (!stream) slot.bytes[0] = 1;
        ch.publish(slot, { stream, length: ONE_WAY_LENGTH });
      }
      total += 1000;
      if (!warming) counted += 1000;
      else if (performance.now() >= timed) {
        warming = false;
        t0 = performance.now();
      }
    }
    const s = (performance.now() - t0) / 1000;
    await ch.end();
    let seen = 0;
    for (const k of kids) seen += ((await k.link.receive()) as { n: number }).n;
    if (seen !== total) throw new Error(`work-sharing benchmark: consumers saw ${seen} of ${total}`);
    return counted / s;
  } finally {
    hub.close();
    stream?.close();
    for (const k of kids) await waitExit(k.child);
  }
}

/** The kernel comparison: both timings, their ratio, and the ratio of each of the child's rounds
 * (shared and local memory alternated) with their spread. */
export interface KernelResult { sharedUs: Summary; localUs: Summary; ratio: number; rounds: number[]; roundsSpread: number }

async function kernelOnSlots(device: Device, reps: number): Promise<KernelResult> {
  const slotBytes = 256 << 20;
  const { child, link } = await spawn(CHILD, ['kernel', '0', String(reps)], { stdio: 'inherit' });
  const ch = await createChannel(link, { role: 'producer', slots: 1, slotBytes, memory: { device } });
  const stream = Stream.create(device);
  try {
    const slot = await ch.acquire({ stream });
    slot.buffer.fill(7, { stream });
    ch.publish(slot, { stream });
    progress('  (published the 256 MiB slot; waiting for the consumer\'s timings)');
    const r = (await link.receive()) as { sharedUs: number[]; localUs: number[] };
    progress('  (timings received; ending the channel)');
    await ch.end();
    const sharedUs = summarize(r.sharedUs);
    const localUs = summarize(r.localUs);
    // The child alternates `reps` shared then `reps` local samples per round.
    const rounds: number[] = [];
    for (let i = 0; i + reps <= Math.min(r.sharedUs.length, r.localUs.length); i += reps) {
      rounds.push(summarize(r.localUs.slice(i, i + reps)).median / summarize(r.sharedUs.slice(i, i + reps)).median);
    }
    return { sharedUs, localUs, ratio: localUs.median / sharedUs.median, rounds, roundsSpread: spreadOf(rounds).spread };
  } finally {
    if (!ch.closed) ch.close();
    stream.close();
    await waitExit(child);
  }
}

/** The samples of one row's runs. */
class Runs {
  samples: number[] = [];
  medians: number[] = [];
  cpu: number[] = [];
  placements: string[] = [];
  sleepsPer1k: number[] = [];

  /** Per run, where a row says more about its run than the figures (the Python rows' waits). */
  details: string[] = [];
  /** The core-to-core round trip (us, median of FLOOR_PROBE's) just before each run. */
  floorsUs: number[] = [];

  add(samples: ArrayLike<number>, cpuUsPerMsg?: number, placement?: string, sleepsPer1k?: number, detail?: string): void {
    if (detail !== undefined) this.details.push(detail);
    for (let i = 0; i < samples.length; i++) this.samples.push(samples[i]!);
    this.medians.push(summarize(samples).median);
    if (cpuUsPerMsg !== undefined) this.cpu.push(cpuUsPerMsg);
    if (placement !== undefined) this.placements.push(placement);
    if (sleepsPer1k !== undefined) this.sleepsPer1k.push(sleepsPer1k);
  }

  get summary(): Summary { return summarize(this.samples); }
  /** The slowest 1% of the samples (rates: the low end). */
  get slowest1pct(): number { return this.samples.slice().sort((a, b) => a - b)[Math.floor(this.samples.length * 0.01)]!; }
  get cpuUsPerMsg(): number { return this.cpu.reduce((a, b) => a + b, 0) / Math.max(1, this.cpu.length); }
  get placement(): string { return [...new Set(this.placements)].join('; '); }
  get spread(): Spread { return spreadOf(this.medians); }
}


/** A row on the ring its ends do not take by default says which it ran; the default's rows say nothing. */
function ringMark(ring: RingKind): string {
  return ring === defaultRingKind() ? '' : ring === 'c' ? ', C ring' : ', JavaScript ring';
}

/** Row names, as the tables print them (--only matches these). */
export const ROW = {
  doorbell: 'floor: doorbell round trip (eventfd + event loop, no channel)',
  spin: 'floor: spin round trip (a shared word, two processes, no channel)',
  socket: 'reference: Node Unix socket round trip, 64 bytes',
  protocol: 'floor: protocol round trip (spin, host slots, the C ring called directly, no channel API)',
  protocolOneWay: 'floor: protocol one way, 4 KiB slots (spin, host slots, the C ring called directly, no channel API)',
  roundTrip: (wait: WaitMode, memory: Memory, ring: RingKind = defaultRingKind()) => `round trip, ${wait} (${memory} slots${ringMark(ring)})`,
  oneWay: (size: number, wait: WaitMode, memory: Memory, ring: RingKind = defaultRingKind()) => `one way, ${fmtBytes(size)} slots, ${wait} (${memory} slots${ringMark(ring)})`,
  python: (direction: PythonOneWay['direction']) => `one way, ${fmtBytes(PYTHON_SLOT_BYTES)} slots, adaptive, ${direction.startsWith('python->node') ? 'Python -> Node' : 'Node -> Python'}${direction === 'node->python batch' ? `, receive_many(${PYTHON_BATCH})` : direction === 'python->node batch' ? `, acquire_many/publish_many(${PYTHON_BATCH})` : ''} (host slots)`,
  workSharing: (consumers: number) => `work sharing, ${consumers} consumer${consumers > 1 ? 's' : ''} (host slots)`,
};

export async function channelBenchmarks(iterations: number, warmup: number, device: Device | undefined, options: ChannelOptions = {}): Promise<ChannelResults> {
  const runs = options.runs ?? 3;
  const warmupRuns = options.warmupRuns ?? 1;
  const pin = options.pin;
  const env = childEnv(pin);
  const want = (name: string) => !options.only || options.only.test(name);
  const res: ChannelResults = {
    runs, warmupRuns, leftovers: [],
    pinned: pin ? `on NUMA node ${pin.node} (${pin.why}), each main thread on a core of its own, other threads on CPUs ${pin.helperList}` : 'not pinned',
    floor: {}, roundTrip: {}, oneWay: {}, workSharing: {},
  };
  const sizes = [4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20];
  // On each kind of slot: the C ring's rows (the default) and the JavaScript ring's beside them, where
  // the addon has the C ring.
  const noCRing = cRingUnavailable();
  if (noCRing) res.cRingSkipped = noCRing;
  const rings: RingKind[] = noCRing ? ['js'] : ['c', 'js'];
  const oneWayRows: Array<[WaitMode, number, RingKind]> = [
    ...sizes.map((s) => ['adaptive', s, defaultRingKind()] as [WaitMode, number, RingKind]),
    ...rings.filter((k) => k !== defaultRingKind()).map((k) => ['adaptive', 4 << 10, k] as [WaitMode, number, RingKind]),
    ...(['sleep', 'spin'] as const).flatMap((w) => rings.map((k) => [w, 4 << 10, k] as [WaitMode, number, RingKind])),
  ];
  // Each row: its name, its samples, and one run of it. Rows run in this order, `runs` rounds.
  const rows: Array<{ name: string; runs: Runs; run: (r: Runs) => Promise<void> }> = [];
  const row = (name: string, run: (r: Runs) => Promise<void>) => {
    if (want(name)) rows.push({ name, runs: new Runs(), run });
  };
  const long = Math.max(warmup, 2000);
  row(ROW.doorbell, async (r) => { const f = await doorbellFloor(iterations, long, env); r.add(f.us, f.cpuUsPerMsg); });
  row(ROW.spin, async (r) => { const f = await spinFloor(iterations, long, env); r.add(f.us, undefined, f.placement); });
  row(ROW.socket, async (r) => r.add(await socketRoundTrip(iterations, long, env)));
  if (!noCRing) row(ROW.protocol, async (r) => { const f = await protocolFloor(iterations, long, env); r.add(f.us, undefined, f.placement); });
  if (!noCRing) row(ROW.protocolOneWay, async (r) => { const f = await protocolOneWayFloor(700, env); r.add(f.rates, undefined, f.placement); });
  const memories: Array<[Memory, ChannelMemory]> = [['host', 'host']];
  if (device) memories.push(['device', { device }]);
  for (const [memory, m] of memories) {
    for (const wait of WAITS) {
      // A longer warm-up than the handoff's: the channel's hot path must be compiled (steady state),
      // and the adaptive spin must have learned the gaps. The other ring's row next to the default's.
      for (const ring of rings) {
        row(ROW.roundTrip(wait, memory, ring), async (r) => { const t = await roundTrip(m, wait, iterations, long, env, ring); r.add(t.us, t.cpuUsPerMsg, t.placement, t.sleepsPer1k); });
      }
    }
  }
  for (const [memory, m] of memories) {
    for (const [wait, size, ring] of oneWayRows) {
      row(ROW.oneWay(size, wait, memory, ring), async (r) => { const o = await oneWay(m, wait, size, 8, 700, env, ring); r.add(o.rates, o.cpuUsPerMsg, o.placement, o.sleepsPer1k); });
    }
  }
  const lastPython: Partial<Record<PythonOneWay['direction'], PythonOneWay>> = {};
  const addPython = (r: Runs, p: PythonOneWay): void => {
    const w = p.waitsPer1k;
    const f = (x: number) => x.toFixed(x < 10 ? 1 : 0);
    r.add(p.rates, p.cpuUsPerMsg, p.placement, w.node.sleeps + w.python.sleeps,
      `per 1k msgs: Node ${f(w.node.sleeps)} sleeps, ${f(w.node.spinHits)} spin hits; Python ${f(w.python.sleeps)} sleeps, ${f(w.python.spinHits)} spin hits; Python CPU ${p.pythonCpuUsPerMsg.toFixed(2)} us/msg`);
  };
  const pythonRows = ['node->python', 'node->python batch', 'python->node', 'python->node batch'] as const;
  if (options.python !== false && pythonRows.some((d) => want(ROW.python(d)))) {
    const why = pythonChannelUnavailable();
    if (why) {
      res.python = { skipped: `no usable python3 with cuda_ipc: ${why}` };
    } else {
      row(ROW.python('node->python'), async (r) => {
        const a = lastPython['node->python'] = await nodeToPython('adaptive', PYTHON_SLOT_BYTES, 8, 700, env);
        addPython(r, a);
      });
      row(ROW.python('node->python batch'), async (r) => {
        const a = lastPython['node->python batch'] = await nodeToPython('adaptive', PYTHON_SLOT_BYTES, 8, 700, env, PYTHON_BATCH);
        addPython(r, a);
      });
      row(ROW.python('python->node'), async (r) => {
        // As many messages as Node -> Python moved in its time and warm-up (about as long), or 180k.
        const to = lastPython['node->python'];
        const count = Math.max(20_000, Math.min(2_000_000, Math.round((to ? to.msgsPerSec.median : 200_000) * (0.7 + ONE_WAY_WARMUP_MS / 1000))));
        const b = lastPython['python->node'] = await pythonToNode('adaptive', PYTHON_SLOT_BYTES, 8, count, env);
        addPython(r, b);
      });
      row(ROW.python('python->node batch'), async (r) => {
        const to = lastPython['node->python batch'];
        const count = Math.max(20_000, Math.min(2_000_000, Math.round((to ? to.msgsPerSec.median : 200_000) * (0.7 + ONE_WAY_WARMUP_MS / 1000))));
        const b = lastPython['python->node batch'] = await pythonToNode('adaptive', PYTHON_SLOT_BYTES, 8, count, env, PYTHON_BATCH);
        addPython(r, b);
      });
    }
  }
  for (const consumers of [1, 2, 4, 8]) {
    row(ROW.workSharing(consumers), async (r) => r.add([await workSharing('host', consumers, 700, pin)]));
  }

  // Children alive before the first run (another part of the bench's, if any) are not waited for.
  const before = new Set(liveChildren() ?? []);
  if (before.size) res.leftovers.push(`before the channel rows: pids ${[...before].join(', ')} (not waited for)`);
  // Warm-up rounds (figures dropped: a throw-away Runs), then the rounds that count, each in its order.
  for (let round = -warmupRuns; round < runs; round++) {
    for (const i of roundOrder(rows.length, round, runs)) {
      const r = rows[i]!;
      progress(`${r.name}${round < 0 ? ' (warm-up run, dropped)' : runs > 1 ? ` (run ${round + 1} of ${runs})` : ''}`);
      const left = await childrenGone(before);
      if (left.length) res.leftovers.push(`before ${r.name}: pids ${left.join(', ')} still alive after ${CHILDREN_GONE_MS} ms`);
      const into = round < 0 ? new Runs() : r.runs;
      if (options.floorProbe !== false) into.floorsUs.push(summarize((await spinFloor(FLOOR_PROBE.iterations, FLOOR_PROBE.warmup, env)).us).median);
      await r.run(into);
    }
  }

  for (const { name, runs: r } of rows) {
    if (name === ROW.doorbell) res.floor.doorbell = { us: r.summary, cpuUsPerMsg: r.cpuUsPerMsg, runs: r.spread };
    else if (name === ROW.spin) res.floor.spin = { us: r.summary, placement: r.placement, runs: r.spread };
    else if (name === ROW.socket) res.floor.socket = { us: r.summary, runs: r.spread };
    else if (name === ROW.protocol) res.floor.protocol = { us: r.summary, placement: r.placement, runs: r.spread };
    else if (name === ROW.protocolOneWay) res.floor.protocolOneWay = { msgsPerSec: r.summary, slowest1pct: r.slowest1pct, placement: r.placement, runs: r.spread };
  }
  for (const [memory] of memories) {
    for (const wait of WAITS) {
      for (const ring of rings) {
        const r = rows.find((x) => x.name === ROW.roundTrip(wait, memory, ring))?.runs;
        if (r) res.roundTrip[ROW.roundTrip(wait, memory, ring)] = { memory, wait, ring, us: r.summary, cpuUsPerMsg: r.cpuUsPerMsg, placement: r.placement, runs: r.spread, sleepsPer1k: r.sleepsPer1k, floorsUs: r.floorsUs };
      }
    }
    for (const [wait, size, ring] of oneWayRows) {
      const r = rows.find((x) => x.name === ROW.oneWay(size, wait, memory, ring))?.runs;
      if (r) {
        res.oneWay[ROW.oneWay(size, wait, memory, ring)] = {
          memory, wait, ring, slotBytes: size, msgsPerSec: r.summary, slowest1pct: r.slowest1pct, bytesWrittenPerMsg: memory === 'host' ? 1 : 0, cpuUsPerMsg: r.cpuUsPerMsg,
          placement: r.placement, runs: r.spread, sleepsPer1k: r.sleepsPer1k, floorsUs: r.floorsUs,
        };
      }
    }
  }
  const py: Array<PythonOneWay & { runs: Spread; sleepsPer1k: number[]; details: string[]; floorsUs: number[] }> = [];
  for (const direction of pythonRows) {
    const r = rows.find((x) => x.name === ROW.python(direction))?.runs;
    const last = lastPython[direction];
    if (r && last) py.push({ ...last, rates: r.samples, msgsPerSec: r.summary, slowest1pct: r.slowest1pct, cpuUsPerMsg: r.cpuUsPerMsg, runs: r.spread, placement: r.placement, sleepsPer1k: r.sleepsPer1k, details: r.details, floorsUs: r.floorsUs });
  }
  if (py.length) res.python = { rows: py };
  for (const consumers of [1, 2, 4, 8]) {
    const r = rows.find((x) => x.name === ROW.workSharing(consumers))?.runs;
    if (r) res.workSharing[ROW.workSharing(consumers)] = { consumers, msgsPerSec: r.summary.median, runs: r.spread };
  }
  if (device && want('checksum kernel on a 256 MiB shared slot')) {
    progress('consumer kernel on slots vs local memory');
    // Bounded: a stuck comparison must not cost the other figures.
    let timer: NodeJS.Timeout | undefined;
    try {
      res.kernel = await Promise.race([
        kernelOnSlots(device, 10),
        new Promise<never>((_, reject) => { timer = setTimeout(() => reject(new Error('no result within 60 s')), 60_000); }),
      ]);
    } catch (e) {
      process.stderr.write(`  the kernel comparison failed: ${(e as Error).message}\n`);
    } finally {
      clearTimeout(timer);
    }
  }
  return res;
}

/** How long a run waits for the children of the runs before it to be gone. */
const CHILDREN_GONE_MS = 10_000;

/** Waits (polling /proc, up to CHILDREN_GONE_MS) until this process has no child left but those in
 * `ignore` (alive before the channel rows began): a run starts
 * only once the previous run's processes are gone (an exit event comes before the kernel has
 * reaped every thread of a child, and a Python child's exit is not awaited everywhere). Returns
 * the pids still alive at the deadline (empty: none; also where /proc does not list children). */
async function childrenGone(ignore: ReadonlySet<number>): Promise<number[]> {
  const deadline = performance.now() + CHILDREN_GONE_MS;
  for (;;) {
    const left = (liveChildren() ?? []).filter((pid) => !ignore.has(pid));
    if (left.length === 0 || performance.now() > deadline) return left;
    await new Promise((r) => setTimeout(r, 5));
  }
}

/** Which measurement is running, on stderr: a slow or stuck one shows where it is. */
const started = performance.now();
function progress(what: string): void {
  process.stderr.write(`  [+${((performance.now() - started) / 1000).toFixed(1)} s] measuring ${what}\n`);
}

export function fmtBytes(n: number): string {
  return n >= 1 << 20 ? `${n / 1048576} MiB` : `${n / 1024} KiB`;
}
