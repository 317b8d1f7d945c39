// NcclCommunicator over a fake libnccl (test/fixtures/fake-nccl.c): what reaches NCCL (the config
// and the unique id by value, pointers, counts, peers, groups), non-blocking init and enqueues
// polled through ncclInProgress, typed errors, timeouts and signals, and the ends: close
// (finalize + destroy), abort (on a thread of its own, idempotent), dispose, and the backstops.
import { describe, test, after, beforeEach } from 'node:test';
import assert from 'node:assert/strict';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import { Worker } from 'node:worker_threads';
import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { fake, fakeNccl, noFakeNccl, resetFakeEnv } from '../helpers/fake-nccl.js';
import {
  loadNccl, ncclUniqueId, asNcclUniqueId, NcclCommunicator, NcclError, NcclLibrary, type NcclUniqueId,
} from '../../src/nccl/index.js';
import { standInDevice, openCommunicators } from '../helpers/nccl-testing.js';
import { IpcError } from '../../src/errors.js';

setFlagsFromString('--expose-gc');
const gc = runInNewContext('gc') as () => void;
const hex = (b: Uint8Array): string => Buffer.from(b).toString('hex');
const device = standInDevice(0);

describe('NcclCommunicator (fake libnccl)', { skip: noFakeNccl }, () => {
  const f = fakeNccl!;
  let library: NcclLibrary;
  let id: NcclUniqueId;
  after(() => f.cleanup());
  beforeEach(async () => {
    resetFakeEnv();
    library ??= await loadNccl({ path: f.lib });
    id = library.uniqueId();
  });

  const init = (extra: Partial<Parameters<typeof NcclCommunicator.init>[0]> = {}) =>
    NcclCommunicator.init({ uniqueId: id, nranks: 2, rank: 1, device, library, ...extra });
  /** The log lines that start with `word`. */
  const calls = (word: string) => f.lines().filter((l) => l.startsWith(word));

  test('init hands NCCL our versioned config (non-blocking) and the 128-byte id by value', async () => {
    fake({ CUDA_DEVICE: 3 });
    const comm = await init();
    try {
      const [line] = calls('init ');
      assert.ok(line, f.lines().join('\n'));
      assert.match(line, /^init nranks=2 rank=1 size=40 magic=cafebeef version=21700 blocking=0 cga=-2147483648 minCTAs=-2147483648 maxCTAs=-2147483648 netName=\(null\) /);
      assert.equal(line.split(' id=')[1], hex(id), 'every byte of the id arrived');
      assert.deepEqual([comm.rank, comm.nranks, comm.cudaDevice], [1, 2, 3]);
      assert.equal(comm.library, library);
      assert.equal(comm.asyncError(), 'ncclSuccess');
      assert.equal(openCommunicators(), 1);
    } finally {
      await comm.close();
    }
    assert.equal(openCommunicators(), 0);
  });

  test('a pending init is polled until NCCL says it is done', async () => {
    fake({ INIT_POLLS: 5 });
    const comm = await init();
    const states = calls('asyncError').map((l) => l.split('state=')[1]);
    assert.deepEqual(states.slice(0, 6), ['7', '7', '7', '7', '7', '0']);
    await comm.close();
  });

  test('unique ids: 128 bytes from the library; received bytes become one with asNcclUniqueId', async () => {
    const made = await ncclUniqueId({ path: f.lib });
    assert.equal(made.byteLength, 128);
    assert.equal(made[0], 3, 'the fake\'s pattern');
    assert.equal(asNcclUniqueId(new Uint8Array(made)).byteLength, 128);
    assert.throws(() => asNcclUniqueId(new Uint8Array(64)), { code: 'ERR_INVALID_ARG_VALUE' });
    fake({ UNIQUE_ID_RESULT: 2 });
    assert.throws(() => library.uniqueId(), (e: unknown) => {
      assert.ok(e instanceof NcclError && e instanceof IpcError);
      assert.equal(e.code, 'ERR_NCCL');
      assert.equal(e.result, 'ncclSystemError');
      assert.equal(e.call, 'ncclGetUniqueId');
      assert.equal(e.description, 'fake: unhandled system error');
      assert.equal(e.lastError, 'fake: ncclGetUniqueId failed');
      assert.match(e.message, /^ncclGetUniqueId failed: ncclSystemError \(2\): fake: unhandled system error; NCCL says: fake: ncclGetUniqueId failed\. a peer exited/);
      return true;
    });
  });

  test('init that NCCL refuses at once rejects with the typed error, leaving nothing open', async () => {
    fake({ INIT_RESULT: 4 });
    await assert.rejects(init(), (e: unknown) => {
      assert.ok(e instanceof NcclError);
      assert.deepEqual([e.code, e.result, e.status, e.call], ['ERR_NCCL', 'ncclInvalidArgument', 4, 'ncclCommInitRankConfig']);
      assert.equal(e.lastError, 'fake: ncclCommInitRankConfig failed');
      return true;
    });
    assert.equal(openCommunicators(), 0);
  });

  test('init that fails while pending rejects and aborts what NCCL created', async () => {
    fake({ INIT_POLLS: 2, INIT_ASYNC: 6 });
    await assert.rejects(init(), { code: 'ERR_NCCL', result: 'ncclRemoteError', call: 'ncclCommInitRankConfig' });
    assert.equal(calls('abort').length, 1);
    assert.equal(calls('destroy').length, 0, 'never destroyed: that is collective');
    assert.equal(openCommunicators(), 0);
  });

  test('init that never completes: the timeout rejects with ERR_TIMEOUT once the communicator is aborted', async () => {
    fake({ INIT_HANG: 1 });
    await assert.rejects(init({ timeout: 30 }), (e: unknown) => {
      assert.ok(e instanceof IpcError);
      assert.equal(e.code, 'ERR_TIMEOUT');
      assert.match(e.message, /NcclCommunicator\.init did not finish within 30 ms/);
      return true;
    });
    assert.equal(calls('abort').length, 1);
    assert.ok(calls('asyncError').length >= 1, 'it polled');
    assert.equal(openCommunicators(), 0);
  });

  test('init given up by a signal rejects with AbortError; a signal aborted before creates nothing', async () => {
    fake({ INIT_HANG: 1 });
    const controller = new AbortController();
    const pending = init({ signal: controller.signal });
    setTimeout(() => controller.abort(new Error('enough')), 5);
    await assert.rejects(pending, (e: unknown) => {
      assert.equal((e as Error).name, 'AbortError');
      assert.equal((e as { code?: string }).code, 'ABORT_ERR');
      assert.equal(((e as Error).cause as Error).message, 'enough');
      return true;
    });
    assert.equal(calls('abort').length, 1);
    resetFakeEnv();
    await assert.rejects(init({ signal: AbortSignal.abort() }), { name: 'AbortError' });
    assert.equal(calls('init').length, 0, 'NCCL was not called');
  });

  test('bad arguments are TypeErrors and RangeErrors, at once', async () => {
    await assert.rejects(init({ rank: 2 }), { code: 'ERR_OUT_OF_RANGE', name: 'RangeError' });
    await assert.rejects(init({ nranks: 0 }), { code: 'ERR_OUT_OF_RANGE' });
    await assert.rejects(init({ uniqueId: new Uint8Array(127) as NcclUniqueId }), { code: 'ERR_INVALID_ARG_VALUE' });
    await assert.rejects(init({ device: {} as never }), { code: 'ERR_INVALID_ARG_TYPE' });
    await assert.rejects(init({ library: {} as never }), { code: 'ERR_INVALID_ARG_TYPE' });
    await assert.rejects(init({ timeout: -1 }), { code: 'ERR_OUT_OF_RANGE' });
    assert.equal(calls('init').length, 0);
    const comm = await init();
    try {
      assert.throws(() => comm.send(1n << 64n, 1, 0), { code: 'ERR_OUT_OF_RANGE' });
      assert.throws(() => comm.send('0x10' as never, 1, 0), { code: 'ERR_INVALID_ARG_TYPE' });
      assert.throws(() => comm.send(0x10n, -1, 0), { code: 'ERR_OUT_OF_RANGE' });
      assert.throws(() => comm.send(0x10n, 1.5, 0), { code: 'ERR_INVALID_ARG_TYPE' });
      assert.throws(() => comm.send(0x10n, 1, 2), { code: 'ERR_OUT_OF_RANGE' }, 'peer beyond nranks');
      assert.throws(() => comm.recv({ devicePointer: 0x10n, byteLength: 8 }, 9, 0), { code: 'ERR_OUT_OF_RANGE', message: /9 bytes do not fit in the 8-byte buffer/ });
      assert.throws(() => comm.broadcast(0x10n, 1, 0, { stream: {} as never }), { code: 'ERR_INVALID_ARG_TYPE' });
      assert.throws(() => comm.group([{ op: 'send', buffer: 0x10n, bytes: 1, peer: 0 }, { op: 'gather' } as never]), { code: 'ERR_INVALID_ARG_VALUE', message: /operations\[1\]\.op/ });
      assert.equal(calls('send').length + calls('groupStart').length, 0, 'nothing reached NCCL');
    } finally {
      await comm.close();
    }
  });

  test('send, recv and broadcast pass bytes as uint8 counts, the pointer, the peer and the stream', async () => {
    const comm = await init();
    await comm.send(0x1000n, 64, 0);
    await comm.recv({ devicePointer: 0x2000n, byteLength: 1 << 20 }, 1n << 20n, 0);
    await comm.broadcast(0x3000n, 5n * 2n ** 32n, 1);
    assert.deepEqual(f.lines().filter((l) => /^(send|recv|broadcast) /.test(l)), [
      'send comm=' + commId() + ' ptr=1000 count=64 type=1 peer=0 stream=0 group=0',
      'recv comm=' + commId() + ' ptr=2000 count=1048576 type=1 peer=0 stream=0 group=0',
      'broadcast comm=' + commId() + ' send=3000 recv=3000 count=21474836480 type=1 root=1 stream=0 group=0',
    ]);
    await comm.close();
  });

  /** The fake's number for the communicator of this test (from its init). */
  function commId(): string {
    return /comm=(\d+)/.exec(calls('asyncError')[0] ?? calls('finalize')[0] ?? calls('send')[0] ?? '')?.[1] ?? '?';
  }

  test('an enqueue NCCL answers ncclInProgress is polled until taken, and calls go in order', async () => {
    const comm = await init();
    resetFakeEnv();
    fake({ OP_POLLS: 3 });
    const first = comm.send(0x10n, 1, 0);
    const second = comm.recv(0x20n, 1, 0);  // not awaited: issued once the first was taken
    await Promise.all([first, second]);
    const lines = f.lines();
    const sendAt = lines.findIndex((l) => l.startsWith('send '));
    const recvAt = lines.findIndex((l) => l.startsWith('recv '));
    const firstDone = lines.findIndex((l, i) => i > sendAt && l.endsWith('state=0'));
    assert.deepEqual(lines.slice(sendAt + 1, firstDone + 1).map((l) => l.split('state=')[1]), ['7', '7', '7', '0']);
    assert.ok(recvAt > firstDone, `recv issued after the send was taken:\n${lines.join('\n')}`);
    await comm.close();
  });

  test('group() issues every operation between ncclGroupStart and ncclGroupEnd, then polls', async () => {
    const comm = await init();
    resetFakeEnv();
    fake({ OP_POLLS: 2 });
    await comm.group([
      { op: 'send', buffer: 0x10n, bytes: 8, peer: 0 },
      { op: 'recv', buffer: { devicePointer: 0x20n, byteLength: 8 }, bytes: 8n, peer: 0 },
      { op: 'broadcast', buffer: 0x30n, bytes: 4, root: 0 },
    ]);
    const lines = f.lines();
    assert.deepEqual(lines.map((l) => l.split(' ')[0]), ['groupStart', 'send', 'recv', 'broadcast', 'groupEnd', 'asyncError', 'asyncError', 'asyncError']);
    assert.ok(lines.slice(1, 4).every((l) => l.endsWith('group=1')));
    assert.deepEqual(lines.slice(5).map((l) => l.split('state=')[1]), ['7', '7', '0']);
    await comm.group([]);  // an empty group is NCCL's business, not an error
    await comm.close();
  });

  test('a refused operation is an NcclError naming it; inside a group, the group is still ended', async () => {
    const comm = await init();
    resetFakeEnv();
    fake({ OP_RESULT: 5 });
    await assert.rejects(comm.send(0x10n, 1, 0), { code: 'ERR_NCCL', result: 'ncclInvalidUsage', call: 'ncclSend', lastError: 'fake: ncclSend failed' });
    await assert.rejects(comm.group([{ op: 'recv', buffer: 0x10n, bytes: 1, peer: 0 }]), { result: 'ncclInvalidUsage', call: 'ncclRecv' });
    assert.deepEqual(f.lines().map((l) => l.split(' ')[0]), ['send', 'groupStart', 'recv', 'groupEnd']);
    resetFakeEnv();
    fake({ OP_POLLS: 1, OP_ASYNC: 6 });
    await assert.rejects(comm.broadcast(0x10n, 1, 0), { result: 'ncclRemoteError', call: 'ncclBroadcast' });
    assert.equal(comm.asyncError(), 'ncclRemoteError');
    await comm.close();  // broken: aborted, not finalized
    assert.equal(calls('finalize').length, 0);
    assert.equal(calls('abort').length, 1);
  });

  test('asyncError() names NCCL\'s state; close() aborts a broken communicator instead of finalizing', async () => {
    const comm = await init();
    fake({ ASYNC_ERROR: 6 });
    assert.equal(comm.asyncError(), 'ncclRemoteError');
    await comm.close();
    assert.deepEqual([calls('finalize').length, calls('destroy').length, calls('abort').length], [0, 0, 1]);
    assert.equal(comm.closed, true);
    assert.throws(() => comm.asyncError(), { code: 'ERR_CLOSED' });
  });

  test('close(): finalize polled to completion, then destroy; idempotent; calls after it are ERR_CLOSED', async () => {
    const comm = await init();
    fake({ FINALIZE_POLLS: 3 });
    const closing = comm.close();
    assert.equal(comm.close(), closing);
    assert.throws(() => comm.send(0x10n, 1, 0), { code: 'ERR_CLOSED' });
    await closing;
    const lines = f.lines();
    const tail = lines.slice(lines.findIndex((l) => l.startsWith('finalize')));
    assert.deepEqual(tail.map((l) => l.split(' ')[0] + (l.split('state=')[1] ?? '')),
      ['finalize', 'asyncError7', 'asyncError7', 'asyncError7', 'asyncError0', 'destroy']);
    assert.equal(calls('abort').length, 0);
    assert.equal(openCommunicators(), 0);
    await comm.abort();  // after close: nothing more happens
    assert.equal(calls('abort').length, 0);
  });

  test('close() that cannot finish (a rank never finalizes): the timeout aborts', async () => {
    const comm = await init();
    fake({ FINALIZE_HANG: 1 });
    await assert.rejects(comm.close({ timeout: 30 }), { code: 'ERR_TIMEOUT', message: /NcclCommunicator\.close did not finish within 30 ms/ });
    assert.deepEqual([calls('finalize').length, calls('destroy').length, calls('abort').length], [1, 0, 1]);
    assert.equal(openCommunicators(), 0);
  });

  test('abort() while close() waits for finalize ends it; close() then resolves', async () => {
    const comm = await init();
    fake({ FINALIZE_HANG: 1 });
    const closing = comm.close();
    // close() is waiting: it called finalize and has polled the communicator since.
    await waitFor(() => calls('finalize').length === 1 && f.lines().slice(f.lines().findIndex((l) => l.startsWith('finalize'))).some((l) => l.startsWith('asyncError')));
    await comm.abort();
    await closing;
    assert.deepEqual([calls('finalize').length, calls('destroy').length, calls('abort').length], [1, 0, 1]);
  });

  test('abort(): idempotent, ends a pending enqueue with ERR_CLOSED, and runs off the event loop', async () => {
    const comm = await init();
    fake({ OP_POLLS: 1_000_000 });
    const pending = comm.send(0x10n, 1, 0);
    const gate = join(f.dir, `abort-gate-${process.pid}`);
    fake({ ABORT_WAIT_FILE: gate });
    const a = comm.abort();
    assert.equal(comm.abort(), a);
    assert.equal(openCommunicators(), 0, 'unregistered at once');
    // ncclCommAbort returns only once this file exists: written by JavaScript, so the event loop
    // must be running while the abort runs.
    setImmediate(() => writeFileSync(gate, ''));
    await a;
    await assert.rejects(pending, { code: 'ERR_CLOSED' });
    assert.equal(calls('abort').length, 1);
    assert.equal(comm.closed, true);
    await comm.close();  // after abort: resolves, does nothing
    assert.equal(calls('finalize').length, 0);
  });

  test('an enqueue that is never taken: the timeout rejects and the communicator is aborted', async () => {
    const comm = await init();
    fake({ OP_POLLS: 1_000_000 });
    await assert.rejects(comm.recv(0x10n, 1, 0, { timeout: 20 }), { code: 'ERR_TIMEOUT', message: /ncclRecv did not finish within 20 ms/ });
    assert.equal(comm.closed, true);
    assert.equal(calls('abort').length, 1);
  });

  test('destroy failing is reported: close() rejects with ncclCommDestroy\'s error', async () => {
    const comm = await init();
    fake({ DESTROY_RESULT: 3 });
    await assert.rejects(comm.close(), { code: 'ERR_NCCL', result: 'ncclInternalError', call: 'ncclCommDestroy', lastError: 'fake: ncclCommDestroy failed' });
    assert.equal(openCommunicators(), 0);
  });

  test('`using` aborts; `await using` closes', async () => {
    {
      using comm = await init();
      assert.equal(comm.asyncError(), 'ncclSuccess');
    }
    assert.equal(openCommunicators(), 0);
    await waitFor(() => calls('abort').length === 1);
    resetFakeEnv();
    {
      await using comm = await init();
      assert.equal(comm.closed, false);
    }
    assert.deepEqual([calls('finalize').length, calls('destroy').length, calls('abort').length], [1, 1, 0]);
  });

  test('a communicator garbage-collected while open is aborted (never destroyed), with a warning', async () => {
    const warnings: string[] = [];
    const onWarning = (w: Error): void => {
      if ((w as { code?: string }).code === 'CUDA_IPC_LEAK') warnings.push(w.message);
    };
    process.on('warning', onWarning);
    try {
      await (async () => { await init(); })();  // dropped at once
      assert.equal(openCommunicators(), 1);
      await waitFor(() => {
        gc();
        return openCommunicators() === 0;
      });
      await waitFor(() => calls('abort').length === 1 && warnings.length > 0);
      assert.match(warnings[0]!, /An NcclCommunicator was garbage-collected without close\(\)/);
      assert.equal(calls('destroy').length, 0);
    } finally {
      process.off('warning', onWarning);
    }
  });

  test('a thread that ends with a communicator open: the environment cleanup hook aborts it', async () => {
    const worker = new Worker(new URL('../fixtures/nccl-worker.js', import.meta.url), { workerData: { path: f.lib, log: f.log } });
    const [ready] = await Promise.all([new Promise((r) => worker.once('message', r)), new Promise((r) => worker.once('exit', r))]);
    assert.deepEqual(ready, { open: 1 });
    await waitFor(() => calls('abort').length === 1);
    assert.equal(calls('destroy').length, 0);
    assert.equal(openCommunicators(), 0, 'this thread\'s communicators are its own');
  });

  test('process.exit() with a communicator open and one being aborted: both ended before the process goes, its exit code kept', async () => {
    const waitFile = join(f.dir, 'abort-may-return');
    const child = spawn(process.execPath, [fileURLToPath(new URL('../fixtures/nccl-exit-child.js', import.meta.url)), f.lib], {
      env: { ...process.env, FAKE_NCCL_ABORT_WAIT_FILE: waitFile }, stdio: ['ignore', 'pipe', 'inherit'],
    });
    try {
      const exited = new Promise<[number | null, string | null]>((r) => child.once('exit', (code, signal) => r([code, signal])));
      let out = '';
      child.stdout.setEncoding('utf8').on('data', (d: string) => { out += d; });
      await waitFor(() => out.includes('exiting'));
      // The abort on the addon's thread is held in the fake until the file exists. An exit that
      // did not wait for it (and abort the open one) would cut it short: the two 'abort' lines
      // asserted below, logged only once the file exists, are the proof; no pause is needed.
      await waitFor(() => calls('waitingAbort').length >= 1);
      assert.equal(child.exitCode, null, 'the process waits for the abort in progress');
      assert.equal(calls('abort').length, 0);
      writeFileSync(waitFile, '');
      assert.deepEqual(await exited, [7, null]);
      assert.deepEqual(calls('abort').map((l) => l.replace(/\d+$/, 'N')), ['abort comm=N', 'abort comm=N']);
      assert.equal(new Set(calls('abort')).size, 2, 'each communicator aborted once');
      assert.equal(calls('destroy').length, 0);
    } finally {
      child.kill('SIGKILL');
    }
  });
});

/** Waits (polling, at most 10 s) until `ok()`. */
async function waitFor(ok: () => boolean): Promise<void> {
  for (let i = 0; i < 1000 && !ok(); i++) await new Promise((r) => setTimeout(r, 10));
  assert.ok(ok(), 'the condition never held');
}
