// The benchmark's own tools: the per-phase breakdown's arithmetic, and the C reference building
// and running where a C compiler exists (its GPU modes need cuda.h and a GPU: the GPU machine).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Probe } from '../../src/link/transport/probe.js';
import { analyze, Mark, PHASES } from '../../bench/breakdown.js';
import { buildCReference, findCompiler, runCReference } from '../../bench/c-reference.js';
import { combineRuns, roundOrder, RoundSchedule, RunsByName, spreadOf, spreadText, verdict, widest, SPREAD_LIMIT } from '../../bench/stats.js';
import { allowedCpus, childCpu, helperCpus, parseCpuList, withCpusFirst, type PinPlan } from '../../bench/placement.js';
import { channelRows } from '../../bench/channel-tables.js';
import { ROW, type ChannelResults } from '../../bench/channel.js';
import { cRingUnavailable, defaultRingKind } from '../../src/channel/c-ring.js';
import { protocolFloor, protocolOneWayFloor } from '../../bench/channel-floors.js';

/** A log of (point, time) pairs. */
const log = (pairs: Array<[number, number]>) => Float64Array.from(pairs.flat());

test('the breakdown cuts both logs into phases that add up to the handoff', () => {
  const sender: Array<[number, number]> = [];
  const receiver: Array<[number, number]> = [];
  // Three handoffs 1000 us apart; the second one's sender also handles the first one's RELEASE.
  for (let k = 0; k < 3; k++) {
    const t = 1000 * k;
    sender.push([Mark.Start, t], [Mark.Allocated, t + 2], [Probe.SendStart, t + 2.5], [Probe.ExportStart, t + 3], [Probe.ExportEnd, t + 4],
      [Probe.SocketSend, t + 5], [Probe.SocketSent, t + 6]);
    if (k > 0) sender.push([Probe.RecordIn, t + 7], [Probe.ReleaseDone, t + 9]);
    sender.push([Probe.RecordIn, t + 40], [Probe.Delivered, t + 41], [Mark.Acked, t + 42], [Mark.Freed, t + 43 + k]);
    receiver.push([Probe.RecordIn, t + 10], [Probe.ImportStart, t + 11], [Mark.NativeCall, t + 12], [Mark.NativeReturn, t + 13.5],
      [Mark.NativeCall, t + 14], [Mark.NativeReturn, t + 14.5], [Probe.ImportEnd, t + 15], [Probe.Delivered, t + 16],
      [Mark.HandlerIn, t + 17], [Mark.ReadDone, t + 20], [Mark.ClosedDone, t + 25], [Probe.SendStart, t + 26],
      [Probe.SocketSend, t + 27], [Probe.SocketSent, t + 28], [Probe.ReleaseSend, t + 29], [Probe.SocketSend, t + 30], [Probe.SocketSent, t + 31]);
  }
  const b = analyze(log(sender), log(receiver));
  assert.equal(b.handoffs, 3);
  const m = (k: string) => (b.phases as Record<string, { median: number } | undefined>)[k]?.median;
  assert.equal(m('allocate'), 2);
  assert.equal(m('export'), 1);
  assert.equal(m('encode'), 2, 'from allocated to sendmsg, minus the export');
  assert.equal(m('wakeup'), 5, "from the sender's sendmsg() to the receiver's callback");
  assert.equal(m('send'), 1);
  assert.equal(m('import'), 4);
  assert.equal(m('decode'), 2, 'record in to delivered, minus the import');
  assert.equal(m('read'), 3);
  assert.equal(m('free.receiver'), 5);
  assert.equal(m('ack.wakeup'), 13);
  assert.equal(m('ack.decode'), 2);
  assert.equal(m('free.sender'), 2, 'the median of 1, 2 and 3');
  assert.equal(m('release.done'), 2, 'a RELEASE of an earlier handoff, handled in this one');
  assert.equal(m('release.send'), 2);
  assert.deepEqual(b.native.import, { median: 2, calls: 2 }, 'two native calls inside the import, 1.5 + 0.5 us');
  assert.deepEqual(b.native.decode, { median: 0, calls: 0 }, "the import's native calls are not the decode's");
  let sum = 0;
  for (const p of PHASES) if (!('beside' in p)) sum += m(p.key) ?? 0;
  assert.equal(sum, b.total.median, 'the on-path phases add up to the handoff');
});

test('the C reference builds and runs its socket and host modes', { skip: !buildCReference(false).binary && 'no C compiler here' }, () => {
  const build = buildCReference(false);
  assert.ok(build.binary, build.why);
  for (const mode of ['socket', 'host'] as const) {
    const r = runCReference(build, mode, 50, 5, 1 << 20);
    assert.ok(r.summary, r.skipped);
    assert.equal(r.summary.n, 50);
    assert.ok(r.summary.median > 0 && r.summary.p99 >= r.summary.median);
  }
  // Built without cuda.h: the GPU modes say why instead of running.
  if (!build.cuda) assert.match(runCReference(build, 'pool', 5, 0, 1 << 20).skipped ?? '', /cuda\.h|built without/);
});

const cc = findCompiler();
const myCpus = parseCpuList(allowedCpus());
test('bench/reference/line_pingpong.c builds, prints each line\'s round trip between two CPUs pass by pass, and fails (exit 1) on a CPU it cannot pin to', { skip: !cc ? 'no C compiler here' : myCpus.length < 2 && 'fewer than two CPUs here' }, () => {
  const source = fileURLToPath(new URL('../../../bench/reference/line_pingpong.c', import.meta.url));
  const binary = join(tmpdir(), `line_pingpong-${process.pid}`);
  try {
    const built = spawnSync(cc!, ['-O2', '-o', binary, source], { encoding: 'utf8' });
    assert.equal(built.status, 0, built.stderr);
    const [a, b] = myCpus;
    const r = spawnSync(binary, [String(a), String(b), '3', '2'], { encoding: 'utf8', timeout: 60_000 });
    assert.equal(r.status, 0, r.stderr);
    const lines = r.stdout.trim().split('\n');
    assert.match(lines[0]!, new RegExp(`^CPUs ${a} and ${b}, 3 lines`));
    assert.deepEqual(lines.slice(1).map((l) => l.split(':')[0]), ['pass 1', 'pass 2']);
    for (const l of lines.slice(1)) {
      const ns = l.split(':')[1]!.trim().split(' ').map(Number);
      assert.equal(ns.length, 3, l);
      assert.ok(ns.every((n) => Number.isFinite(n) && n > 0), l);
    }
    const bad = spawnSync(binary, [String(a), '99999', '1', '1'], { encoding: 'utf8', timeout: 60_000 });
    assert.equal(bad.status, 1);
    assert.match(bad.stderr, /sched_setaffinity \(child\)/);
  } finally {
    rmSync(binary, { force: true });
  }
});

test('spreadOf: (max - min) / median of the runs, unknown (NaN) for one run or a missing one', () => {
  assert.deepEqual(spreadOf([100, 110, 90]), { medians: [100, 110, 90], spread: 0.2 });
  assert.equal(spreadOf([622e3, 914e3, 1.27e6]).spread.toFixed(2), '0.71', "issue 38's one-way row: 70%");
  assert.equal(spreadOf([5, 5]).spread, 0);
  assert.ok(Number.isNaN(spreadOf([5]).spread));
  assert.ok(Number.isNaN(spreadOf([]).spread));
  assert.ok(Number.isNaN(spreadOf([5, NaN, 6]).spread), 'a run without a figure: unknown, not the others alone');
  assert.ok(Number.isNaN(spreadOf([0, 0]).spread), 'a zero median divides nothing');
});

test('combineRuns: the median of the runs\' medians and p99s, every sample counted, the spread of the medians', () => {
  const run = (median: number, p99: number) => ({ n: 2000, median, p99, mean: median });
  const c = combineRuns([run(56, 158), run(80, 407), run(60, 170)]);
  assert.deepEqual({ ...c.summary, mean: Math.round(c.summary.mean) }, { n: 6000, median: 60, p99: 170, mean: 65 });
  assert.deepEqual(c.spread.medians, [56, 80, 60]);
  assert.equal(c.spread.spread, (80 - 56) / 60);
  assert.ok(Number.isNaN(combineRuns([run(56, 158)]).spread.spread), 'one run: spread unknown (UNDECIDED)');
});

test('RunsByName: each measurement by name over the runs, the last run\'s with the summaries combined; one a run skipped stays skipped', () => {
  const run = (median: number) => ({ n: 100, median, p99: 2 * median, mean: median });
  const r = new RunsByName<{ name: string; summary?: { n: number; median: number; p99: number; mean: number }; skipped?: string; round?: number }>();
  for (const [round, m] of [[1, 10], [2, 12], [3, 11]] as const) {
    r.add({ name: 'row', summary: run(m), round });
    r.add(round === 2 ? { name: 'ref', skipped: 'no compiler', round } : { name: 'ref', summary: run(5), round });
  }
  const [row, ref] = r.combined();
  assert.deepEqual(row!.m, { name: 'row', summary: { n: 300, median: 11, p99: 22, mean: 11 }, round: 3 }, 'the last run\'s fields, the runs\' summary');
  assert.deepEqual(row!.spread!.medians, [10, 12, 11]);
  assert.deepEqual(ref, { m: { name: 'ref', skipped: 'no compiler', round: 2 } }, 'skipped in one run: skipped, no spread');
  assert.deepEqual(r.runs('row').map((x) => x.median), [10, 12, 11]);
  assert.deepEqual(r.runs('none'), []);
  assert.deepEqual(r.spread('row'), row!.spread, 'the spread by name is the combined one');
  assert.equal(r.spread('ref'), undefined, 'a measurement a run skipped has no spread');
  assert.equal(r.spread('none'), undefined);
  assert.deepEqual(r.spreads('reference: '), [['reference: row', row!.spread]], 'every measured name, prefixed; the skipped one left out');
});

test('verdict: MET / MISSED only where the spread is at most the limit, else UNDECIDED', () => {
  assert.equal(SPREAD_LIMIT, 0.15);
  assert.equal(verdict(true, 0.1), 'MET');
  assert.equal(verdict(false, 0.1), 'MISSED');
  assert.equal(verdict(true, 0.15), 'MET', 'the limit itself decides');
  assert.equal(verdict(true, 0.151), 'UNDECIDED');
  assert.equal(verdict(false, 0.7), 'UNDECIDED');
  assert.equal(verdict(true, NaN), 'UNDECIDED', 'one run: unknown spread');
  assert.equal(verdict(false, 0.3, 0.5), 'MISSED', 'a wider limit when asked');
  assert.equal(widest({ medians: [1, 1], spread: 0.05 }, { medians: [1, 2], spread: 0.2 }), 0.2);
  assert.ok(Number.isNaN(widest({ medians: [1, 1], spread: 0.05 }, undefined)), 'a target on a row that did not run');
  assert.ok(Number.isNaN(widest({ medians: [1], spread: NaN })));
  assert.equal(spreadText(0.12), 'spread 12%');
  assert.equal(spreadText(0.31), 'spread 31% > 15%');
  assert.equal(spreadText(NaN), 'spread unknown (one run)');
});

test('RoundSchedule: untimed until the warm-up count and time passed, then timed until both the count and the time passed (the clock read every 64 rounds)', async () => {
  const by = (schedule: RoundSchedule) => {
    const seen: string[] = [];
    for (let when = schedule.next(); when !== 'done'; when = schedule.next()) seen.push(when);
    return { warm: seen.filter((w) => w === 'warm').length, first: seen.indexOf('first'), timed: seen.filter((w) => w !== 'warm').length, total: seen.length };
  };
  // No time bound: the counts, each rounded up to the next 64th round.
  assert.deepEqual(by(new RoundSchedule(100, 1000, 0, 0)), { warm: 128, first: 128, timed: 1024, total: 1152 });
  // A time bound longer than the count takes: the rounds go on until it passed.
  const t0 = performance.now();
  const slow = by(new RoundSchedule(0, 1, 30, 30));
  assert.ok(performance.now() - t0 >= 60, 'both times waited out');
  assert.ok(slow.warm > 64 && slow.timed > 64, `rounds while the clock ran: ${JSON.stringify(slow)}`);
});

test('roundOrder: every row once per round, rounds start further on, no row twice in a row across rounds', () => {
  for (const rows of [1, 2, 3, 5, 8, 31]) {
    for (const rounds of [1, 2, 3, 5]) {
      let last = -1;
      for (let round = -1; round < rounds; round++) {
        const order = roundOrder(rows, round, rounds);
        assert.deepEqual(order.slice().sort((a, b) => a - b), Array.from({ length: rows }, (_, i) => i), `rows ${rows} round ${round}`);
        if (rows > 1) assert.notEqual(order[0], last, `rows ${rows}, rounds ${rounds}: round ${round} opens with the row that closed the one before`);
        last = order[rows - 1]!;
      }
    }
  }
  assert.deepEqual(roundOrder(6, -1, 3), [0, 1, 2, 3, 4, 5], 'warm-up rounds in plain order');
  assert.deepEqual(roundOrder(6, 0, 3), [0, 1, 2, 3, 4, 5]);
  assert.deepEqual(roundOrder(6, 1, 3), [2, 3, 4, 5, 0, 1]);
  assert.deepEqual(roundOrder(6, 2, 3), [4, 5, 0, 1, 2, 3]);
  assert.deepEqual(roundOrder(0, 1, 3), []);
});

test('helperCpus: the node less the pinned cores and their hyperthreads, narrowing only as far as it must', () => {
  // 4 cores with 2 threads each: CPU c and c + 4 are siblings.
  const cpus = [0, 1, 2, 3, 4, 5, 6, 7];
  const sib = (c: number) => [c % 4, (c % 4) + 4];
  assert.deepEqual(helperCpus(cpus, [0, 1, 2, 3, 4, 5, 6, 7], 2, sib), [2, 3, 6, 7]);
  assert.deepEqual(helperCpus(cpus, [0, 1, 2, 3, 4, 5, 6, 7], 3, sib), [3, 7]);
  assert.deepEqual(helperCpus(cpus, [0, 1, 2, 3, 4, 5, 6, 7], 4, sib), [4, 5, 6, 7], 'no free core left: the siblings, not the pinned CPUs');
  assert.deepEqual(helperCpus([0, 1], [0, 1], 2, (c) => [c]), [0, 1], 'nothing left: every CPU');
  const plan: PinPlan = { node: 0, why: 'test', cores: [0, 1, 2, 3, 4, 5, 6, 7], cpuList: '0-7', helperList: '6,7', reserved: 3 };
  assert.deepEqual([0, 1, 2, 3].map((n) => childCpu(plan, n)), [1, 2, 1, 2], 'children on the reserved cores after the bench process');
  assert.equal(childCpu({ ...plan, reserved: 1 }, 9), 3, 'reserved too few: every core after the first');
});

test('withCpusFirst (--cpus): the named CPUs first, in order, the helpers around them; a CPU outside the node, one named twice or fewer than two refused', () => {
  const plan: PinPlan = { node: 0, why: 'node 0', cores: [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15], cpuList: '0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15', helperList: '10-15', reserved: 9 };
  const alone = (c: number) => [c];  // a guest that shows no hyperthreads (the H200 VM)
  const near = withCpusFirst(plan, [5, 13], alone);
  assert.deepEqual(near.cores.slice(0, 3), [5, 13, 0], "the bench on 5, a row's child on 13, then the rest in their order");
  assert.deepEqual([near.cores[0], childCpu(near, 0)], [5, 13]);
  assert.equal(near.cores.length, 16);
  assert.equal(near.reserved, 9);
  assert.deepEqual(near.helperList.split(',').map(Number), [8, 9, 10, 11, 12, 14, 15], 'helpers: the CPUs the nine reserved main threads (5, 13, 0-4, 6, 7) leave');
  assert.match(near.why, /--cpus 5,13 first/);
  assert.throws(() => withCpusFirst(plan, [5, 16], alone), /CPU 16 is not one of NUMA node 0's CPUs/);
  assert.throws(() => withCpusFirst(plan, [5, 5], alone), /CPU 5 is named twice/);
  assert.throws(() => withCpusFirst(plan, [5], alone), /at least two CPUs/);
});

test('channelRows: a target on a row whose runs spread over 15% is UNDECIDED, in the notes and the verdicts', () => {
  const us = (median: number) => ({ n: 100, median, p99: median * 2, mean: median });
  // Host slots' default ring (the C ring where the addon has it) and the other one, measured beside it.
  const DEF = defaultRingKind();
  const OTHER = DEF === 'c' ? 'js' : 'c';
  const name = { c: 'the C ring', js: 'the JavaScript ring' };
  const res: ChannelResults = {
    runs: 3, warmupRuns: 1, pinned: 'test', leftovers: [],
    floor: { socket: { us: us(14), runs: spreadOf([14, 14.5, 14.2]) } },
    roundTrip: {
      [ROW.roundTrip('adaptive', 'host')]: { memory: 'host', wait: 'adaptive', ring: DEF, us: us(10), cpuUsPerMsg: 1, placement: 'CPUs 0 and 1', runs: spreadOf([10, 10.5, 9.8]) },
      [ROW.roundTrip('adaptive', 'host', OTHER)]: { memory: 'host', wait: 'adaptive', ring: OTHER, us: us(5), cpuUsPerMsg: 1, placement: 'CPUs 0 and 1', runs: spreadOf([5, 5.2, 4.9]) },
      [ROW.roundTrip('spin', 'host')]: { memory: 'host', wait: 'spin', ring: DEF, us: us(4), cpuUsPerMsg: 1, placement: 'CPUs 0 and 1', runs: spreadOf([2.5, 4, 5]) },
    },
    oneWay: {
      [ROW.oneWay(4096, 'adaptive', 'host')]: {
        memory: 'host', wait: 'adaptive', ring: DEF, slotBytes: 4096, msgsPerSec: us(964e3), slowest1pct: 5e5, bytesWrittenPerMsg: 1, cpuUsPerMsg: 1,
        placement: 'CPUs 0 and 1', runs: spreadOf([622e3, 914e3, 1.27e6]), sleepsPer1k: [120, 3.25, 0], floorsUs: [0.85, 0.912, 0.3],
      },
      [ROW.oneWay(65536, 'adaptive', 'host')]: {
        memory: 'host', wait: 'adaptive', ring: DEF, slotBytes: 65536, msgsPerSec: us(9e5), slowest1pct: 5e5, bytesWrittenPerMsg: 1, cpuUsPerMsg: 1,
        placement: 'CPUs 0 and 1', runs: spreadOf([9e5, 9.1e5, 8.9e5]),
      },
    },
    workSharing: {},
  };
  res.oneWay[ROW.oneWay(4096, 'adaptive', 'host', OTHER)] = { ...res.oneWay[ROW.oneWay(4096, 'adaptive', 'host')]!, ring: OTHER, msgsPerSec: us(1.5e6), runs: spreadOf([1.5e6, 1.45e6, 1.55e6]) };
  const t = channelRows(res);
  const by = (row: string, target: RegExp) => t.targets.find((x) => x.row === row && target.test(x.target));
  assert.equal(by(ROW.roundTrip('adaptive', 'host'), /^target/)?.verdict, 'MET');
  assert.equal(by(ROW.roundTrip('adaptive', 'host'), /socket/)?.verdict, 'MET', 'both rows agree');
  assert.equal(by(ROW.roundTrip('spin', 'host'), /^target/)?.verdict, 'UNDECIDED', 'runs 2.5 / 4 / 5 us: 62%');
  assert.equal(by(ROW.oneWay(4096, 'adaptive', 'host'), /target/)?.verdict, 'UNDECIDED');
  assert.equal(by(ROW.oneWay(65536, 'adaptive', 'host'), /target/)?.verdict, 'MISSED');
  assert.equal(by(ROW.roundTrip('adaptive', 'host', OTHER), /^target/)?.verdict, 'MET', "the other ring's rows have the same targets");
  assert.equal(by(ROW.oneWay(4096, 'adaptive', 'host', OTHER), /target/)?.verdict, 'MET');
  assert.match(ROW.roundTrip('adaptive', 'host', OTHER), OTHER === 'js' ? /, JavaScript ring\)$/ : /, C ring\)$/, "the other ring's row says which it ran");
  assert.match(ROW.roundTrip('adaptive', 'host'), /\(host slots\)$/, "the default's row says nothing");
  assert.equal(t.targets.length, 8);
  const otherRtt = t.latency.find((r) => r.name === ROW.roundTrip('adaptive', 'host', OTHER))!.notes!.join('; ');
  assert.ok(otherRtt.includes(`0.50x ${name[DEF]}'s time (the default): ${name[OTHER]} is faster`), `both rows agree: decided (${otherRtt})`);
  const otherOneWay = t.throughput.find((r) => r.name === ROW.oneWay(4096, 'adaptive', 'host', OTHER))!.notes!.join('; ');
  assert.ok(otherOneWay.includes(`1.56x ${name[DEF]}'s rate (the default): UNDECIDED (spread 71% > 15%)`), `the default row's runs disagree: undecided (${otherOneWay})`);
  assert.doesNotMatch(t.latency.find((r) => r.name === ROW.roundTrip('adaptive', 'host'))!.notes!.join('; '), /the default\)/, "the default's row compares with nothing");
  const note = t.throughput.find((r) => r.name === ROW.oneWay(4096, 'adaptive', 'host'))!.notes!.join('; ');
  assert.match(note, /UNDECIDED \(spread 71% > 15%\)/);
  assert.match(note, /runs 622 k \/ 914 k \/ 1\.27 M, spread 71% > 15%/);
  assert.doesNotMatch(note, /\bMET\b|MISSED/);
  assert.match(note, /doorbell sleeps per 1k msgs by run 120 \/ 3\.3 \/ 0\.0/, 'each run with its sleeps');
  assert.match(note, /core-to-core round trip before each run 0\.85 \/ 0\.91 \/ 0\.30 us/, 'each run with the floor probed before it');
  assert.doesNotMatch(t.throughput.find((r) => r.name === ROW.oneWay(65536, 'adaptive', 'host'))!.notes!.join('; '), /core-to-core/, 'no probe, no note');
});

test('the protocol floors move every message through the C ring called directly in two processes: each value echoed, each message taken', { skip: cRingUnavailable() }, async () => {
  // protocolFloor throws when a message comes back with another value (or none within 20 s).
  const f = await protocolFloor(3000, 300, process.env);
  assert.ok(f.us.length >= 3000, `at least the rounds asked for timed (the schedule runs for its time too): ${f.us.length}`);
  assert.ok(f.us.every((us) => us > 0), 'each round trip timed');
  assert.match(f.placement, /^CPUs (\d+|unknown)/);
  // One way: protocolOneWayFloor throws unless the consumer took every message, each byte summed.
  const w = await protocolOneWayFloor(100, process.env);
  assert.ok(w.rates.length >= 5 && w.rates.every((r) => r > 0), `rates of 2,000-message batches: ${w.rates.length}`);
});

test("channelRows: the protocol floors get their rows, and the C ring's spin round trip and 4 KiB one way say what the API adds to them", () => {
  const us = (median: number) => ({ n: 100, median, p99: median * 2, mean: median });
  const res: ChannelResults = {
    runs: 3, warmupRuns: 1, pinned: 'test', leftovers: [],
    floor: { spin: { us: us(0.5), placement: 'CPUs 0 and 1', runs: spreadOf([0.5, 0.5, 0.5]) }, protocol: { us: us(2), placement: 'CPUs 0 and 1', runs: spreadOf([2, 2, 2]) } },
    roundTrip: { [ROW.roundTrip('spin', 'host', 'c')]: { memory: 'host', wait: 'spin', ring: 'c', us: us(5), cpuUsPerMsg: 1, placement: 'CPUs 0 and 1', runs: spreadOf([5, 5, 5]) } },
    oneWay: {
      [ROW.oneWay(4096, 'adaptive', 'host', 'c')]: {
        memory: 'host', wait: 'adaptive', ring: 'c', slotBytes: 4096, msgsPerSec: us(1e6), slowest1pct: 5e5, bytesWrittenPerMsg: 1, cpuUsPerMsg: 1, placement: 'CPUs 0 and 1', runs: spreadOf([1e6, 1e6, 1e6]),
      },
    },
    workSharing: {},
  };
  res.floor.protocolOneWay = { msgsPerSec: us(4e6), slowest1pct: 3e6, placement: 'CPUs 0 and 1', runs: spreadOf([4e6, 4e6, 4e6]) };
  const t = channelRows(res);
  assert.match(t.latency.find((r) => r.name === ROW.protocol)!.notes!.join('; '), /^4\.0x the spin floor; CPUs 0 and 1/);
  assert.match(t.latency.find((r) => r.name === ROW.roundTrip('spin', 'host', 'c'))!.notes!.join('; '), /2\.50x the protocol floor \(the channel API adds 3\.0 us a round trip\)/);
  assert.equal(t.throughput.find((r) => r.name === ROW.protocolOneWay)?.median, 4e6);
  assert.match(t.throughput.find((r) => r.name === ROW.oneWay(4096, 'adaptive', 'host', 'c'))!.notes!.join('; '), /0\.25x the protocol floor's rate \(the channel API adds 0\.75 us a message\)/);
});

test('a bench script given a number option out of range says which and what it got, and exits 2 before measuring anything', () => {
  for (const [name, args, said] of [
    ['main', ['--runs', '0'], /^bench: --runs must be an integer of at least 1; got "0"$/m],
    ['main', ['--warmup=-1'], /^bench: --warmup must be an integer of at least 0; got "-1"$/m],
    ['python-ratios', ['--warmup-runs', 'x'], /^python-ratios: --warmup-runs must be an integer of at least 0; got "x"$/m],
    ['peer', ['--reps', '2.5'], /^bench\/peer: --reps must be an integer of at least 1; got "2.5"$/m],
    ['weights', ['--gib', '0'], /^bench:weights: --gib must be a number above 0; got "0"$/m],
    ['weights-remote', ['--net-gib=-2'], /^bench:weights --remote: --net-gib must be a number above 0; got "-2"$/m],
  ] as const) {
    const script = fileURLToPath(new URL(`../../bench/${name}.js`, import.meta.url));
    const r = spawnSync(process.execPath, [script, ...args], { encoding: 'utf8', timeout: 60_000 });
    assert.equal(r.status, 2, `${name} ${args.join(' ')}: ${r.stdout}${r.stderr}`);
    assert.match(r.stderr, said, `${name} ${args.join(' ')}`);
  }
});

test('every bench script answers --help with its usage (exit 0) and an unknown option with what was wrong and the usage (exit 2)', () => {
  const scripts = ['main', 'python-ratios', 'weights', 'weights-remote', 'peer', 'sharded-plan', 'flood'];
  for (const name of scripts) {
    const script = fileURLToPath(new URL(`../../bench/${name}.js`, import.meta.url));
    const help = spawnSync(process.execPath, [script, '--help'], { encoding: 'utf8', timeout: 60_000 });
    assert.equal(help.status, 0, `${name} --help: ${help.stderr}`);
    assert.match(help.stdout, /^usage: /, `${name} --help prints its usage`);
    const bad = spawnSync(process.execPath, [script, '--no-such-option'], { encoding: 'utf8', timeout: 60_000 });
    assert.equal(bad.status, 2, `${name} --no-such-option: ${bad.stdout}${bad.stderr}`);
    assert.match(bad.stderr, /Unknown option '--no-such-option'[^]*usage: /, `${name} says what was wrong, then the usage`);
  }
  // --remote hands bench:weights over to the remote bench, whose options --help lists.
  const remote = spawnSync(process.execPath, [fileURLToPath(new URL('../../bench/weights.js', import.meta.url)), '--remote', '--help'], { encoding: 'utf8', timeout: 60_000 });
  assert.equal(remote.status, 0, remote.stderr);
  assert.match(remote.stdout, /bench:weights:remote/);
});
