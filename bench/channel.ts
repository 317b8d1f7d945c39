// Channel benchmarks: the floor of the wake-up (doorbells alone, no channel) next to a Node Unix
// socket round trip, round trips through a pair of channels in each wait mode (host and device
// slots), one-way throughput for slots of 4 KiB to 64 MiB, work sharing with 1 to 8 consumers,
// and (on a GPU) a consumer kernel on shared slots against the same kernel on its own memory.
// Every channel figure comes with the CPU time both processes spent per message.
import { createServer, type Socket } from 'node:net';
import { mkdtempSync, rmSync } from 'node:fs';
import { HostBuffer } from '../src/host/index.js';
import { JsWords } from '../src/channel/js-words.js';
import { cpuPlacement, onCpu } from './placement.js';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { spawn, type Link } from '../src/link/index.js';
import { ChannelHub, createChannel, type ChannelMemory, type WaitMode } from '../src/channel/index.js';
import { Doorbells } from '../src/channel/doorbells.js';
import { Device } from '../src/cuda/device.js';
import { Stream } from '../src/cuda/stream.js';
import { addon } from '../src/native.js';
import { printTable, summarize, type Row, type Summary } from './stats.js';
import { nodeToPython, pythonToNode, pythonChannelUnavailable, type PythonOneWay } from './channel-python.js';

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
  /** One way, every slot size. */
  oneWayHostMsgsPerSec: 1_000_000,
  oneWayDeviceMsgsPerSec: 200_000,
  kernelRatio: 0.95,
  /** A Python end's one-way rate against Node -> Node's (host slots, adaptive, same slot size). */
  pythonVsNode: 0.5,
} as const;

type Memory = 'host' | 'device';

export interface RoundTrip {
  memory: Memory;
  wait: WaitMode;
  us: Summary;
  /** CPU time (user + system) of both processes per message; a round trip is two messages. */
  cpuUsPerMsg: number;
  /** Where the two processes ran when timing began (CPUs, NUMA nodes). */
  placement: string;
}

export interface OneWay {
  memory: Memory;
  wait: WaitMode;
  slotBytes: number;
  /** Per-batch rates: median and the slowest 1% (p99 column). */
  msgsPerSec: Summary;
  slowest1pct: number;
  /** Bytes the producer writes into each slot (and says it used): the slot itself is handed over
   * in place, so nothing is copied and its size does not change the work per message. */
  bytesWrittenPerMsg: number;
  cpuUsPerMsg: number;
}

export interface ChannelResults {
  floor: {
    doorbellUs: Summary; doorbellCpuUsPerMsg: number; socketUs: Summary;
    /** A shared word bounced between two processes, each spinning natively (no channel): the
     * floor under spin mode, two cache-line transfers and a JS turn each way. */
    spinUs: Summary;
    /** Where the two processes of the spin floor ran: CPU numbers and their NUMA nodes. */
    spinPlacement: string;
  };
  roundTrip: Record<string, RoundTrip>;
  oneWay: Record<string, OneWay>;
  workSharing: Record<string, { consumers: number; msgsPerSec: number }>;
  /** One way with a Python end (host slots, 4 KiB, adaptive), or why it did not run. */
  python?: { rows: PythonOneWay[] } | { skipped: string };
  kernel?: { sharedUs: Summary; localUs: Summary; ratio: number };
}

function waitExit(child: { exitCode: number | null; signalCode: string | null; once(e: 'exit', f: () => void): unknown }): Promise<void> {
  return child.exitCode !== null || child.signalCode !== null ? Promise.resolve() : new Promise((r) => child.once('exit', () => r()));
}

const cpuOf = (u: NodeJS.CpuUsage) => u.user + u.system;

/** The floor: two processes bounce a wake-up through a pair of eventfd doorbells, each polled by
 * the other process's event loop, with no channel (what a sleeping channel end costs, both ways). */
async function doorbellFloor(iterations: number, warmup: number): Promise<{ us: Summary; cpuUsPerMsg: number }> {
  const { child, link } = await spawn(CHILD, ['doorbell-echo'], { stdio: 'inherit' });
  const bells = Doorbells.create(2);
  const times = new Float64Array(iterations);
  let resolve: (() => void) | undefined;
  const bell = new addon.Doorbell(bells.fd(0), () => resolve?.());
  bell.ref();
  try {
    link.send({ bells, warmup });
    await link.receive();
    let cpu0 = process.cpuUsage();
    for (let i = 0; i < warmup + iterations; i++) {
      if (i === warmup) cpu0 = process.cpuUsage();
      const t0 = process.hrtime.bigint();
      const back = new Promise<void>((r) => (resolve = r));
      bells.ring(1);
      await back;
      if (i >= warmup) times[i - warmup] = Number(process.hrtime.bigint() - t0) / 1000;
    }
    const mine = cpuOf(process.cpuUsage(cpu0));
    link.send({ done: true });
    const theirs = ((await link.receive()) as { cpu: number }).cpu;
    return { us: summarize(times), cpuUsPerMsg: (mine + theirs) / (2 * iterations) };
  } finally {
    bell.close();
    bells.close();
    await waitExit(child);
  }
}

/** Word offsets of the spin floor: a line apart, so that each side's word has a line of its own. */
const SPIN_PING = 0;
const SPIN_PONG = 64;
/** The spin floor gives up (a stuck peer) after this long in all. */
const SPIN_FLOOR_LIMIT_MS = 20_000;

/** The floor under spin mode: two processes bounce a shared word, each spinning in the addon on
 * the word the other bumps (what a spinning channel end does, with no channel around it). */
async function spinFloor(iterations: number, warmup: number): Promise<{ us: Summary; placement: string }> {
  const { child, link } = await spawn(CHILD, ['spin-echo'], { stdio: 'inherit' });
  const buffer = HostBuffer.allocate(4096);
  const words = new JsWords(new addon.SharedWords(buffer.fd, 4096), buffer.bytes);
  const times = new Float64Array(iterations);
  try {
    link.send({ buffer, rounds: warmup + iterations });
    await link.receive();
    const limit = performance.now() + SPIN_FLOOR_LIMIT_MS;
    for (let i = 0; i < warmup + iterations; i++) {
      const t0 = process.hrtime.bigint();
      words.add32(SPIN_PING, 1);
      while (!words.spinWait32(SPIN_PONG, i, 1000)) {
        if (performance.now() > limit) throw new Error('spin floor: the child stopped answering');
      }
      if (i >= warmup) times[i - warmup] = Number(process.hrtime.bigint() - t0) / 1000;
    }
    const mine = onCpu();
    const theirs = ((await link.receive()) as { cpu: number }).cpu;
    return { us: summarize(times), placement: cpuPlacement(mine, theirs) };
  } finally {
    words.close();
    buffer.close();
    await waitExit(child);
  }
}

/** The reference: a 64-byte round trip over a Unix socket between two Node processes (node:net). */
async function socketRoundTrip(iterations: number, warmup: number): Promise<Summary> {
  const dir = mkdtempSync(join(tmpdir(), 'cuda-ipc-bench-'));
  const path = join(dir, 'echo.sock');
  const server = createServer();
  await new Promise<void>((r) => server.listen(path, r));
  const connected = new Promise<Socket>((r) => server.once('connection', r));
  const { child } = await spawn(CHILD, ['socket-echo', path], { stdio: 'inherit' });
  const socket = await connected;
  socket.setNoDelay(true);
  const payload = Buffer.alloc(64, 7);
  const times = new Float64Array(iterations);
  try {
    let got = 0;
    let resolve: (() => void) | undefined;
    socket.on('data', (d) => {
      got += d.length;
      if (got >= 64) {
        got -= 64;
        resolve?.();
      }
    });
    for (let i = 0; i < warmup + iterations; i++) {
      const t0 = process.hrtime.bigint();
      const back = new Promise<void>((r) => (resolve = r));
      socket.write(payload);
      await back;
      if (i >= warmup) times[i - warmup] = Number(process.hrtime.bigint() - t0) / 1000;
    }
  } finally {
    socket.destroy();
    server.close();
    await waitExit(child);
    rmSync(dir, { recursive: true, force: true });
  }
  return summarize(times);
}

/** Median and p99 of per-iteration microseconds through out -> child -> back. */
async function roundTrip(memory: ChannelMemory, wait: WaitMode, iterations: number, warmup: number): Promise<{ us: Summary; cpuUsPerMsg: number; placement: string }> {
  const { child, link } = await spawn(CHILD, ['echo', wait], { stdio: 'inherit' });
  const opts = { slots: 4, slotBytes: 4096, memory, wait } as const;
  const out = await createChannel(link, { ...opts, role: 'producer' });
  const back = await createChannel(link, { ...opts, role: 'consumer' });
  const stream = out.device ? Stream.create(out.device) : undefined;
  const times = new Float64Array(iterations);
  let mine = 0;
  let ranOn = -1;
  try {
    let cpu0 = process.cpuUsage();
    for (let i = 0; i < warmup + iterations; i++) {
      if (i === warmup) {
        cpu0 = process.cpuUsage();
        ranOn = onCpu();
      }
      const t0 = process.hrtime.bigint();
      const slot = await out.acquire({ stream });
      if (!stream) slot.bytes[0] = i & 0xff;
      // Length 2 marks the first timed message: the child counts its CPU from there.
      out.publish(slot, { stream, length: i === warmup ? 2 : 1 });
      const m = (await back.receive())!;
      m.release({ stream });
      if (i >= warmup) times[i - warmup] = Number(process.hrtime.bigint() - t0) / 1000;
    }
    mine = cpuOf(process.cpuUsage(cpu0));
  } finally {
    await out.end();
    back.close();
    stream?.close();
  }
  const theirs = (await link.receive()) as { cpu: number; ranOn: number };
  await waitExit(child);
  return { us: summarize(times), cpuUsPerMsg: (mine + theirs.cpu) / (2 * iterations), placement: cpuPlacement(ranOn, theirs.ranOn) };
}

/** The slot size of the rows with a Python end (compared with Node's row of the same size). */
const PYTHON_SLOT_BYTES = 4 << 10;

/** Bytes each one-way message says it uses (the producer writes one of them, on host slots). */
const ONE_WAY_LENGTH = 8;

/** One way for about `ms`: rates per batch of 2000 messages, and CPU per message. */
async function oneWay(memory: ChannelMemory, wait: WaitMode, slotBytes: number, slots: number, ms: number) {
  const { child, link } = await spawn(CHILD, ['sink', wait], { stdio: 'inherit' });
  const ch = await createChannel(link, { role: 'producer', slots, slotBytes, memory, wait });
  const stream = ch.device ? Stream.create(ch.device) : undefined;
  const rates: number[] = [];
  let total = 0;
  const batch = 2000;
  const end = performance.now() + ms;
  let mine = 0;
  try {
    const cpu0 = process.cpuUsage();
    while (performance.now() < end || rates.length < 5) {
      const t0 = process.hrtime.bigint();
      for (let i = 0; i < batch; i++) {
        const slot = await ch.acquire({ stream });
        if (!stream) slot.bytes[0] = 1;
        ch.publish(slot, { stream, length: ONE_WAY_LENGTH });
      }
      rates.push(batch / (Number(process.hrtime.bigint() - t0) / 1e9));
      total += batch;
    }
    await ch.end();
    mine = cpuOf(process.cpuUsage(cpu0));
  } finally {
    if (!ch.closed) ch.close();
    stream?.close();
  }
  const r = (await link.receive()) as { n: number; sum: number; cpu: number };
  await waitExit(child);
  if (r.n !== total || (!stream && r.sum !== total)) throw new Error(`one-way benchmark: the consumer saw ${r.n} of ${total} messages`);
  const sorted = rates.slice().sort((a, b) => a - b);
  return { msgsPerSec: summarize(rates), slowest1pct: sorted[Math.floor(sorted.length * 0.01)]!, cpuUsPerMsg: (mine + r.cpu) / total };
}

async function workSharing(memory: ChannelMemory, consumers: number, ms: number): Promise<number> {
  const hub = ChannelHub.create({ slots: 16, slotBytes: 4096, memory, consumers, maxPeers: consumers + 1 });
  const ch = hub.producer();
  const kids: Array<{ child: Parameters<typeof waitExit>[0]; link: Link }> = [];
  const stream = ch.device ? Stream.create(ch.device) : undefined;
  let total = 0;
  try {
    for (let i = 0; i < consumers; i++) {
      const k = await spawn(CHILD, ['worker'], { stdio: 'inherit' });
      await hub.attach(k.link, { role: 'consumer' });
      kids.push(k);
    }
    const t0 = performance.now();
    while (performance.now() - t0 < ms) {
      for (let i = 0; i < 1000; i++) {
        const slot = await ch.acquire({ stream });
        if (!stream) slot.bytes[0] = 1;
        ch.publish(slot, { stream, length: ONE_WAY_LENGTH });
      }
      total += 1000;
    }
    await ch.end();
    const s = (performance.now() - t0) / 1000;
    let seen = 0;
    for (const k of kids) seen += ((await k.link.receive()) as { n: number }).n;
    if (seen !== total) throw new Error(`work-sharing benchmark: consumers saw ${seen} of ${total}`);
    return total / s;
  } finally {
    hub.close();
    stream?.close();
    for (const k of kids) await waitExit(k.child);
  }
}

async function kernelOnSlots(device: Device, reps: number): Promise<{ sharedUs: Summary; localUs: Summary; ratio: number }> {
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
    return { sharedUs, localUs, ratio: localUs.median / sharedUs.median };
  } finally {
    if (!ch.closed) ch.close();
    stream.close();
    await waitExit(child);
  }
}

export async function channelBenchmarks(iterations: number, warmup: number, device: Device | undefined, options: { python?: boolean } = {}): Promise<ChannelResults> {
  progress('floor: doorbell round trip (no channel)');
  const floor = await doorbellFloor(iterations, Math.max(warmup, 2000));
  progress('floor: spin round trip (shared word, no channel)');
  const spin = await spinFloor(iterations, Math.max(warmup, 2000));
  progress('reference: Node Unix socket round trip');
  const socketUs = await socketRoundTrip(iterations, Math.max(warmup, 2000));
  const res: ChannelResults = {
    floor: { doorbellUs: floor.us, doorbellCpuUsPerMsg: floor.cpuUsPerMsg, socketUs, spinUs: spin.us, spinPlacement: spin.placement },
    roundTrip: {}, oneWay: {}, workSharing: {},
  };
  const memories: Array<[Memory, ChannelMemory]> = [['host', 'host']];
  if (device) memories.push(['device', { device }]);
  for (const [memory, m] of memories) {
    for (const wait of WAITS) {
      const name = `round trip, ${wait} (${memory} slots)`;
      progress(name);
      // A longer warm-up than the handoff's: the channel's hot path must be compiled (steady state),
      // and the adaptive spin must have learned the gaps.
      const r = await roundTrip(m, wait, iterations, Math.max(warmup, 2000));
      res.roundTrip[name] = { memory, wait, us: r.us, cpuUsPerMsg: r.cpuUsPerMsg, placement: r.placement };
    }
  }
  const sizes = [4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20];
  for (const [memory, m] of memories) {
    const runs: Array<[WaitMode, number]> = [...sizes.map((s) => ['adaptive', s] as [WaitMode, number]), ['sleep', 4 << 10], ['spin', 4 << 10]];
    for (const [wait, size] of runs) {
      const name = `one way, ${fmtBytes(size)} slots, ${wait} (${memory} slots)`;
      progress(name);
      const r = await oneWay(m, wait, size, 8, 700);
      res.oneWay[name] = { memory, wait, slotBytes: size, msgsPerSec: r.msgsPerSec, slowest1pct: r.slowest1pct, bytesWrittenPerMsg: memory === 'host' ? 1 : 0, cpuUsPerMsg: r.cpuUsPerMsg };
    }
  }
  if (options.python !== false) {
    const why = pythonChannelUnavailable();
    if (why) {
      res.python = { skipped: `no usable python3 with cuda_ipc: ${why}` };
    } else {
      progress('one way, Node -> Python (host slots)');
      const a = await nodeToPython('adaptive', PYTHON_SLOT_BYTES, 8, 700);
      progress('one way, Python -> Node (host slots)');
      // As many messages as Node -> Python moved in its time: about as long.
      const count = Math.max(20_000, Math.min(2_000_000, Math.round(a.msgsPerSec.median * 0.7)));
      const b = await pythonToNode('adaptive', PYTHON_SLOT_BYTES, 8, count);
      res.python = { rows: [a, b] };
    }
  }
  for (const consumers of [1, 2, 4, 8]) {
    progress(`work sharing, ${consumers}`);
    res.workSharing[`work sharing, ${consumers} consumer${consumers > 1 ? 's' : ''} (host slots)`] = { consumers, msgsPerSec: await workSharing('host', consumers, 700) };
  }
  if (device) {
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

/** Which measurement is running, on stderr: a slow or stuck one shows where it is. */
const started = performance.now();
function progress(what: string): void {
  process.stderr.write(`  [+${((performance.now() - started) / 1000).toFixed(1)} s] measuring ${what}\n`);
}

function fmtBytes(n: number): string {
  return n >= 1 << 20 ? `${n / 1048576} MiB` : `${n / 1024} KiB`;
}

const fmtRate = (v: number) => (v >= 1e9 ? `${(v / 1e9).toFixed(1)} G` : v >= 1e6 ? `${(v / 1e6).toFixed(2)} M` : `${(v / 1e3).toFixed(0)} k`);
const met = (ok: boolean) => (ok ? 'MET' : 'MISSED');
const cpuNote = (us: number) => `CPU ${us.toFixed(2)} us/msg (both processes)`;

/** The rows of the channel tables, each figure against its target. */
export function channelRows(r: ChannelResults): { latency: Row[]; throughput: Row[]; kernel: Row[] } {
  const socket = r.floor.socketUs.median;
  const latency: Row[] = [
    { name: 'floor: doorbell round trip (eventfd + event loop, no channel)', unit: 'us', median: r.floor.doorbellUs.median, p99: r.floor.doorbellUs.p99, n: r.floor.doorbellUs.n,
      notes: [`${(r.floor.doorbellUs.median / socket).toFixed(2)}x the socket round trip`, cpuNote(r.floor.doorbellCpuUsPerMsg)] },
    { name: 'floor: spin round trip (a shared word, two processes, no channel)', unit: 'us', median: r.floor.spinUs.median, p99: r.floor.spinUs.p99, n: r.floor.spinUs.n,
      notes: [r.floor.spinPlacement] },
    { name: 'reference: Node Unix socket round trip, 64 bytes', unit: 'us', median: socket, p99: r.floor.socketUs.p99, n: r.floor.socketUs.n },
  ];
  for (const [name, t] of Object.entries(r.roundTrip)) {
    const notes: string[] = [];
    if (t.wait === 'adaptive') {
      const target = t.memory === 'host' ? TARGETS.rttDefaultHostUs : TARGETS.rttDefaultDeviceUs;
      const ratio = t.us.median / socket;
      notes.push(`target <= ${target} us: ${met(t.us.median <= target)}`, `${ratio.toFixed(2)}x socket (target <= ${TARGETS.rttDefaultVsSocket}x): ${met(ratio <= TARGETS.rttDefaultVsSocket)}`);
    } else if (t.wait === 'spin') {
      const target = t.memory === 'host' ? TARGETS.rttSpinHostUs : TARGETS.rttSpinDeviceUs;
      notes.push(`target <= ${target} us: ${met(t.us.median <= target)}`, `${(t.us.median / r.floor.spinUs.median).toFixed(1)}x the spin floor`, t.placement);
    } else {
      notes.push('no spinning');
    }
    notes.push(cpuNote(t.cpuUsPerMsg));
    latency.push({ name, unit: 'us', median: t.us.median, p99: t.us.p99, n: t.us.n, notes });
  }
  const throughput: Row[] = [];
  for (const [name, o] of Object.entries(r.oneWay)) {
    const target = o.memory === 'host' ? TARGETS.oneWayHostMsgsPerSec : TARGETS.oneWayDeviceMsgsPerSec;
    // What was measured is messages: a slot changes hands in place, nothing is copied (the
    // producer writes one byte of a host slot), so a "bytes per second" of slot size times
    // messages would read as a bandwidth that no copy ever achieved.
    const notes = [`${o.memory === 'host' ? `${o.bytesWrittenPerMsg} byte written per message` : 'no byte written by the CPU'}, the ${fmtBytes(o.slotBytes)} slot handed over in place (no copy)`];
    if (o.wait === 'adaptive') notes.push(`target >= ${fmtRate(target)} msg/s: ${met(o.msgsPerSec.median >= target)}`);
    notes.push(cpuNote(o.cpuUsPerMsg));
    throughput.push({ name, unit: 'msg/s', median: o.msgsPerSec.median, p99: o.slowest1pct, n: o.msgsPerSec.n, notes });
  }
  if (r.python && 'rows' in r.python) {
    const node = Object.values(r.oneWay).find((o) => o.memory === 'host' && o.wait === 'adaptive' && o.slotBytes === PYTHON_SLOT_BYTES);
    for (const p of r.python.rows) {
      const notes = [p.direction === 'node->python' ? 'a Node producer, a Python consumer' : 'a Python producer, a Node consumer'];
      if (node) {
        const ratio = p.msgsPerSec.median / node.msgsPerSec.median;
        notes.push(`${(ratio * 100).toFixed(0)}% of Node -> Node's ${fmtRate(node.msgsPerSec.median)} msg/s (target >= ${TARGETS.pythonVsNode * 100}%): ${met(ratio >= TARGETS.pythonVsNode)}`);
      }
      notes.push(cpuNote(p.cpuUsPerMsg));
      const name = `one way, ${fmtBytes(p.slotBytes)} slots, ${p.wait}, ${p.direction === 'node->python' ? 'Node -> Python' : 'Python -> Node'} (host slots)`;
      throughput.push({ name, unit: 'msg/s', median: p.msgsPerSec.median, p99: p.slowest1pct, n: p.msgsPerSec.n, notes });
    }
  } else if (r.python) {
    throughput.push({ name: 'one way with a Python end', unit: 'msg/s', median: NaN, notes: [`skipped: ${r.python.skipped}`] });
  }
  for (const [name, w] of Object.entries(r.workSharing)) {
    throughput.push({ name, unit: 'msg/s', median: w.msgsPerSec, notes: ['all consumers together'] });
  }
  const kernel: Row[] = [];
  if (r.kernel) {
    const k = r.kernel;
    kernel.push({ name: 'checksum kernel on a 256 MiB shared slot', unit: 'us', median: k.sharedUs.median, p99: k.sharedUs.p99, n: k.sharedUs.n,
      notes: [`${(k.ratio * 100).toFixed(1)}% of local speed; target >= ${TARGETS.kernelRatio * 100}%: ${met(k.ratio >= TARGETS.kernelRatio)}`] });
    kernel.push({ name: 'same kernel on its own memory', unit: 'us', median: k.localUs.median, p99: k.localUs.p99, n: k.localUs.n });
  }
  return { latency, throughput, kernel };
}

/** Prints the channel tables (bench/main.ts). */
export function printChannelTables(r: ChannelResults, iterations: number, warmup: number, device: Device | undefined): void {
  const t = channelRows(r);
  console.log(`\nchannels: ${device ? 'host and device slots' : 'host slots only (no GPU)'}; round trips ${iterations} timed after ${Math.max(warmup, 2000)} warm-up, ` +
    'one way and work sharing about 0.7 s each; wait modes: adaptive (the default), sleep, spin');
  printTable('Channel round trip: a message to a child through one channel and back through another ' +
    `(targets: adaptive <= ${TARGETS.rttDefaultHostUs} us host / ${TARGETS.rttDefaultDeviceUs} us device and <= ${TARGETS.rttDefaultVsSocket}x socket; ` +
    `spin <= ${TARGETS.rttSpinHostUs} / ${TARGETS.rttSpinDeviceUs} us)`, t.latency);
  printTable('Channel throughput in messages per second (higher is better; one way: median of 2000-message batches, "p99" column = slowest 1% of batches; ' +
    'slots change hands in place, so these are not copy bandwidths)', t.throughput);
  if (t.kernel.length) printTable('Consumer kernel on shared slots (lower is better)', t.kernel);
}
