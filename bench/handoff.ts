// The handoff benchmark: hand a fresh 1 MiB buffer to a child, which reads one value and
// acknowledges; the time is from allocating the buffer to having the ack and the buffer closed.
// With `breakdown`, a second, instrumented pass says where that time goes (breakdown.ts).
import { Device } from '../src/cuda/device.js';
import { DeviceBuffer } from '../src/cuda/buffer.js';
import { HostBuffer } from '../src/host/index.js';
import { spawn, type Link } from '../src/link/index.js';
import { FRAME_RING_DEFAULT } from '../src/link/transport/unix-transport.js';
import { summarize, type Summary } from './stats.js';
import { analyze, Mark, Recorder, type Breakdown } from './breakdown.js';

export const HANDOFF_BYTES = 1 << 20;

export type HandoffKind = 'pool' | 'pool-fresh' | 'legacy' | 'host' | 'floor' | 'host-alt' | 'floor-alt';
/** The rows ending in -alt run on a second child whose link takes the other path: frame rings on where the default is off, and the reverse. */
export const ALT_RINGS = !FRAME_RING_DEFAULT;
const altPath = ALT_RINGS ? 'frame rings on' : 'socket only (frame rings off)';
export const HANDOFF_NAMES: Record<HandoffKind, string> = {
  pool: 'pool buffer (IPC pool)',
  'pool-fresh': 'pool buffer, no recycled blocks (recycleBlocks 0)',
  legacy: 'legacy handle (cuIpcGetMemHandle)',
  host: 'host buffer (memfd)',
  floor: 'link round trip, no buffer (floor)',
  'host-alt': `host buffer (memfd), ${altPath}`,
  'floor-alt': `link round trip, ${altPath}`,
};

export interface HandoffResult {
  kind: HandoffKind;
  name: string;
  summary: Summary;
  breakdown?: Breakdown;
}

interface Case {
  kind: HandoffKind;
  /** The link it runs on (default: the benchmark's child with frame rings). */
  link?: Link;
  /** Allocates what is sent, and how the sender closes it. */
  make: () => { send: unknown; release: () => void };
  /** Hands over a marked buffer; the child must read the mark. */
  check?: () => { send: unknown; release: () => void; mark: number };
}

type Marker = ((m: number) => void) | undefined;

async function once(link: Link, c: Case, mark: Marker): Promise<number> {
  const t0 = process.hrtime.bigint();
  mark?.(Mark.Start);
  const { send, release } = c.make();
  mark?.(Mark.Allocated);
  link.send(send);
  await link.receive();
  mark?.(Mark.Acked);
  release();
  mark?.(Mark.Freed);
  return Number(process.hrtime.bigint() - t0) / 1000;
}

/** Waits until the child has released everything it was sent (its RELEASE frames arrived). */
async function settled(link: Link): Promise<void> {
  for (let i = 0; link.leases.count > 0 && i < 10_000; i++) await new Promise((r) => setImmediate(r));
}

/** One instrumented pass of `iterations` handoffs, both processes recording. */
async function instrumented(link: Link, c: Case, iterations: number): Promise<Breakdown> {
  link.send('record');
  if ((await link.receive()) !== 'recording') throw new Error('the benchmark child did not start recording');
  await settled(link);
  const recorder = new Recorder();
  recorder.install();
  try {
    for (let i = 0; i < iterations; i++) await once(link, c, recorder.mark);
  } finally {
    recorder.uninstall();
  }
  const parts: Float64Array[] = [];
  for (let at = 0; ; ) {
    link.send({ log: at });
    const part = (await link.receive()) as Float64Array;
    if (part.length === 0) break;
    parts.push(part);
    at += part.length;
  }
  const child = new Float64Array(parts.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const p of parts) { child.set(p, at); at += p.length; }
  await settled(link);
  return analyze(recorder.monotonic(), child);
}

export interface HandoffOptions {
  iterations: number;
  warmup: number;
  gpu: boolean;
  /** Handoffs in the instrumented pass per kind; 0: no breakdown. */
  breakdown: number;
}

/** Runs each available handoff kind, then the bare link round trip. */
export async function handoffBenchmarks(o: HandoffOptions): Promise<HandoffResult[]> {
  const childUrl = new URL('./handoff-child.js', import.meta.url);
  const { child, link: mainLink } = await spawn(childUrl, [], { stdio: 'inherit' });
  // The same child behind a link on the other path (frame rings on or off): what the rings buy
  // or cost, next to the default rows in the same run (unix-transport.ts).
  const alt = await spawn(childUrl, [], { stdio: 'inherit', frameRing: ALT_RINGS });
  const results: HandoffResult[] = [];
  let pool: import('../src/ipc/pool.js').IpcPool | undefined;
  let freshPool: import('../src/ipc/pool.js').IpcPool | undefined;
  try {
    const cases: Case[] = [];
    if (o.gpu) {
      const device = Device.get(0);
      const p = (pool = device.createIpcPool());
      cases.push({
        kind: 'pool',
        make: () => { const b = p.allocate(HANDOFF_BYTES); return { send: b, release: () => b.close() }; },
        check: () => { const b = p.allocate(HANDOFF_BYTES); b.write(new Uint32Array([0xbeef])); return { send: b, release: () => b.close(), mark: 0xbeef }; },
      });
      // Every buffer a new allocation (its export prepared by the addon's thread, not kept from
      // an earlier send): what the stash of released blocks buys, next to the row above.
      const f = (freshPool = device.createIpcPool({ recycleBlocks: 0 }));
      cases.push({
        kind: 'pool-fresh',
        make: () => { const b = f.allocate(HANDOFF_BYTES); return { send: b, release: () => b.close() }; },
        check: () => { const b = f.allocate(HANDOFF_BYTES); b.write(new Uint32Array([0xbee5])); return { send: b, release: () => b.close(), mark: 0xbee5 }; },
      });
      cases.push({
        kind: 'legacy',
        make: () => { const b = DeviceBuffer.allocate(HANDOFF_BYTES, { device }); return { send: b, release: () => b.close() }; },
        check: () => {
          const b = DeviceBuffer.allocate(HANDOFF_BYTES, { device });
          b.write(new Uint32Array([0xfeed]));
          return { send: b, release: () => b.close(), mark: 0xfeed };
        },
      });
    }
    cases.push({
      kind: 'host',
      make: () => { const b = HostBuffer.allocate(HANDOFF_BYTES); return { send: b, release: () => b.close() }; },
      check: () => { const b = HostBuffer.allocate(HANDOFF_BYTES); b.write(new Uint32Array([0xc0ffee])); return { send: b, release: () => b.close(), mark: 0xc0ffee }; },
    });
    // The control-plane floor: the same link carrying a number each way.
    cases.push({ kind: 'floor', make: () => ({ send: 4, release: () => {} }) });
    cases.push({ ...cases.find((c) => c.kind === 'host')!, kind: 'host-alt', link: alt.link });
    cases.push({ kind: 'floor-alt', link: alt.link, make: () => ({ send: 4, release: () => {} }) });

    for (const c of cases) {
      const link = c.link ?? mainLink;
      if (c.check) {
        // Correctness first: the child must read the marker.
        const { send, release, mark } = c.check();
        link.send(send);
        const got = await link.receive();
        release();
        if (got !== mark) throw new Error(`${c.kind}: the child read ${String(got)}, not the marker ${mark}`);
      }
      for (let i = 0; i < o.warmup; i++) await once(link, c, undefined);
      const times = new Float64Array(o.iterations);
      for (let i = 0; i < o.iterations; i++) times[i] = await once(link, c, undefined);
      const r: HandoffResult = { kind: c.kind, name: HANDOFF_NAMES[c.kind], summary: summarize(times) };
      if (o.breakdown > 0) r.breakdown = await instrumented(link, c, o.breakdown);
      results.push(r);
    }
  } finally {
    pool?.close();
    freshPool?.close();
    for (const s of [{ child, link: mainLink }, alt]) {
      s.link.send('end');
      await new Promise((r) => (s.child.exitCode !== null ? r(null) : s.child.once('exit', r)));
    }
  }
  return results;
}
