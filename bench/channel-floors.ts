// The floors under the channel rows (bench/channel.ts): a wake-up through a pair of eventfd
// doorbells, a shared word bounced between two spinning processes, and the Node Unix socket round
// trip they are compared with; each in a fresh child (bench/channel-child.ts).
import { createServer, type Socket } from 'node:net';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { HostBuffer } from '../src/host/index.js';
import { JsWords } from '../src/channel/js-words.js';
import { Doorbells } from '../src/channel/doorbells.js';
import { spawn } from '../src/link/index.js';
import { addon } from '../src/native/addon.js';
import { endpointOf } from '../src/channel/internal.js';
import { CIP, CSlotRing, RING_ENV, type RingKind } from '../src/channel/c-ring.js';
import { H } from '../src/channel/layout.js';
import { createChannel, type ChannelConsumer, type ChannelProducer } from '../src/channel/index.js';
import { cpuPlacement, onCpu } from './placement.js';
import { ONE_WAY_WARMUP_MS, RoundSchedule } from './stats.js';

const CHILD = new URL('./channel-child.js', import.meta.url);

export function waitExit(child: { exitCode: number | null; signalCode: string | null; once(e: 'exit', f: () => void): unknown }): Promise<void> {
  return child.exitCode !== null || child.signalCode !== null ? Promise.resolve() : new Promise((r) => child.once('exit', () => r()));
}

export const cpuOf = (u: NodeJS.CpuUsage) => u.user + u.system;

export interface WaitCounts { spinHits: number; sleeps: number }

/** How a channel end's waits ended so far: those its spin caught, and its sleeps on the doorbell (an
 * adaptive end that sleeps costs its peer a doorbell ring and itself a wake-up through the event
 * loop: the figure that tells a slow run from the others). */
export function waitsOf(end: object): WaitCounts {
  const s = endpointOf.get(end)?.waiter.stats;
  return { spinHits: s?.spinHits ?? 0, sleeps: s?.sleeps ?? 0 };
}

/** The floor: two processes bounce a wake-up through a pair of eventfd doorbells, each polled by
 * the other process's event loop, with no channel (what a sleeping channel end costs, both ways). */
export async function doorbellFloor(iterations: number, warmup: number, env: NodeJS.ProcessEnv): Promise<{ us: Float64Array; cpuUsPerMsg: number }> {
  const { child, link } = await spawn(CHILD, ['doorbell-echo'], { stdio: 'inherit', env });
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
    return { us: times, cpuUsPerMsg: (mine + theirs) / (2 * iterations) };
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
export async function spinFloor(iterations: number, warmup: number, env: NodeJS.ProcessEnv): Promise<{ us: Float64Array; placement: string }> {
  const { child, link } = await spawn(CHILD, ['spin-echo'], { stdio: 'inherit', env });
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
    return { us: times, placement: cpuPlacement(mine, theirs) };
  } finally {
    words.close();
    buffer.close();
    await waitExit(child);
  }
}

/** The reference: a 64-byte round trip over a Unix socket between two Node processes (node:net). */
export async function socketRoundTrip(iterations: number, warmup: number, env: NodeJS.ProcessEnv): Promise<Float64Array> {
  const dir = mkdtempSync(join(tmpdir(), 'cuda-ipc-bench-'));
  const path = join(dir, 'echo.sock');
  const server = createServer();
  await new Promise<void>((r) => server.listen(path, r));
  const connected = new Promise<Socket>((r) => server.once('connection', r));
  const { child } = await spawn(CHILD, ['socket-echo', path], { stdio: 'inherit', env });
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
  return times;
}

// ---------------------------------------------------------------------------------------------
// The protocol floor (issue 38: which part of a spin round trip is the protocol, which the API).
// Two channels as the round-trip rows make them, on the C ring, driven directly by both processes:
// per message one native call each to claim, publish, take and release, and a spin on the data
// word, with no channel API around them (no slot or message objects, no promises, no checks of
// the caller's arguments). A row less its floor is what the channel API adds; the round-trip floor
// less the spin floor is the protocol's own cost (the cache lines a message moves, the calls).

/** The slots of a protocol-floor end: its C ring and a view of each slot. */
export interface DirectEnd {
  ring: CSlotRing;
  slots: HostBuffer[];
}

/** The C ring under a channel end (made with the C ring) and its slots' views. */
export function directEnd(end: object): DirectEnd {
  const e = endpointOf.get(end);
  if (!e || !(e.ring instanceof CSlotRing)) throw new Error('protocol floor: the channel end is not on the C ring');
  const slots: HostBuffer[] = [];
  for (let s = 0; s < e.ring.n; s++) slots.push(e.view(s) as HostBuffer);
  return { ring: e.ring, slots };
}

/** The child's environment and this process's while it makes its ends: CUDA_IPC_CHANNEL_RING as
 * `ring` asks (read when an end is made; c-ring.ts). */
export function ringEnv(env: NodeJS.ProcessEnv, ring: RingKind): NodeJS.ProcessEnv {
  return { ...env, [RING_ENV]: ring };
}

export async function withRing<T>(ring: RingKind, make: () => Promise<T>): Promise<T> {
  const before = process.env[RING_ENV];
  process.env[RING_ENV] = ring;
  try {
    return await make();
  } finally {
    if (before === undefined) delete process.env[RING_ENV];
    else process.env[RING_ENV] = before;
  }
}

/** The protocol floor gives up (a stuck peer) after this long in all. */
const PROTOCOL_FLOOR_LIMIT_MS = 20_000;

/** directReceive's result for the message that ends the echo. */
export const STOP = -1;

/** Sends one message on `out`: claim a slot (spinning on the space word while none is free), write
 * `value` (a byte; STOP: the message that ends the echo) into it, publish. */
export function directSend(out: DirectEnd, value: number, limit: number): void {
  const { ring } = out;
  let s: number;
  // The space word is read only once a claim failed (then the claim again, as the channel's wait
  // does): the consumer's release bumps it, so reading it on every send would move its line too.
  while ((s = ring.acquire()) < 0) {
    if (s !== CIP.NONE) throw ring.fail(s, 'acquire');
    const seq = ring.w.load32(H.spaceSeq);
    if ((s = ring.acquire()) >= 0) break;
    if (!ring.w.spinWait32(H.spaceSeq, seq, 1000) && performance.now() > limit) throw new Error('protocol floor: no slot came free');
  }
  const bytes = out.slots[s]!.bytes;
  bytes[0] = value & 0xff;
  bytes[1] = value === STOP ? 1 : 0;
  const published = ring.publish(s);
  if (published !== 'ok') throw new Error(`protocol floor: publish said ${published}`);
}

/** Receives one message on `input` (spinning on the data word while none is there): its byte, or STOP. */
export function directReceive(input: DirectEnd, limit: number): number {
  const { ring } = input;
  let s: number;
  for (;;) {
    const seq = ring.w.load32(H.dataSeq);
    s = ring.take();
    if (s >= 0) break;
    if (!ring.w.spinWait32(H.dataSeq, seq, 1000) && performance.now() > limit) throw new Error('protocol floor: no message came');
  }
  const bytes = input.slots[s]!.bytes;
  const value = bytes[1] === 1 ? STOP : bytes[0]!;
  ring.releaseTaken(s);
  return value;
}

/** A protocol-floor child in `mode` (channel-child.ts) and the channels it accepts, made here on the
 * C ring with `slots` 4 KiB host slots in spin mode, one per role of `roles` (this side's), in order. */
async function directChannels(mode: string, env: NodeJS.ProcessEnv, slots: number, roles: ReadonlyArray<'producer' | 'consumer'>) {
  const { child, link } = await spawn(CHILD, [mode], { stdio: 'inherit', env: ringEnv(env, 'c') });
  const ends: Array<ChannelProducer | ChannelConsumer> = [];
  try {
    for (const role of roles) ends.push(await withRing('c', () => createChannel(link, { slots, slotBytes: 4096, memory: 'host', wait: 'spin', role })));
  } catch (e) {
    child.kill();
    throw e;
  }
  return { child, link, ends };
}

/** The protocol floor: the round trip of the host spin row (bench/channel.ts) with both processes
 * calling the C ring directly (above), on the same schedule (RoundSchedule). */
export async function protocolFloor(iterations: number, warmup: number, env: NodeJS.ProcessEnv): Promise<{ us: Float64Array; placement: string }> {
  const { child, link, ends } = await directChannels('protocol-echo', env, 4, ['producer', 'consumer']);
  const out = ends[0] as ChannelProducer;
  const back = ends[1] as ChannelConsumer;
  const times: number[] = [];
  try {
    const o = directEnd(out);
    const b = directEnd(back);
    const limit = performance.now() + PROTOCOL_FLOOR_LIMIT_MS;
    const schedule = new RoundSchedule(warmup, iterations);
    for (let i = 0, when = schedule.next(); when !== 'done'; i++, when = schedule.next()) {
      const t0 = process.hrtime.bigint();
      directSend(o, i & 0xff, limit);
      const echoed = directReceive(b, limit);
      if (echoed !== (i & 0xff)) throw new Error(`protocol floor: message ${i} came back as ${echoed}`);
      if (when !== 'warm') times.push(Number(process.hrtime.bigint() - t0) / 1000);
    }
    directSend(o, STOP, limit);  // the child echoes until this one
  } catch (e) {
    child.kill();  // it would spin on for its minute
    throw e;
  } finally {
    await out.end();
    back.close();
  }
  const mine = onCpu();
  const theirs = (await link.receive()) as { cpu: number };
  await waitExit(child);
  return { us: Float64Array.from(times), placement: cpuPlacement(mine, theirs.cpu) };
}

/** The one-way protocol floor: the 4 KiB host one-way rows' messages (8 slots) with both processes
 * calling the C ring directly, the consumer spinning: rates of 2,000-message batches for `ms` after
 * ONE_WAY_WARMUP_MS untimed, as the one-way rows. */
export async function protocolOneWayFloor(ms: number, env: NodeJS.ProcessEnv): Promise<{ rates: number[]; placement: string }> {
  const { child, link, ends } = await directChannels('protocol-sink', env, 8, ['producer']);
  const out = ends[0] as ChannelProducer;
  const rates: number[] = [];
  let total = 0;
  try {
    const o = directEnd(out);
    const limit = performance.now() + PROTOCOL_FLOOR_LIMIT_MS;
    const timed = performance.now() + ONE_WAY_WARMUP_MS;
    const end = timed + ms;
    const batch = 2000;
    while (performance.now() < end || rates.length < 5) {
      const t0 = process.hrtime.bigint();
      for (let i = 0; i < batch; i++) directSend(o, 1, limit);
      const t1 = process.hrtime.bigint();
      total += batch;
      if (performance.now() >= timed) rates.push(batch / (Number(t1 - t0) / 1e9));
    }
    directSend(o, STOP, limit);  // the child takes messages until this one
  } catch (e) {
    child.kill();
    throw e;
  } finally {
    await out.end();
  }
  const mine = onCpu();
  const theirs = (await link.receive()) as { cpu: number; n: number; sum: number };
  await waitExit(child);
  if (theirs.n !== total || theirs.sum !== total) throw new Error(`protocol floor: the consumer took ${theirs.n} messages (byte sum ${theirs.sum}) of ${total}`);
  return { rates, placement: cpuPlacement(mine, theirs.cpu) };
}
