// The benchmark's own tools: the per-phase breakdown's arithmetic, and the C reference building
// and running where a C compiler exists (its GPU modes need cuda.h and a GPU: the GPU machine).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { Probe } from '../../src/link/transport/probe.js';
import { analyze, Mark, PHASES } from '../../bench/breakdown.js';
import { buildCReference, runCReference } from '../../bench/c-reference.js';

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
