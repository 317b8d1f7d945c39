// Where the microseconds of one handoff go: both processes log timestamped points (the link's
// probes, src/link/transport/probe.ts, plus the benchmark's own marks around allocate, read and close), and
// the logs are cut into per-handoff phases. CLOCK_MONOTONIC is shared by every process on the
// machine, so the time between the sender's sendmsg() and the receiver's callback is measurable.
import { Probe, setProbe } from '../src/link/transport/probe.js';
import { traceNativeCalls } from './native-trace.js';

/** The benchmark's own marks, numbered after the link's probes. */
export const enum Mark {
  /** Sender: the handoff starts (before allocate). */
  Start = 32,
  Allocated = 33,
  /** Sender: receive() resolved with the ack. */
  Acked = 34,
  /** Sender: its buffer closed (the memory itself goes when the receiver's RELEASE arrives). */
  Freed = 35,
  /** Receiver: its message listener was entered. */
  HandlerIn = 36,
  ReadDone = 37,
  ClosedDone = 38,
  /** Either side: a call into the addon (CUDA driver call, system call) starts / returned. */
  NativeCall = 39,
  NativeReturn = 40,
}

/** CLOCK_MONOTONIC in microseconds minus performance.now() in microseconds, for this process. */
function monotonicOffsetUs(): number {
  let best = Infinity;
  let offset = 0;
  for (let i = 0; i < 9; i++) {
    const a = performance.now();
    const hr = Number(process.hrtime.bigint()) / 1000;
    const b = performance.now();
    if (b - a < best) {
      best = b - a;
      offset = hr - ((a + b) / 2) * 1000;
    }
  }
  return offset;
}

/** Logs (point, time) pairs into a preallocated array while installed. */
export class Recorder {
  readonly #log: Float64Array;
  #n = 0;
  readonly #offsetUs = monotonicOffsetUs();

  constructor(capacity = 1 << 17) {
    this.#log = new Float64Array(2 * capacity);
  }

  readonly mark = (point: number): void => {
    const i = 2 * this.#n;
    if (i >= this.#log.length) return;
    this.#log[i] = point;
    this.#log[i + 1] = performance.now();
    this.#n++;
  };

  #untrace: (() => void) | undefined;

  /** Starts recording the link's probes and every native call here (the benchmark calls mark() itself). */
  install(): void {
    setProbe(this.mark as (p: Probe) => void);
    this.#untrace ??= traceNativeCalls(this.mark, Mark.NativeCall, Mark.NativeReturn);
  }
  uninstall(): void {
    setProbe(undefined);
    this.#untrace?.();
    this.#untrace = undefined;
  }

  /** The log as (point, CLOCK_MONOTONIC microseconds) pairs. */
  monotonic(): Float64Array {
    const out = this.#log.slice(0, 2 * this.#n);
    for (let i = 1; i < out.length; i += 2) out[i] = out[i]! * 1000 + this.#offsetUs;
    return out;
  }
}

type Log = Float64Array;
/** Pairs [start, end) of a log, as indexes of entries. */
interface Segment { log: Log; from: number; to: number }

function point(s: Segment, i: number): number { return s.log[2 * i]!; }
function time(s: Segment, i: number): number { return s.log[2 * i + 1]!; }
/** Time of the first `p` at or after entry `after` in the segment; -1 index when none. */
function find(s: Segment, p: number, after = s.from): number {
  for (let i = after; i < s.to; i++) if (point(s, i) === p) return i;
  return -1;
}

function segments(log: Log, isStart: (log: Log, i: number) => boolean): Segment[] {
  const n = log.length / 2;
  const starts: number[] = [];
  for (let i = 0; i < n; i++) if (isStart(log, i)) starts.push(i);
  return starts.map((from, k) => ({ log, from, to: k + 1 < starts.length ? starts[k + 1]! : n }));
}

/** Time inside native calls (NativeCall to NativeReturn) that start in [t0, t1), and how many. */
function nativeIn(s: Segment, t0: number, t1: number): { us: number; calls: number } {
  let us = 0;
  let calls = 0;
  if (!(t1 > t0)) return { us, calls };
  for (let i = s.from; i < s.to; i++) {
    if (point(s, i) !== Mark.NativeCall) continue;
    const t = time(s, i);
    if (t < t0 || t >= t1) continue;
    const r = find(s, Mark.NativeReturn, i + 1);
    if (r < 0) continue;
    us += time(s, r) - t;
    calls++;
  }
  return { us, calls };
}

/** A record that is a message (not a RELEASE): RecordIn followed by an import or delivery. */
function isMessageIn(log: Log, i: number): boolean {
  if (log[2 * i] !== Probe.RecordIn) return false;
  let j = i + 1;
  while (2 * j < log.length && (log[2 * j] === Mark.NativeCall || log[2 * j] === Mark.NativeReturn)) j++;
  const next = log[2 * j];
  return next === Probe.ImportStart || next === Probe.Delivered;
}

/**
 * The phases, in the order they happen. On-path phases add up to the handoff; `beside: true` ones
 * overlap others (the sender's sendmsg() returning while the receiver already runs) or run after
 * the timed path (RELEASE frames).
 */
export const PHASES = [
  { key: 'allocate', side: 'sender', what: 'allocate the buffer' },
  { key: 'export', side: 'sender', what: 'export (transfer handler encode)' },
  { key: 'encode', side: 'sender', what: 'encode the frame (send() minus export)' },
  { key: 'wakeup', side: 'both', what: 'send + wake-up: sendmsg() start to the receiver\'s JS callback' },
  { key: 'send', side: 'sender', what: 'of which sendmsg() itself, until it returns', beside: true },
  { key: 'decode', side: 'receiver', what: 'decode the frame (minus import)' },
  { key: 'import', side: 'receiver', what: 'import (transfer handler decode)' },
  { key: 'deliver', side: 'receiver', what: 'deliver to the message listener' },
  { key: 'read', side: 'receiver', what: 'read one value' },
  { key: 'free.receiver', side: 'receiver', what: 'close (unmap / free)' },
  { key: 'ack.encode', side: 'receiver', what: 'ack: encode' },
  { key: 'ack.wakeup', side: 'both', what: 'ack: sendmsg() start to the sender\'s JS callback' },
  { key: 'ack.send', side: 'receiver', what: 'of which sendmsg() itself, until it returns', beside: true },
  { key: 'ack.decode', side: 'sender', what: 'decode the ack, resume the caller' },
  { key: 'free.sender', side: 'sender', what: 'close the buffer' },
  { key: 'release.send', side: 'receiver', what: 'RELEASE frame: encode + sendmsg()', beside: true },
  { key: 'release.handle', side: 'both', what: 'RELEASE frame: its sendmsg() to memory freed', beside: true },
  { key: 'release.done', side: 'sender', what: 'RELEASE frame: end the lease (free) in the callback', beside: true },
] as const;
export type PhaseKey = (typeof PHASES)[number]['key'];

export interface PhaseSummary { median: number; p99: number; n: number }
/** The part of a phase spent inside native calls (CUDA driver calls, system calls). */
export interface NativeSummary {
  /** Median time inside native calls, us. */
  median: number;
  /** Median number of native calls. */
  calls: number;
}
export interface Breakdown {
  /** Median of each phase over the handoffs in which it occurred. */
  phases: Partial<Record<PhaseKey, PhaseSummary>>;
  /** Of each phase that runs in one process, the part inside native calls. */
  native: Partial<Record<PhaseKey, NativeSummary>>;
  /** Median whole handoff (start to sender's close) in the instrumented run. */
  total: PhaseSummary;
  handoffs: number;
}

function summarize(values: number[]): PhaseSummary {
  const s = Float64Array.from(values).sort();
  const n = s.length;
  if (n === 0) return { median: NaN, p99: NaN, n };
  return { median: n % 2 ? s[n >> 1]! : (s[n / 2 - 1]! + s[n / 2]!) / 2, p99: s[Math.min(n - 1, Math.ceil(n * 0.99) - 1)]!, n };
}

/**
 * Cuts the sender's and the receiver's logs (point, monotonic us) into handoffs and phases. The
 * receiver's k-th message is the sender's k-th handoff.
 */
export function analyze(sender: Log, receiver: Log): Breakdown {
  const sent = segments(sender, (log, i) => log[2 * i] === Mark.Start);
  const got = segments(receiver, isMessageIn);
  const values = new Map<PhaseKey, number[]>();
  const add = (k: PhaseKey, v: number) => {
    if (!Number.isFinite(v)) return;
    let a = values.get(k);
    if (!a) values.set(k, (a = []));
    a.push(v);
  };
  const nativeUs = new Map<PhaseKey, number[]>();
  const nativeCalls = new Map<PhaseKey, number[]>();
  /** The native part of phase k: calls in [t0, t1), minus those in [x0, x1) (a nested phase). */
  const addNative = (k: PhaseKey, s: Segment, t0: number, t1: number, x0 = NaN, x1 = NaN) => {
    if (!Number.isFinite(t0) || !Number.isFinite(t1)) return;
    const n = nativeIn(s, t0, t1);
    if (Number.isFinite(x0) && Number.isFinite(x1)) {
      const x = nativeIn(s, x0, x1);
      n.us -= x.us;
      n.calls -= x.calls;
    }
    for (const [m, v] of [[nativeUs, n.us], [nativeCalls, n.calls]] as const) {
      let a = m.get(k);
      if (!a) m.set(k, (a = []));
      a.push(v);
    }
  };
  const totals: number[] = [];
  const n = Math.min(sent.length, got.length);
  for (let k = 0; k < n; k++) {
    const p = sent[k]!;
    const c = got[k]!;
    const at = (s: Segment, i: number) => (i < 0 ? NaN : time(s, i));
    const pStart = at(p, p.from);
    const pAlloc = at(p, find(p, Mark.Allocated));
    const pExportStart = at(p, find(p, Probe.ExportStart));
    const pExportEnd = at(p, find(p, Probe.ExportEnd));
    const pSockIdx = find(p, Probe.SocketSend);
    const pSock = at(p, pSockIdx);
    const pSentIdx = find(p, Probe.SocketSent, Math.max(p.from, pSockIdx));
    const pSent = at(p, pSentIdx);
    // The ack: a RecordIn followed by Delivered. RELEASE frames (of an earlier handoff) that
    // arrived in between are RecordIn followed by ReleaseDone.
    let pAckIn = NaN;
    for (let i = Math.max(p.from, pSentIdx); i + 1 < p.to; i++) {
      if (point(p, i) !== Probe.RecordIn) continue;
      // The next point that is not a native call's: what this record turned out to be.
      let j = i + 1;
      while (j < p.to && (point(p, j) === Mark.NativeCall || point(p, j) === Mark.NativeReturn)) j++;
      if (j >= p.to) continue;
      if (point(p, j) === Probe.Delivered && Number.isNaN(pAckIn)) pAckIn = time(p, i);
      if (point(p, j) === Probe.ReleaseDone) {
        add('release.done', time(p, j) - time(p, i));
        addNative('release.done', p, time(p, i), time(p, j));
      }
    }
    const pAcked = at(p, find(p, Mark.Acked));
    const pFreed = at(p, find(p, Mark.Freed));

    const cIn = time(c, c.from);
    const cImportStart = at(c, find(c, Probe.ImportStart));
    const cImportEnd = at(c, find(c, Probe.ImportEnd));
    const cDelivered = at(c, find(c, Probe.Delivered));
    const cHandler = at(c, find(c, Mark.HandlerIn));
    const cRead = at(c, find(c, Mark.ReadDone));
    const cClosedIdx = find(c, Mark.ClosedDone);
    const cClosed = at(c, cClosedIdx);
    const cAckSockIdx = find(c, Probe.SocketSend, Math.max(c.from, cClosedIdx));
    const cAckSock = at(c, cAckSockIdx);
    const cAckSent = at(c, find(c, Probe.SocketSent, Math.max(c.from, cAckSockIdx)));
    const cRelIdx = find(c, Probe.ReleaseSend);
    if (cRelIdx >= 0) {
      const relSent = find(c, Probe.SocketSent, cRelIdx);
      if (relSent >= 0) add('release.send', time(c, relSent) - time(c, cRelIdx));
    }
    addNative('allocate', p, pStart, pAlloc);
    addNative('export', p, pExportStart, pExportEnd);
    addNative('encode', p, pAlloc, pSock, pExportStart, pExportEnd);
    addNative('decode', c, cIn, cDelivered, cImportStart, cImportEnd);
    addNative('import', c, cImportStart, cImportEnd);
    addNative('deliver', c, cDelivered, cHandler);
    addNative('read', c, cHandler, cRead);
    addNative('free.receiver', c, cRead, cClosed);
    addNative('ack.encode', c, cClosed, cAckSock);
    addNative('ack.decode', p, pAckIn, pAcked);
    addNative('free.sender', p, pAcked, pFreed);

    const exportUs = Number.isNaN(pExportStart) ? 0 : pExportEnd - pExportStart;
    const importUs = Number.isNaN(cImportStart) ? 0 : cImportEnd - cImportStart;
    add('allocate', pAlloc - pStart);
    add('export', exportUs);
    add('encode', pSock - pAlloc - exportUs);
    add('send', pSent - pSock);
    add('wakeup', cIn - pSock);
    add('decode', cDelivered - cIn - importUs);
    add('import', importUs);
    add('deliver', cHandler - cDelivered);
    add('read', cRead - cHandler);
    add('free.receiver', cClosed - cRead);
    add('ack.encode', cAckSock - cClosed);
    add('ack.send', cAckSent - cAckSock);
    add('ack.wakeup', pAckIn - cAckSock);
    add('ack.decode', pAcked - pAckIn);
    add('free.sender', pFreed - pAcked);
    totals.push(pFreed - pStart);
  }
  // The sender's handling of RELEASE frames, wake-up included: from the receiver's sendmsg to the
  // end of the sender's processing. Matched by order: the k-th RELEASE sent is the k-th received.
  const relSent: number[] = [];  // the start of each RELEASE frame's sendmsg()
  for (let i = 0; i + 1 < receiver.length / 2; i++) {
    if (receiver[2 * i] !== Probe.ReleaseSend) continue;
    for (let j = i + 1; j < receiver.length / 2; j++) {
      if (receiver[2 * j] === Probe.SocketSend) { relSent.push(receiver[2 * j + 1]!); break; }
    }
  }
  const relDone: number[] = [];
  for (let i = 0; i < sender.length / 2; i++) if (sender[2 * i] === Probe.ReleaseDone) relDone.push(sender[2 * i + 1]!);
  for (let k = 0; k < Math.min(relSent.length, relDone.length); k++) add('release.handle', relDone[k]! - relSent[k]!);
  const phases: Breakdown['phases'] = {};
  const native: Breakdown['native'] = {};
  for (const ph of PHASES) {
    const v = values.get(ph.key);
    if (v?.length) phases[ph.key] = summarize(v);
    const us = nativeUs.get(ph.key);
    if (us?.length) native[ph.key] = { median: summarize(us).median, calls: summarize(nativeCalls.get(ph.key)!).median };
  }
  return { phases, native, total: summarize(totals), handoffs: n };
}

/** One table: phases down, handoff kinds across (median us, and p99 where asked). */
export function printBreakdown(title: string, results: ReadonlyMap<string, Breakdown>, timedMedians: ReadonlyMap<string, number>): void {
  const names = [...results.keys()];
  const fmt = (v: number | undefined) => (v === undefined || Number.isNaN(v) ? '-' : v >= 100 ? v.toFixed(0) : v.toFixed(1));
  const rows: string[][] = [];
  for (const ph of PHASES) {
    if ('beside' in ph && ph.key.startsWith('release')) continue;
    rows.push([ph.side, ph.what, ...names.map((n) => fmt(results.get(n)!.phases[ph.key]?.median))]);
  }
  rows.push(['', 'sum of the phase medians (the "of which" rows overlap and are not added)', ...names.map((n) => {
    let sum = 0;
    for (const ph of PHASES) if (!('beside' in ph)) sum += results.get(n)!.phases[ph.key]?.median ?? 0;
    return fmt(sum);
  })]);
  rows.push(['', 'median handoff, this instrumented run', ...names.map((n) => fmt(results.get(n)!.total.median))]);
  rows.push(['', 'median handoff, the timed run', ...names.map((n) => fmt(timedMedians.get(n)))]);
  for (const ph of PHASES) {
    if (!ph.key.startsWith('release')) continue;
    rows.push([ph.side, `after the ack: ${ph.what}`, ...names.map((n) => fmt(results.get(n)!.phases[ph.key]?.median))]);
  }
  const head = ['side', 'phase (median us)', ...names];
  const widths = head.map((h, i) => Math.max(h.length, ...rows.map((r) => r[i]!.length)));
  const line = (c: string[]) => '| ' + c.map((v, i) => (i >= 2 ? v.padStart(widths[i]!) : v.padEnd(widths[i]!))).join(' | ') + ' |';
  console.log(`\n${title}`);
  console.log(line(head));
  console.log('|' + widths.map((w) => '-'.repeat(w + 2)).join('|') + '|');
  for (const r of rows) console.log(line(r));
  console.log('Phases run back to back on the path of one handoff, so they add up to it; "of which" rows overlap the row above ' +
    '(where both processes share a core, a sendmsg() that wakes the peer also counts the time the peer runs first). The RELEASE ' +
    'frame tells the sender that the receiver closed the buffer; it follows the ack, so it is off the timed path.');
  printNative(results);
}

/** Of each phase in one process: median us inside native calls / median number of calls, and the rest (JavaScript). */
function printNative(results: ReadonlyMap<string, Breakdown>): void {
  const names = [...results.keys()];
  const fmt = (v: number) => (v >= 100 ? v.toFixed(0) : v.toFixed(1));
  const rows: string[][] = [];
  for (const ph of PHASES) {
    if (!names.some((n) => results.get(n)!.native?.[ph.key])) continue;
    rows.push([ph.side, ph.key.startsWith('release') ? `after the ack: ${ph.what}` : ph.what, ...names.map((n) => {
      const b = results.get(n)!;
      const nat = b.native?.[ph.key];
      const all = b.phases[ph.key]?.median;
      if (!nat || all === undefined) return '-';
      return `${fmt(nat.median)} in ${nat.calls} / ${fmt(Math.max(0, all - nat.median))} JS`;
    })]);
  }
  if (rows.length === 0) return;
  const head = ['side', 'phase: us inside native calls (CUDA driver, system calls) in N calls / the rest', ...names];
  const widths = head.map((h, i) => Math.max(h.length, ...rows.map((r) => r[i]!.length)));
  const line = (c: string[]) => '| ' + c.map((v, i) => (i >= 2 ? v.padStart(widths[i]!) : v.padEnd(widths[i]!))).join(' | ') + ' |';
  console.log('\nOf each phase, the part inside calls into the addon (medians; each call also pays the tracing\'s two clock reads)');
  console.log(line(head));
  console.log('|' + widths.map((w) => '-'.repeat(w + 2)).join('|') + '|');
  for (const r of rows) console.log(line(r));
}
