// Node's NCCL transfer path on the CPU (issue 41, 2): tensor sets sent over a TCP link between this
// process and a Node child, with the driver faked in JavaScript (test/helpers/fake-cuda.ts: device
// memory is host memory, copy_runs runs on the CPU) and NCCL by the fake libnccl
// (test/fixtures/fake-nccl.c), which moves the bytes between the two processes through files
// (FAKE_NCCL_MOVE_DIR). What runs is the real path above the driver: link/nccl/nccl-comms.ts
// (communicators per link, sequence order, aborts), tensors/nccl-transfer.ts (plans, RemoteSet:
// fetch, receive-into, drop) and tensors/chunk-pipeline.ts (chunks direct or staged through two
// slots and gathered / scattered by copy_runs). Values are read back on the receiver. The same
// transfers on GPUs: test/gpu/nccl-link.test.ts. Skips, with the reason, where no C compiler
// builds the fake.
import { installFakeCuda } from '../helpers/fake-cuda.js';  // first: before anything loads the driver
import { describe, test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { mkdtempSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { DeviceArray } from '../../src/arrays/device-array.js';
import { DeviceBuffer } from '../../src/cuda/buffer.js';
import { Fanout, listen, spawn, type Link, type SpawnedChild, type TcpListener } from '../../src/link/index.js';
import { NCCL_LIBRARY_ENV } from '../../src/nccl/discovery.js';
import { forgetDiscoveries } from '../helpers/nccl-testing.js';
import { TensorMap } from '../../src/tensors/tensor-map.js';
import { PACK_ALIGN } from '../../src/tensors/packed-stream.js';
import '../../src/tensors/index.js';
import { fakeNccl, noFakeNccl } from '../helpers/fake-nccl.js';
import { waitUntil, within } from '../helpers/wait.js';

const token = 'a test token of 32 bytes or so..';
const moveDir = mkdtempSync(join(tmpdir(), 'cuda-ipc-nccl-move-'));
const childLog = join(moveDir, '..', `${moveDir.split('/').pop()}-child.log`);
if (fakeNccl) {
  Object.assign(process.env, {
    [NCCL_LIBRARY_ENV]: fakeNccl.lib, FAKE_NCCL_LOG: fakeNccl.log, FAKE_NCCL_MOVE: '1', FAKE_NCCL_MOVE_DIR: moveDir, FAKE_NCCL_MOVE_TIMEOUT_MS: '20000',
  });
  forgetDiscoveries();
}
const fake = await installFakeCuda();
after(() => {
  rmSync(moveDir, { recursive: true, force: true });
  rmSync(childLog, { force: true });
  fakeNccl?.cleanup();
});

interface Receiver { child: SpawnedChild['child']; control: Link; data: Link }

async function ask(control: Link, msg: Record<string, unknown>): Promise<any> {
  control.send(msg);
  const reply = await within(control.receive(), `the child's '${String(msg.op)}'`, 60_000) as any;
  assert.equal(reply?.ok, true, `the child failed '${String(msg.op)}': ${reply?.error}`);
  return reply;
}

async function startReceiver(listener: TcpListener, env: Record<string, string> = {}): Promise<Receiver> {
  const { child, link: control } = await spawn(new URL('../fixtures/nccl-fake-child.js', import.meta.url), [], {
    stdio: 'inherit', env: { ...process.env, FAKE_NCCL_LOG: childLog, ...env },
  });
  const accepted = listener.accept();
  await ask(control, { op: 'connect', url: listener.url, token });
  return { child, control, data: await accepted };
}

/** Values of tensor i: i * 1000 + j + seed / 8 (exact in float32 for the sizes here). */
function valuesFor(sizes: number[], seed: number): Record<string, number[]> {
  const out: Record<string, number[]> = {};
  sizes.forEach((n, i) => { out[`layers.${i}.weight`] = Array.from({ length: n }, (_, j) => Math.fround(i * 1000 + j + seed / 8)); });
  return out;
}

/** What the child answers for received tensors: the SHA-256 of each one's bytes (every value counts). */
function digests(values: Record<string, number[]>): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [name, v] of Object.entries(values)) out[name] = createHash('sha256').update(new Uint8Array(Float32Array.from(v).buffer)).digest('hex');
  return out;
}

const aligned = (n: number): number => Math.ceil(n / PACK_ALIGN) * PACK_ALIGN;

/**
 * A set of `values` in one allocation laid out as the packed stream is (each tensor at the next
 * PACK_ALIGN boundary: its chunks go straight from memory), or one allocation each (staged).
 */
function makeSet(values: Record<string, number[]>, oneAllocation: boolean): TensorMap<DeviceArray> {
  const map = new TensorMap<DeviceArray>();
  const entries = Object.entries(values);
  if (oneAllocation) {
    const whole = DeviceBuffer.allocate(entries.reduce((n, [, v]) => aligned(n) + 4 * v.length, 0));
    let at = 0;
    for (const [name, v] of entries) {
      at = aligned(at);
      const a = new DeviceArray(whole.view(at, 4 * v.length), { dtype: 'float32', shape: [v.length] });
      a.write(Float32Array.from(v));
      map.set(name, a);
      at += 4 * v.length;
    }
    whole.close();
  } else {
    for (const [name, v] of entries) {
      const a = DeviceArray.allocate('float32', [v.length]);
      a.write(Float32Array.from(v));
      map.set(name, a);
    }
  }
  return map;
}

const lines = (word: string): string[] => fakeNccl!.lines().filter((l) => l.startsWith(word));

// A few larger tensors and many small ones, as a model's state dict (one chunk: a chunk is at
// least MIN_CHUNK_BYTES, 1 MiB, and the sender makes one per stream up to DEFAULT_CHUNK_BYTES).
const SIZES = [70_000, 1024, 3, 20_000, 777, 12, ...Array.from({ length: 40 }, (_, i) => 16 + 17 * i)];
// Sizes of whole PACK_ALIGN units (64 float32): the packed stream has no padding between them, so
// parameters laid out like it take each chunk straight from NCCL.
const DIRECT_SIZES = [65_536, 1024, 64, 20_480, 768, ...Array.from({ length: 20 }, (_, i) => 64 * (i + 1))];

describe('tensor sets over a TCP link, NCCL faked on the CPU', { skip: noFakeNccl }, () => {
  let listener: TcpListener;
  let rx: Receiver;

  before(async () => {
    listener = await listen('tcp://127.0.0.1:0', { token });
    rx = await startReceiver(listener);
  });

  after(async () => {
    if (rx && rx.child.exitCode === null) await ask(rx.control, { op: 'exit' }).catch(() => {});
    rx?.data.close();
    await listener?.close();
  });

  test('fetch(): the set arrives in memory of the receiver\'s own, every value read back; the sender\'s memory comes back', async () => {
    for (const oneAllocation of [true, false]) {
      const values = valuesFor(SIZES, oneAllocation ? 1 : 2);
      const set = makeSet(values, oneAllocation);
      const reply = ask(rx.control, { op: 'fetch' });
      rx.data.send({ set });
      const r = await reply;
      assert.equal(r.pending, true, 'the bytes were still on the sender when the map arrived');
      assert.deepEqual(r.values, digests(values), `one allocation: ${oneAllocation}`);
      set.close();
      await waitUntil(() => rx.data.leases.count === 0, 'the lease of the sent set to end');
    }
    const sends = lines('send ');
    assert.ok(sends.length >= 2, 'chunks went out as ncclSend');
    assert.equal(lines('init ').length, 1, 'one communicator for the link, made once');
    assert.equal(readdirSync(moveDir).length, 0, 'every parcel was taken');
  });

  test('updateInPlace receives straight into parameters laid out like the sender\'s (direct chunks) and into separate ones (staged, scattered by copy_runs)', async () => {
    for (const contiguous of [true, false]) {
      const sizes = contiguous ? DIRECT_SIZES : SIZES;
      const specs = sizes.map((n, i) => [`layers.${i}.weight`, n] as [string, number]);
      const values = valuesFor(sizes, contiguous ? 3 : 4);
      const set = makeSet(values, true);
      const before = (await ask(rx.control, { op: 'memory' })).launches;
      const sent = fake.launches.length;
      const reply = ask(rx.control, { op: 'update', specs, contiguous });
      rx.data.send({ set });
      const r = await reply;
      assert.deepEqual(r.values, digests(values), `contiguous parameters: ${contiguous}`);
      const launches = (await ask(rx.control, { op: 'memory' })).launches - before;
      if (contiguous) assert.deepEqual([launches, fake.launches.length - sent], [0, 0], 'every chunk went straight from the sender\'s memory into the parameters');
      else assert.ok(launches > 0, 'staged chunks were scattered by copy_runs');
      set.close();
      await waitUntil(() => rx.data.leases.count === 0, 'the lease of the sent set to end');
    }
  });

  test('sets sent from separate allocations are gathered into the staging slots by copy_runs on the sender (slots and run table grow as needed)', async () => {
    // Small, then more tensors and more bytes than any staged set before: larger slots and table.
    for (const sizes of [[5, 300, 7, 2048], Array.from({ length: 150 }, (_, i) => 1000 + 7 * i)]) {
      const launches = fake.launches.length;
      const values = valuesFor(sizes, 5);
      const set = makeSet(values, false);
      const reply = ask(rx.control, { op: 'fetch' });
      rx.data.send({ set });
      assert.deepEqual((await reply).values, digests(values), `${sizes.length} tensors`);
      assert.ok(fake.launches.length > launches, 'the sender gathered with copy_runs');
      set.close();
      await waitUntil(() => rx.data.leases.count === 0, 'the lease of the sent set to end');
    }
  });

  test('the same TensorMap sent again (a training step later) carries its current values', async () => {
    const set = makeSet(valuesFor(SIZES, 14), false);
    try {
      for (const seed of [14, 15, 16]) {
        const values = valuesFor(SIZES, seed);
        for (const [name, a] of set) a.write(Float32Array.from(values[name]!));
        const reply = ask(rx.control, { op: 'fetch' });
        rx.data.send({ set });
        assert.deepEqual((await reply).values, digests(values), `step ${seed}`);
      }
    } finally {
      set.close();
    }
    await waitUntil(() => rx.data.leases.count === 0, 'the leases of the sent sets to end');
  });

  test('a set received and fetched is sent on as it came: back here, every value intact', async () => {
    const values = valuesFor([333, 64, 5], 17);
    const set = makeSet(values, false);
    const back = rx.data.receive<{ set: TensorMap }>();
    const reply = ask(rx.control, { op: 'echo' });
    rx.data.send({ set });
    await reply;
    const { set: got } = await within(back, 'the set sent back');
    assert.equal(got.pending, true);
    await got.fetch();
    const digest = (a: DeviceArray): string => {
      const v = a.read() as Float32Array;
      return createHash('sha256').update(new Uint8Array(v.buffer, v.byteOffset, v.byteLength)).digest('hex');
    };
    assert.deepEqual(Object.fromEntries([...got].map(([name, a]) => [name, digest(a as DeviceArray)])), digests(values));
    got.close();
    set.close();
    await waitUntil(() => rx.data.leases.count === 0, 'the lease of the sent set to end');
  });

  test('a set closed unused is drained: the sender gets its memory back, the next set arrives whole', async () => {
    const dropped = makeSet(valuesFor(SIZES, 6), true);
    await Promise.all([ask(rx.control, { op: 'drop' }), Promise.resolve(rx.data.send({ set: dropped }))]);
    dropped.close();
    await waitUntil(() => rx.data.leases.count === 0, 'the lease of the dropped set to end');
    const values = valuesFor([100, 3], 7);
    const set = makeSet(values, true);
    const reply = ask(rx.control, { op: 'fetch' });
    rx.data.send({ set });
    assert.deepEqual((await reply).values, digests(values), 'in step after the drained set');
    set.close();
  });

  test('two sets in a row: fetching the second receives the first (kept unfetched) first, in the communicator\'s order', async () => {
    const first = valuesFor([50, 60], 8);
    const second = valuesFor([70], 9);
    const a = makeSet(first, true);
    const b = makeSet(second, false);
    const kept0 = ask(rx.control, { op: 'keep' });
    rx.data.send({ set: a });
    assert.equal((await kept0).pending, true);
    const kept1 = ask(rx.control, { op: 'keep' });
    rx.data.send({ set: b });
    assert.equal((await kept1).pending, true);
    assert.deepEqual((await ask(rx.control, { op: 'fetch-kept', index: 1 })).values, digests(second));
    assert.deepEqual((await ask(rx.control, { op: 'fetch-kept', index: 0 })).values, digests(first), 'forced before the second, kept');
    a.close();
    b.close();
    await waitUntil(() => rx.data.leases.count === 0, 'the leases of both sets to end');
  });

  test('a receiver that cannot take a set (its allocation fails) aborts the communicator and tells the sender; the next set makes a new one', async () => {
    const values = valuesFor([1000, 24], 10);
    const packed = aligned(4 * 1000) + 4 * 24;  // the packed stream: 1000 floats, padded to PACK_ALIGN, then 24
    await ask(rx.control, { op: 'fail-allocations', bytes: packed });
    const set = makeSet(values, true);
    const reply = ask(rx.control, { op: 'fetch-fails' });
    rx.data.send({ set });
    const inits = lines('init ').length;
    assert.equal((await reply).code, 'ERR_NCCL');
    set.close();
    await waitUntil(() => rx.data.leases.count === 0, 'the lease of the set that was not taken to end');
    await waitUntil(() => lines('abort ').length >= 1, 'the sender to abort its communicator on the NCCL_ABORT');
    assert.equal(rx.data.closed, false, 'the link stays open');
    await ask(rx.control, { op: 'fail-allocations', bytes: -1 });
    const again = valuesFor([1000, 24], 11);
    const next = makeSet(again, true);
    const ok = ask(rx.control, { op: 'fetch' });
    rx.data.send({ set: next });
    assert.deepEqual((await ok).values, digests(again));
    assert.equal(lines('init ').length, inits + 1, 'a new communicator for the next set');
    next.close();
  });
});

describe('a broadcast to two receivers through a Fanout, NCCL faked on the CPU', { skip: noFakeNccl }, () => {
  test('one set, moved once by ncclBroadcast, arrives whole at both; received into parameters too', async () => {
    const listener = await listen('tcp://127.0.0.1:0', { token });
    const receivers: Receiver[] = [];
    try {
      for (let i = 0; i < 2; i++) receivers.push(await startReceiver(listener));
      const fanout = new Fanout(receivers.map((r) => r.data));
      const values = valuesFor(SIZES, 18);
      const set = makeSet(values, false);
      const replies = receivers.map((r) => ask(r.control, { op: 'fetch' }));
      fanout.send({ set });
      for (const r of await Promise.all(replies)) assert.deepEqual(r.values, digests(values));
      // A second set on the same broadcast communicator, received straight into parameters.
      const again = valuesFor(DIRECT_SIZES, 19);
      const next = makeSet(again, true);
      const specs = DIRECT_SIZES.map((n, i) => [`layers.${i}.weight`, n] as [string, number]);
      const updates = receivers.map((r) => ask(r.control, { op: 'update', specs, contiguous: true }));
      fanout.send({ set: next });
      for (const r of await Promise.all(updates)) assert.deepEqual(r.values, digests(again));
      assert.ok(lines('broadcast ').length >= 2, 'the chunks went out as ncclBroadcast');
      set.close();
      next.close();
      for (const r of receivers) await waitUntil(() => r.data.leases.count === 0, 'the leases of the broadcast sets to end');
      fanout.close();
    } finally {
      for (const r of receivers) {
        if (r.child.exitCode === null) await ask(r.control, { op: 'exit' }).catch(() => {});
        r.data.close();
      }
      await listener.close();
    }
  });
});

describe('peer death during an NCCL transfer, NCCL faked on the CPU', { skip: noFakeNccl }, () => {
  test('a receiver SIGKILLed with a set not taken: the sender\'s link closes with ERR_PEER_GONE and its memory comes back', async () => {
    const listener = await listen('tcp://127.0.0.1:0', { token });
    try {
      const rx = await startReceiver(listener);
      const set = makeSet(valuesFor([4096, 5], 12), true);
      const reply = ask(rx.control, { op: 'receive-only' });
      rx.data.send({ set });
      assert.equal((await reply).pending, true);
      const closed = new Promise<unknown>((resolve) => rx.data.once('close', (reason: unknown) => resolve(reason)));
      rx.child.kill('SIGKILL');
      const reason = await within(closed, 'the sender\'s link to close');
      assert.equal((reason as { code?: string })?.code, 'ERR_PEER_GONE');
      await waitUntil(() => rx.data.leases.count === 0, 'the lease to end with the link');
      set.close();
      rx.control.close();
    } finally {
      await listener.close();
    }
  });

  test('a sender SIGKILLed before its bytes went out: the receiver\'s fetch() fails with ERR_PEER_GONE, nothing held', async () => {
    const listener = await listen('tcp://127.0.0.1:0', { token });
    try {
      // The child's communicator never finishes its init: its record goes out, its bytes never do.
      const tx = await startReceiver(listener, { FAKE_NCCL_INIT_HANG: '1' });
      const allocations = fake.allocations.size;
      const received = tx.data.receive<{ set: TensorMap }>();
      await ask(tx.control, { op: 'send', values: valuesFor([300, 2], 13) });
      const { set } = await within(received, 'the set\'s record');
      assert.equal(set.pending, true);
      const closed = new Promise<void>((resolve) => tx.data.once('close', () => resolve()));
      tx.child.kill('SIGKILL');
      await within(closed, 'the link to the killed sender to close');
      await assert.rejects(set.fetch(), (e: unknown) => (e as { code?: string }).code === 'ERR_PEER_GONE' || assert.fail(String(e)));
      set.close();
      assert.equal(fake.allocations.size, allocations, 'nothing allocated for it is held');
      tx.control.close();
    } finally {
      await listener.close();
    }
  });
});
