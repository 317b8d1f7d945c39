// The channel benchmarks' tables (bench/channel.ts measures): each figure against its target, with
// the CPU per message, where the processes ran, and the spread of the runs. A target is MET or
// MISSED only where the runs of the rows it depends on agree (spread <= 15%); else UNDECIDED.
import type { Device } from '../src/cuda/device.js';
import { fmtRate, printTable, spreadText, SPREAD_LIMIT, verdict, widest, withSpread, type Row, type TargetResult } from './stats.js';
import { ONE_WAY_WARMUP_MS, ROUND_TRIP_TIMED_MS, ROUND_TRIP_WARMUP_MS } from './stats.js';
import { fmtBytes, PYTHON_SLOT_BYTES, ROW, TARGETS, type ChannelResults, type Spread } from './channel.js';
import { defaultRingKind, type RingKind } from '../src/channel/c-ring.js';

const cpuNote = (us: number) => `CPU ${us.toFixed(2)} us/msg (both processes)`;

/** The core-to-core round trip probed before each run (channel.ts FLOOR_PROBE). */
const floorsNote = (perRun: number[]) => `core-to-core round trip before each run ${perRun.map((v) => v.toFixed(2)).join(' / ')} us`;
/** Doorbell sleeps per 1,000 messages (both ends) in each run: a slow run with many sleeps fell
 * out of spinning (its ends woke through the event loop). */
const sleepsNote = (perRun: number[]) => `doorbell sleeps per 1k msgs by run ${perRun.map((v) => (v >= 10 ? v.toFixed(0) : v.toFixed(1))).join(' / ')}`;

const RING_NAME: Record<RingKind, string> = { c: 'the C ring', js: 'the JavaScript ring' };

/** A row on the ring that is not its memory's default against the default's row of the same shape
 * (`ratio`: this row's figure over the default's): the ratio, and which ring is faster only where
 * both rows' runs agree (spread <= 15%). */
export function ringNote(ratio: number, what: 'time' | 'rate', ring: RingKind, thisFaster: boolean, ...spreads: Spread[]): string {
  const spread = widest(...spreads);
  const decided = verdict(true, spread) !== 'UNDECIDED';
  const other: RingKind = ring === 'c' ? 'js' : 'c';
  return `${ratio.toFixed(2)}x ${RING_NAME[other]}'s ${what} (the default): ${decided ? `${RING_NAME[thisFaster ? ring : other]} is faster` : `UNDECIDED (${spreadText(spread)})`}`;
}

/** The rows of the channel tables, each figure against its target, and every target's verdict. */
export function channelRows(r: ChannelResults): { latency: Row[]; throughput: Row[]; kernel: Row[]; targets: TargetResult[] } {
  const targets: TargetResult[] = [];
  /** Checks a target: `value` against `limit`, decided by the spread of the rows it depends on. */
  const check = (row: string, target: string, value: number, limit: number, atMost: boolean, ...spreads: Array<Spread | undefined>): string => {
    const spread = widest(...spreads);
    const v = verdict(atMost ? value <= limit : value >= limit, spread);
    targets.push({ row, target, value, limit, spread, verdict: v });
    return `${target}: ${v}${v === 'UNDECIDED' ? ` (${spreadText(spread)})` : ''}`;
  };
  const f = r.floor;
  const socket = f.socket?.us.median;
  const latency: Row[] = [];
  if (f.doorbell) {
    latency.push({ name: ROW.doorbell, unit: 'us', median: f.doorbell.us.median, p99: f.doorbell.us.p99, n: f.doorbell.us.n,
      notes: withSpread([...(socket ? [`${(f.doorbell.us.median / socket).toFixed(2)}x the socket round trip`] : []), cpuNote(f.doorbell.cpuUsPerMsg)], f.doorbell.runs) });
  }
  if (f.spin) latency.push({ name: ROW.spin, unit: 'us', median: f.spin.us.median, p99: f.spin.us.p99, n: f.spin.us.n, notes: withSpread([f.spin.placement], f.spin.runs) });
  if (f.protocol) {
    latency.push({ name: ROW.protocol, unit: 'us', median: f.protocol.us.median, p99: f.protocol.us.p99, n: f.protocol.us.n,
      notes: withSpread([...(f.spin ? [`${(f.protocol.us.median / f.spin.us.median).toFixed(1)}x the spin floor`] : []), f.protocol.placement], f.protocol.runs) });
  }
  if (f.socket) latency.push({ name: ROW.socket, unit: 'us', median: f.socket.us.median, p99: f.socket.us.p99, n: f.socket.us.n, notes: withSpread([], f.socket.runs) });
  for (const [name, t] of Object.entries(r.roundTrip)) {
    const notes: string[] = [];
    if (t.wait === 'adaptive') {
      const target = t.memory === 'host' ? TARGETS.rttDefaultHostUs : TARGETS.rttDefaultDeviceUs;
      notes.push(check(name, `target <= ${target} us`, t.us.median, target, true, t.runs));
      if (socket) {
        const ratio = t.us.median / socket;
        notes.push(check(name, `${ratio.toFixed(2)}x socket (target <= ${TARGETS.rttDefaultVsSocket}x)`, ratio, TARGETS.rttDefaultVsSocket, true, t.runs, f.socket?.runs));
      }
    } else if (t.wait === 'spin') {
      const target = t.memory === 'host' ? TARGETS.rttSpinHostUs : TARGETS.rttSpinDeviceUs;
      notes.push(check(name, `target <= ${target} us`, t.us.median, target, true, t.runs));
      if (f.spin) notes.push(`${(t.us.median / f.spin.us.median).toFixed(1)}x the spin floor`);
      // The same round trip with the ring called directly: what is left is the channel API's.
      if (f.protocol && t.memory === 'host' && t.ring === 'c') notes.push(`${(t.us.median / f.protocol.us.median).toFixed(2)}x the protocol floor (the channel API adds ${(t.us.median - f.protocol.us.median).toFixed(1)} us a round trip)`);
    } else {
      notes.push('no spinning');
    }
    if (t.placement) notes.push(t.placement);
    if (t.sleepsPer1k?.length) notes.push(sleepsNote(t.sleepsPer1k));
    if (t.floorsUs?.length) notes.push(floorsNote(t.floorsUs));
    const byDefault = t.ring !== defaultRingKind() ? r.roundTrip[ROW.roundTrip(t.wait, t.memory)] : undefined;
    if (byDefault) notes.push(ringNote(t.us.median / byDefault.us.median, 'time', t.ring, t.us.median < byDefault.us.median, t.runs, byDefault.runs));
    notes.push(cpuNote(t.cpuUsPerMsg));
    latency.push({ name, unit: 'us', median: t.us.median, p99: t.us.p99, n: t.us.n, notes: withSpread(notes, t.runs) });
  }
  const throughput: Row[] = [];
  if (f.protocolOneWay) {
    const pf = f.protocolOneWay;
    throughput.push({ name: ROW.protocolOneWay, unit: 'msg/s', median: pf.msgsPerSec.median, p99: pf.slowest1pct, n: pf.msgsPerSec.n, notes: withSpread([pf.placement], pf.runs) });
  }
  for (const [name, o] of Object.entries(r.oneWay)) {
    const target = o.memory === 'host' ? TARGETS.oneWayHostMsgsPerSec : TARGETS.oneWayDeviceMsgsPerSec;
    // What was measured is messages: a slot changes hands in place, nothing is copied (the
    // producer writes one byte of a host slot), so a "bytes per second" of slot size times
    // messages would read as a bandwidth that no copy ever achieved.
    const notes = [`${o.memory === 'host' ? `${o.bytesWrittenPerMsg} byte written per message` : 'no byte written by the CPU'}, the ${fmtBytes(o.slotBytes)} slot handed over in place (no copy)`];
    if (o.wait === 'adaptive') notes.push(check(name, `target >= ${fmtRate(target)} msg/s`, o.msgsPerSec.median, target, false, o.runs));
    // The same messages with the ring called directly: the rest of the time a message is the API's.
    const pf = f.protocolOneWay;
    if (pf && o.memory === 'host' && o.ring === 'c' && o.slotBytes === 4096) {
      notes.push(`${(o.msgsPerSec.median / pf.msgsPerSec.median).toFixed(2)}x the protocol floor's rate (the channel API adds ${(1e6 / o.msgsPerSec.median - 1e6 / pf.msgsPerSec.median).toFixed(2)} us a message)`);
    }
    const byDefault = o.ring !== defaultRingKind() ? r.oneWay[ROW.oneWay(o.slotBytes, o.wait, o.memory)] : undefined;
    if (byDefault) notes.push(ringNote(o.msgsPerSec.median / byDefault.msgsPerSec.median, 'rate', o.ring, o.msgsPerSec.median > byDefault.msgsPerSec.median, o.runs, byDefault.runs));
    notes.push(cpuNote(o.cpuUsPerMsg));
    if (o.placement) notes.push(o.placement);
    if (o.sleepsPer1k?.length) notes.push(sleepsNote(o.sleepsPer1k));
    if (o.floorsUs?.length) notes.push(floorsNote(o.floorsUs));
    throughput.push({ name, unit: 'msg/s', median: o.msgsPerSec.median, p99: o.slowest1pct, n: o.msgsPerSec.n, notes: withSpread(notes, o.runs) });
  }
  if (r.python && 'rows' in r.python) {
    const node = Object.values(r.oneWay).find((o) => o.memory === 'host' && o.wait === 'adaptive' && o.slotBytes === PYTHON_SLOT_BYTES && o.ring === defaultRingKind());
    for (const p of r.python.rows) {
      const notes = [`${p.direction.startsWith('python->node') ? 'a Python producer, a Node consumer' : 'a Node producer, a Python consumer'} (Python hot path: ${p.hotPath})`];
      if (node) {
        const ratio = p.msgsPerSec.median / node.msgsPerSec.median;
        notes.push(check(ROW.python(p.direction), `${(ratio * 100).toFixed(0)}% of Node -> Node's ${fmtRate(node.msgsPerSec.median)} msg/s (target >= ${TARGETS.pythonVsNode * 100}%)`,
          ratio, TARGETS.pythonVsNode, false, p.runs, node.runs));
      }
      notes.push(cpuNote(p.cpuUsPerMsg), `Python's CPU ${p.pythonCpuUsPerMsg.toFixed(2)} us/msg`);
      throughput.push({ name: ROW.python(p.direction), unit: 'msg/s', median: p.msgsPerSec.median, p99: p.slowest1pct, n: p.msgsPerSec.n, notes: withSpread(notes, p.runs) });
    }
  } else if (r.python) {
    throughput.push({ name: 'one way with a Python end', unit: 'msg/s', median: NaN, notes: [`skipped: ${r.python.skipped}`] });
  }
  for (const [name, w] of Object.entries(r.workSharing)) {
    throughput.push({ name, unit: 'msg/s', median: w.msgsPerSec, notes: withSpread(['all consumers together'], w.runs) });
  }
  const kernel: Row[] = [];
  if (r.kernel) {
    const k = r.kernel;
    kernel.push({ name: 'checksum kernel on a 256 MiB shared slot', unit: 'us', median: k.sharedUs.median, p99: k.sharedUs.p99, n: k.sharedUs.n,
      notes: [check('checksum kernel on a 256 MiB shared slot', `${(k.ratio * 100).toFixed(1)}% of local speed; target >= ${TARGETS.kernelRatio * 100}%`, k.ratio, TARGETS.kernelRatio, false,
        { medians: k.rounds, spread: k.roundsSpread })] });
    kernel.push({ name: 'same kernel on its own memory', unit: 'us', median: k.localUs.median, p99: k.localUs.p99, n: k.localUs.n });
  }
  return { latency, throughput, kernel, targets };
}

/** Prints the channel tables (bench/main.ts); returns every target's verdict (for the JSON). */
export function printChannelTables(r: ChannelResults, iterations: number, warmup: number, device: Device | undefined): TargetResult[] {
  const t = channelRows(r);
  console.log(`\nchannels: ${device ? 'host and device slots' : 'host slots only (no GPU)'}; round trips (and the protocol floor) at least ${iterations} and ${ROUND_TRIP_TIMED_MS} ms timed after at least ${Math.max(warmup, 2000)} and ${ROUND_TRIP_WARMUP_MS} ms untimed, ` +
    `one way and work sharing about 0.7 s each after ${ONE_WAY_WARMUP_MS} ms untimed; wait modes: adaptive (the default), sleep, spin; ` +
    `each row ${r.runs} time(s) after ${r.warmupRuns} dropped warm-up round(s), rows taking turns (each round starting further down the list), ` +
    `figures over all runs with each run's median and their spread, (max - min) / median; a target is MET or MISSED only where that spread ` +
    `is at most ${SPREAD_LIMIT * 100}% (else UNDECIDED); processes ${r.pinned}`);
  for (const l of r.leftovers) console.log(`  children still alive: ${l}`);
  console.log(r.cRingSkipped ? `  the C ring's rows did not run (every row on the JavaScript ring): ${r.cRingSkipped}`
    : '  rows run the C ring, the default on host and device slots; rows marked "JavaScript ring" run both ends on it (CUDA_IPC_CHANNEL_RING=js) ' +
      'beside the same row on the C ring');
  printTable('Channel round trip: a message to a child through one channel and back through another ' +
    `(targets: adaptive <= ${TARGETS.rttDefaultHostUs} us host / ${TARGETS.rttDefaultDeviceUs} us device and <= ${TARGETS.rttDefaultVsSocket}x socket; ` +
    `spin <= ${TARGETS.rttSpinHostUs} / ${TARGETS.rttSpinDeviceUs} us)`, t.latency);
  printTable('Channel throughput in messages per second (higher is better; one way: median of 2000-message batches, "p99" column = slowest 1% of batches; ' +
    'slots change hands in place, so these are not copy bandwidths)', t.throughput);
  if (t.kernel.length) printTable('Consumer kernel on shared slots (lower is better)', t.kernel);
  const count = (v: string) => t.targets.filter((x) => x.verdict === v).length;
  console.log(`\nchannel targets: ${count('MET')} met, ${count('MISSED')} missed, ${count('UNDECIDED')} undecided (runs spread over ${SPREAD_LIMIT * 100}%) of ${t.targets.length}`);
  return t.targets;
}
