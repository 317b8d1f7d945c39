// Channel benchmarks: round trips through a pair of channels (futex and spin), one-way throughput
// for slots of 4 KiB to 64 MiB, work sharing with 1 to 8 consumers, and (on a GPU) a consumer
// kernel on shared slots against the same kernel on its own memory.
import { spawn, type Link } from '../src/link/index.js';
import { Channel, createChannel, type ChannelMemory } from '../src/channel/index.js';
import { Device } from '../src/cuda/device.js';
import { Stream } from '../src/cuda/stream.js';
import { HostBuffer } from '../src/host/index.js';
import { addon } from '../src/native.js';
import { Sleeper } from '../src/channel/sleeper.js';
import { summarize, type Row, type Summary } from './stats.js';

const CHILD = new URL('./channel-child.js', import.meta.url);

export const TARGETS = {
  rttFutexUs: 15,
  rttSpinUs: 5,
  oneWayMsgsPerSec: 150_000,
  kernelRatio: 0.95,
} as const;

export interface ChannelResults {
  roundTrip: Record<string, Summary>;
  /** Per-batch rates: median and the slowest 1% (p99 column). */
  oneWay: Record<string, { slotBytes: number; msgsPerSec: Summary; slowest1pct: number; bytesPerSec: number }>;
  workSharing: Record<string, { consumers: number; msgsPerSec: number }>;
  kernel?: { sharedUs: Summary; localUs: Summary; ratio: number };
}

function waitExit(child: { exitCode: number | null; signalCode: string | null; once(e: 'exit', f: () => void): unknown }): Promise<void> {
  return child.exitCode !== null || child.signalCode !== null ? Promise.resolve() : new Promise((r) => child.once('exit', () => r()));
}

/** Median and p99 of per-iteration microseconds through ch -> child -> back. */
async function roundTrip(memory: ChannelMemory, wait: 'futex' | 'spin', iterations: number, warmup: number): Promise<Summary> {
  const { child, link } = await spawn(CHILD, ['echo', wait], { stdio: 'inherit' });
  const opts = { slots: 4, slotBytes: 4096, memory, wait, spinMicros: 200 } as const;
  const out = await createChannel(link, { ...opts, role: 'producer' });
  const back = await createChannel(link, { ...opts, role: 'consumer' });
  const stream = out.device ? Stream.create(out.device) : undefined;
  const times = new Float64Array(iterations);
  try {
    for (let i = 0; i < warmup + iterations; i++) {
      const t0 = process.hrtime.bigint();
      const slot = await out.acquire({ stream });
      if (!stream) slot.bytes[0] = i & 0xff;
      out.publish(slot, { stream, length: 1 });
      const m = (await back.receive())!;
      m.release({ stream });
      if (i >= warmup) times[i - warmup] = Number(process.hrtime.bigint() - t0) / 1000;
    }
  } finally {
    await out.end();
    back.close();
    stream?.close();
    await waitExit(child);
  }
  return summarize(times);
}

/**
 * The floor under 'futex' round trips: two processes bounce a word with the same native waiter
 * thread and wake-ups, and no channel. Each direction is two thread wake-ups (the waiter thread,
 * then the event loop), so the channel cannot go below this.
 */
async function futexFloor(iterations: number, warmup: number): Promise<Summary> {
  const { child, link } = await spawn(CHILD, ['raw-echo'], { stdio: 'inherit' });
  const control = HostBuffer.allocate(4096);
  const words = new addon.SharedWords(control.fd, 4096);
  const sleeper = new Sleeper();
  const times = new Float64Array(iterations);
  try {
    link.send({ control });
    await link.receive();
    for (let i = 1; i <= warmup + iterations; i++) {
      const t0 = process.hrtime.bigint();
      words.store32(0, i);
      words.wake(0, 1);
      let v: number;
      while ((v = words.load32(64)) !== i) await sleeper.wait(words, 64, v, 1000);
      if (i > warmup) times[i - warmup - 1] = Number(process.hrtime.bigint() - t0) / 1000;
    }
  } finally {
    words.store32(0, 0xffffffff);
    words.wake(0, 1);
    sleeper.close();
    words.close();
    control.close();
    await waitExit(child);
  }
  return summarize(times);
}

/** One way for about `ms`: rates per batch of `batch` messages. */
async function oneWay(memory: ChannelMemory, slotBytes: number, slots: number, ms: number): Promise<{ msgsPerSec: Summary; slowest1pct: number; total: number }> {
  const { child, link } = await spawn(CHILD, ['sink', 'futex'], { stdio: 'inherit' });
  const ch = await createChannel(link, { role: 'producer', slots, slotBytes, memory });
  const stream = ch.device ? Stream.create(ch.device) : undefined;
  const rates: number[] = [];
  let total = 0;
  const batch = 2000;
  const end = performance.now() + ms;
  try {
    while (performance.now() < end || rates.length < 5) {
      const t0 = process.hrtime.bigint();
      for (let i = 0; i < batch; i++) {
        const slot = await ch.acquire({ stream });
        if (!stream) slot.bytes[0] = 1;
        ch.publish(slot, { stream, length: 8 });
      }
      rates.push(batch / (Number(process.hrtime.bigint() - t0) / 1e9));
      total += batch;
    }
    await ch.end();
    const r = (await link.receive()) as { n: number };
    if (!stream && r.n !== total) throw new Error(`one-way benchmark: the consumer saw ${r.n} of ${total} messages`);
  } finally {
    if (!ch.closed) ch.close();
    stream?.close();
    await waitExit(child);
  }
  const sorted = rates.slice().sort((a, b) => a - b);
  return { msgsPerSec: summarize(rates), slowest1pct: sorted[Math.floor(sorted.length * 0.01)]!, total };
}

async function workSharing(memory: ChannelMemory, consumers: number, ms: number): Promise<number> {
  const ch = Channel.create({ role: 'producer', slots: 16, slotBytes: 4096, memory, consumers, maxPeers: Math.max(consumers, 2) });
  const kids: Array<{ child: Parameters<typeof waitExit>[0]; link: Link }> = [];
  const stream = ch.device ? Stream.create(ch.device) : undefined;
  let total = 0;
  try {
    for (let i = 0; i < consumers; i++) {
      const k = await spawn(CHILD, ['worker', 'futex'], { stdio: 'inherit' });
      await ch.attach(k.link, { role: 'consumer' });
      kids.push(k);
    }
    const t0 = performance.now();
    while (performance.now() - t0 < ms) {
      for (let i = 0; i < 1000; i++) {
        const slot = await ch.acquire({ stream });
        if (!stream) slot.bytes[0] = 1;
        ch.publish(slot, { stream, length: 8 });
      }
      total += 1000;
    }
    await ch.end();
    const s = (performance.now() - t0) / 1000;
    let seen = 0;
    for (const k of kids) seen += ((await k.link.receive()) as { n: number }).n;
    if (!stream && seen !== total) throw new Error(`work-sharing benchmark: consumers saw ${seen} of ${total}`);
    return total / s;
  } finally {
    if (!ch.closed) ch.close();
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

export async function channelBenchmarks(iterations: number, warmup: number, device: Device | undefined): Promise<ChannelResults> {
  const res: ChannelResults = { roundTrip: {}, oneWay: {}, workSharing: {} };
  const memories: Array<[string, ChannelMemory]> = [['host slots', 'host']];
  if (device) memories.push(['device slots', { device }]);
  progress('futex wake-up floor (no channel)');
  res.roundTrip['floor: futex wake-ups alone, no channel'] = await futexFloor(iterations, warmup);
  for (const [label, memory] of memories) {
    for (const wait of ['futex', 'spin'] as const) {
      progress(`round trip, ${wait} (${label})`);
      // A longer warm-up than the handoff's: the channel's hot path must be compiled (steady state).
      res.roundTrip[`round trip, ${wait} (${label})`] = await roundTrip(memory, wait, iterations, Math.max(warmup, 2000));
    }
  }
  const sizes = [4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20];
  for (const [label, memory] of memories) {
    for (const size of sizes) {
      const name = `one way, ${fmtBytes(size)} slots (${label})`;
      progress(name);
      const r = await oneWay(memory, size, 8, 700);
      res.oneWay[name] = { slotBytes: size, msgsPerSec: r.msgsPerSec, slowest1pct: r.slowest1pct, bytesPerSec: r.msgsPerSec.median * size };
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

/** The rows of the channel tables, each figure against its target. */
export function channelRows(r: ChannelResults): { latency: Row[]; throughput: Row[]; kernel: Row[] } {
  const latency: Row[] = [];
  for (const [name, s] of Object.entries(r.roundTrip)) {
    if (name.startsWith('floor')) {
      latency.push({ name, unit: 'us', median: s.median, p99: s.p99, n: s.n, notes: ['native waiter thread + event loop wake-up each way'] });
      continue;
    }
    const target = name.includes('spin') ? TARGETS.rttSpinUs : TARGETS.rttFutexUs;
    latency.push({ name, unit: 'us', median: s.median, p99: s.p99, n: s.n, notes: [`target median <= ${target} us: ${met(s.median <= target)}`] });
  }
  const throughput: Row[] = [];
  for (const [name, o] of Object.entries(r.oneWay)) {
    throughput.push({
      name, unit: 'msg/s', median: o.msgsPerSec.median, p99: o.slowest1pct, n: o.msgsPerSec.n,
      notes: [`${fmtRate(o.bytesPerSec)}B/s made available`, `target >= ${fmtRate(TARGETS.oneWayMsgsPerSec)} msg/s: ${met(o.msgsPerSec.median >= TARGETS.oneWayMsgsPerSec)}`],
    });
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

