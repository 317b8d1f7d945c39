// The GPU-free halves of what makes a fresh pool buffer's send cheap: the prepared-export slots
// (src/ipc/prepared-exports.ts) driven by a stand-in for the addon's export thread (a worker thread
// running the native side's state machine over a SharedArrayBuffer), and a pool's stash of
// released blocks (src/ipc/block-stash.ts). The real thread and pools run in test/gpu/pool.test.ts.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { Worker } from 'node:worker_threads';
import { PreparedExports, SLOT_BYTES, SlotState } from '../../src/ipc/prepared-exports.js';
import { BlockStash } from '../../src/ipc/block-stash.js';
import { waitUntil, within } from '../helpers/wait.js';

// The stand-in export thread: what native/pool_exports.cc's RunExportWorker does, with the driver call
// replaced, where \`gated\`, by waiting (running) until the test opens gate[0] and export data derived
// from the pointer (pointer 0 fails). gate[1] counts finished exports, stored before Ready. A
// { ping } message is echoed: every post before it was handled by then (messages come in order).
const FAKE_WORKER = `
const { parentPort, workerData } = require('node:worker_threads');
const { table, gate: gateBuffer, gated } = workerData;
const state = new Int32Array(table);
const words = new BigUint64Array(table);
const bytes = new Uint8Array(table);
const gate = new Int32Array(gateBuffer);
parentPort.on('message', (slot) => {
  if (typeof slot === 'object') { parentPort.postMessage(slot); return; }
  const at = slot * ${SLOT_BYTES / 4};
  if (Atomics.compareExchange(state, at, 1, 2) !== 1) return;
  const pointer = words[slot * ${SLOT_BYTES / 8} + 1];
  if (gated) Atomics.wait(gate, 0, 0, 60000);
  if (pointer === 0n) { Atomics.store(state, at, 4); return; }
  for (let i = 0; i < 64; i++) bytes[slot * ${SLOT_BYTES} + 64 + i] = Number((pointer >> BigInt((i % 8) * 8)) & 0xffn) ^ i;
  Atomics.add(gate, 1, 1);
  Atomics.store(state, at, 3);
});
`;

function expectedData(pointer: bigint): Uint8Array {
  const out = new Uint8Array(64);
  for (let i = 0; i < 64; i++) out[i] = Number((pointer >> BigInt((i % 8) * 8)) & 0xffn) ^ i;
  return out;
}

interface FakeWorker {
  exports: PreparedExports;
  state: Int32Array;
  /** [0]: opened (1) lets a gated export finish; [1]: exports finished. */
  gate: Int32Array;
  /** Resolves once the thread handled every post made before it. */
  ping: () => Promise<void>;
  stop: () => Promise<number>;
}

function fakeWorker(slots: number, gated = false): FakeWorker {
  const table = new SharedArrayBuffer(slots * SLOT_BYTES);
  const gate = new Int32Array(new SharedArrayBuffer(8));
  const worker = new Worker(FAKE_WORKER, { eval: true, workerData: { table, gate: gate.buffer, gated } });
  let pings = 0;
  const ping = async (): Promise<void> => {
    const n = ++pings;
    const echoed = new Promise<void>((resolve) => {
      const on = (m: unknown) => {
        if ((m as { ping?: number })?.ping === n) {
          worker.off('message', on);
          resolve();
        }
      };
      worker.on('message', on);
    });
    worker.postMessage({ ping: n });
    await within(echoed, 'the stand-in export thread to answer a ping');
  };
  let started = 0;
  const exports = new PreparedExports({
    start: (t) => {
      assert.equal(t, table as unknown as ArrayBuffer);
      started++;
    },
    post: (slot) => worker.postMessage(slot),
  }, slots, table as unknown as ArrayBuffer);
  return { exports, state: new Int32Array(table), gate, ping, stop: async () => { await worker.terminate(); return started; } };
}

const until = (check: () => boolean): Promise<void> => waitUntil(check, 'the stand-in export thread to reach the state');

test('a prepared export is made off this thread and taken once ready; the slot is free again', async () => {
  const { exports, state, stop } = fakeWorker(4);
  try {
    const slot = exports.prepare(0x7f00_1234_5000n, 0x55n);
    assert.equal(exports.available, 3);
    await until(() => Atomics.load(state, slot * (SLOT_BYTES / 4)) === SlotState.Ready);
    const out = new Uint8Array(64);
    assert.equal(exports.take(slot, out), true);
    assert.deepEqual(out, expectedData(0x7f00_1234_5000n));
    assert.equal(exports.available, 4);
    assert.throws(() => exports.take(slot, out), /taken twice/);
  } finally {
    assert.equal(await stop(), 1, 'the thread is started once');
  }
});

test('a request not started yet is taken back (the caller exports inline) and the thread then leaves it alone', async () => {
  const { exports, state, ping, stop } = fakeWorker(1);
  try {
    const slot = exports.prepare(0x1000n, 1n);
    assert.equal(exports.take(slot, new Uint8Array(64)), false);
    await ping();  // the thread handled the late post by now
    assert.equal(Atomics.load(state, 0), SlotState.Free, 'the late post found the slot free and skipped it');
    assert.equal(exports.prepare(0x2000n, 1n), slot, 'the slot is reused');
    assert.equal(exports.prepare(0x3000n, 1n), -1, 'no slot left: no preparation');
  } finally {
    await stop();
  }
});

test('a request the thread is running is waited out: memory is never released under a running export', async () => {
  const { exports, state, gate, stop } = fakeWorker(2, true);
  try {
    const slot = exports.prepare(0xabcd00n, 1n);
    await until(() => Atomics.load(state, slot * (SLOT_BYTES / 4)) === SlotState.Running);
    assert.equal(Atomics.load(gate, 1), 0, 'the export is still running (held at the gate)');
    // The gate opens as take() starts: the export finishes while take() waits it out. What the
    // release of the memory does (it keeps no data), and what a send does (it does).
    Atomics.store(gate, 0, 1);
    Atomics.notify(gate, 0);
    assert.equal(exports.take(slot, undefined), true);
    assert.equal(Atomics.load(gate, 1), 1, 'take() returned only once the export finished');
    assert.equal(Atomics.load(state, slot * (SLOT_BYTES / 4)), SlotState.Free);
    const failing = exports.prepare(0n, 1n);
    await until(() => Atomics.load(state, failing * (SLOT_BYTES / 4)) === SlotState.Failed);
    assert.equal(exports.take(failing, new Uint8Array(64)), false, 'a failed export: the caller exports inline (and sees the error)');
  } finally {
    await stop();
  }
});

test('under churn every take gets its own allocation\'s data or none, never a freed one\'s', async () => {
  const { exports, stop } = fakeWorker(8);
  try {
    let pointer = 0x10_0000n;
    const live: Array<{ slot: number; pointer: bigint }> = [];
    let ready = 0;
    for (let round = 0; round < 3000; round++) {
      if (live.length < 8 && (round % 3 !== 2 || live.length === 0)) {
        pointer += 0x1000n;
        const slot = exports.prepare(pointer, 1n);
        assert.ok(slot >= 0);
        live.push({ slot, pointer });
      } else {
        const { slot, pointer: p } = live.splice(round % live.length, 1)[0]!;
        const out = new Uint8Array(64);
        if (exports.take(slot, out)) {
          ready++;
          assert.deepEqual(out, expectedData(p));
        }
      }
      if (round % 10 === 0) await new Promise((r) => setTimeout(r, 1));
    }
    for (const { slot, pointer: p } of live) {
      const out = new Uint8Array(64);
      if (exports.take(slot, out)) assert.deepEqual(out, expectedData(p));
    }
    assert.equal(exports.available, 8);
    assert.ok(ready > 0, 'some requests were ready when taken');
  } finally {
    await stop();
  }
});

test('a pool\'s block stash: by size, newest first, bounded by count and bytes, oldest out first', () => {
  const block = (byteLength: number, id: number) => ({ byteLength, id });
  const s = new BlockStash<ReturnType<typeof block>>(3, 1000);
  assert.deepEqual(s.put(block(100, 1)), []);
  assert.deepEqual(s.put(block(100, 2)), []);
  assert.deepEqual(s.put(block(200, 3)), []);
  assert.deepEqual(s.put(block(2000, 4)).map((b) => b.id), [4], 'larger than the byte bound: never kept');
  assert.deepEqual(s.put(block(300, 5)).map((b) => b.id), [1], 'a fourth block pushes the oldest out');
  assert.deepEqual(s.put(block(600, 6)).map((b) => b.id), [2, 3], 'over 1000 bytes: the oldest go until it fits');
  assert.deepEqual({ count: s.count, bytes: s.bytes }, { count: 2, bytes: 900 });
  assert.equal(s.take(100), undefined);
  assert.equal(s.take(600)?.id, 6);
  assert.deepEqual(s.drain().map((b) => b.id), [5]);
  assert.deepEqual({ count: s.count, bytes: s.bytes }, { count: 0, bytes: 0 });
  const same = new BlockStash<ReturnType<typeof block>>(8, 1 << 20);
  for (let i = 0; i < 4; i++) same.put(block(64, i));
  assert.deepEqual([same.take(64)!.id, same.take(64)!.id], [3, 2], 'the most recently released first');
  const off = new BlockStash<ReturnType<typeof block>>(0, 1 << 20);
  assert.deepEqual(off.put(block(64, 9)).map((b) => b.id), [9], 'recycleBlocks 0: nothing is kept');
});
