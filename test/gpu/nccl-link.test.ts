// Device memory over TCP links (PROTOCOL.md 8): a DeviceBuffer, a DeviceArray and tensor sets sent
// from this process (GPU 0) to a child on GPU 1 over a tcp:// link, the bytes moved by NCCL. Values
// are checked on the receiving GPU; tensor sets are received into memory of the receiver's own
// (fetch), straight into parameters laid out like the sender's (every chunk direct) and into
// parameters of their own allocations (chunks staged and scattered), repeatedly; a set closed
// unused is drained. Then the failures: a receiver SIGKILLed mid-transfer (the sender's link closes
// with ERR_PEER_GONE within seconds and its memory comes back), a sender SIGKILLed mid-transfer
// (the receive fails with a typed error, nothing held). Run once on NCCL's default path (NVLink
// where there is one) and once forced onto its network path (CUDA_IPC_TEST_NCCL_NET=1, set by the
// second file of this pair), each process an NCCL host of its own (asOwnHost): there the child
// shares GPU 0 where there is one GPU. NCCL's default path skips on fewer than two GPUs.
import { describe, test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { setTimeout as sleep } from 'node:timers/promises';
import { Device } from '../../src/cuda/device.js';
import { DeviceBuffer, deviceMemoryStats } from '../../src/cuda/buffer.js';
import { BuiltinKernels } from '../../src/cuda/builtins.js';
import { DeviceArray } from '../../src/arrays/device-array.js';
import { Fanout, listen, spawn, type Link, type SpawnedChild, type TcpListener } from '../../src/link/index.js';
import { IpcError } from '../../src/errors.js';
import { TensorMap } from '../../src/tensors/tensor-map.js';
import '../../src/tensors/index.js';
import { asOwnHost, fewerGpusThan, ncclOrReason, netRankDevice, within, MiB } from '../helpers/nccl-ranks.js';

const onNetwork = process.env.CUDA_IPC_TEST_NCCL_NET === '1';
Object.assign(process.env, { NCCL_NVLS_ENABLE: '0' }, onNetwork ? asOwnHost('sender') : {});
/** The children's environment: on the network path each an NCCL host of its own. */
const childEnv = (): NodeJS.ProcessEnv => ({ ...process.env, ...(onNetwork && asOwnHost(`child-${++children}`)) });
let children = 0;
const nccl = await ncclOrReason();
const skip = typeof nccl === 'string' ? nccl : onNetwork ? undefined : fewerGpusThan(2);
const childDevice = (): Device => (onNetwork ? netRankDevice(1) : Device.get(1));
const token = 'a test token of 32 bytes or so..';
const path = onNetwork ? 'network path (NET/Socket over loopback)' : 'default path';

interface Receiver { child: SpawnedChild['child']; control: Link; data: Link }

async function ask(control: Link, msg: Record<string, unknown>, ms = 120_000): Promise<any> {
  control.send(msg);
  const reply = await within(control.receive({ signal: AbortSignal.timeout(ms) }), ms + 1000, `the child's '${String(msg.op)}'`) as any;
  assert.equal(reply?.ok, true, `the child failed '${String(msg.op)}': ${reply?.error}`);
  return reply;
}

async function startReceiver(listener: TcpListener, device: Device): Promise<Receiver> {
  const { child, link: control } = await spawn(new URL('../fixtures/nccl-link-child.js', import.meta.url), [], { device, stdio: 'inherit', env: childEnv() });
  const accepted = listener.accept();
  await ask(control, { op: 'connect', url: listener.url, token });
  return { child, control, data: await accepted };
}

/** Tensors of u32 elements, each filled with seed + 1000 * i + j. */
function specsOf(sizes: number[]): Array<{ name: string; words: number }> {
  return sizes.map((words, i) => ({ name: `layers.${i}.weight`, words }));
}

const kernels = () => BuiltinKernels.for(Device.get(0));

/** A set of `specs` in one allocation back to back (as a pool-backed trainer keeps it), or one allocation each. */
function makeSet(specs: Array<{ name: string; words: number }>, seed: number, oneAllocation: boolean): TensorMap<DeviceArray> {
  const d = Device.get(0);
  const map = new TensorMap<DeviceArray>();
  if (oneAllocation) {
    let total = 0;
    for (const s of specs) total += s.words * 4;
    const whole = DeviceBuffer.allocate(total, { device: d });
    let at = 0;
    specs.forEach((s, i) => {
      const a = new DeviceArray(whole.view(at, s.words * 4), { dtype: 'uint32', shape: [s.words] });
      kernels().fillPattern(a.buffer, 'u32', seed + 1000 * i, 1);
      map.set(s.name, a);
      at += s.words * 4;
    });
    whole.close();
  } else {
    specs.forEach((s, i) => {
      const a = DeviceArray.allocate('uint32', [s.words], { device: d });
      kernels().fillPattern(a.buffer, 'u32', seed + 1000 * i, 1);
      map.set(s.name, a);
    });
  }
  d.synchronize();
  return map;
}

/** Refills a set's tensors with a new seed (a training step). */
function refill(map: TensorMap<DeviceArray>, seed: number): void {
  let i = 0;
  for (const [, a] of map) kernels().fillPattern(a.buffer, 'u32', seed + 1000 * i++, 1);
  Device.get(0).synchronize();
}

describe(`device memory over a TCP link, NCCL's ${path}`, { skip }, () => {
  let listener: TcpListener;
  let rx: Receiver;
  const start = () => deviceMemoryStats();
  let baseline: ReturnType<typeof deviceMemoryStats>;

  before(async () => {
    baseline = start();
    listener = await listen('tcp://127.0.0.1:0', { token });
    rx = await startReceiver(listener, childDevice());
  });

  after(async () => {
    if (rx && rx.child.exitCode === null) await ask(rx.control, { op: 'exit' }).catch(() => {});
    rx?.data.close();
    await listener?.close();
  });

  test('a DeviceBuffer of 256 MiB arrives in memory of the receiver on its GPU, every value checked', async () => {
    const bytes = 256 * MiB;
    const buffer = DeviceBuffer.allocate(bytes, { device: Device.get(0) });
    kernels().fillPattern(buffer, 'u32', 7, 1);
    Device.get(0).synchronize();
    const reply = ask(rx.control, { op: 'buffer' });
    rx.data.send({ buffer, seed: 7 });
    buffer.close();  // leased until the receiver has the bytes
    const r = await reply;
    assert.deepEqual([r.bad, r.bytes, r.onDevice], [0, bytes, childDevice().ordinal]);
    await waitFor(() => rx.data.leases.count === 0, 'the lease to end');
  });

  test('a DeviceArray arrives as a DeviceArray of the same dtype, shape and values', async () => {
    const values = Float32Array.from({ length: 6 * 1024 }, (_, i) => i * 0.5 - 7);
    const array = DeviceArray.allocate('float32', [6, 1024], { device: Device.get(0) });
    array.write(values);
    const reply = ask(rx.control, { op: 'array' });
    rx.data.send({ array });
    const r = await reply;
    array.buffer.close();
    assert.equal(r.dtype, 'float32');
    assert.deepEqual(r.shape, [6, 1024]);
    assert.deepEqual(r.values, Array.from(values));
  });

  // A few large tensors and many small ones, as a model's state dict (in u32 words).
  const sizes = [64 * MiB / 4, 1024, 3, 40 * MiB / 4, 777, 12, 8 * MiB / 4, ...Array.from({ length: 200 }, (_, i) => 256 + 17 * i)];
  const specs = specsOf(sizes);

  test('a tensor set is received into memory of the receiver\'s own by fetch()', async () => {
    for (const oneAllocation of [true, false]) {
      const set = makeSet(specs, 0, oneAllocation);
      const reply = ask(rx.control, { op: 'fetch' });
      rx.data.send({ set });
      const r = await reply;
      assert.deepEqual([r.pending, r.bad, r.count], [true, 0, specs.length], `one allocation: ${oneAllocation}`);
      set.close();
    }
  });

  test('updateInPlace receives a set straight into parameters laid out like the sender\'s, every sync', async () => {
    const set = makeSet(specs, 0, true);
    try {
      for (let step = 1; step <= 3; step++) {
        refill(set, step * 100_000);
        const reply = ask(rx.control, { op: 'update', specs, layout: 'contiguous', fresh: step === 1 });
        rx.data.send({ set, seed: step * 100_000 });
        const r = await reply;
        assert.deepEqual([r.bad, r.method, r.copied], [0, 'nccl', specs.length], `sync ${step}`);
        await waitFor(() => rx.data.leases.count === 0, 'the lease to end');
      }
    } finally {
      set.close();
    }
  });

  test('updateInPlace into parameters of their own allocations: chunks staged and scattered, values exact', async () => {
    const set = makeSet(specs, 0, false);
    try {
      for (let step = 1; step <= 2; step++) {
        refill(set, step * 7_000_000);
        const reply = ask(rx.control, { op: 'update', specs, layout: 'separate', fresh: step === 1 });
        rx.data.send({ set, seed: step * 7_000_000 });
        const r = await reply;
        assert.deepEqual([r.bad, r.method, r.copied], [0, 'nccl', specs.length], `sync ${step}`);
      }
    } finally {
      set.close();
    }
  });

  test('a Fanout of one link: a buffer and a set go as NCCL broadcasts (the receiver joins as rank 1 of 2), values exact', async () => {
    using fanout = new Fanout([rx.data]);
    const buffer = DeviceBuffer.allocate(32 * MiB, { device: Device.get(0) });
    kernels().fillPattern(buffer, 'u32', 41, 1);
    Device.get(0).synchronize();
    const reply = ask(rx.control, { op: 'buffer' });
    fanout.send({ buffer, seed: 41 });
    buffer.close();
    assert.equal((await reply).bad, 0);
    const set = makeSet(specs.slice(0, 30), 0, false);
    const fetched = ask(rx.control, { op: 'fetch' });
    fanout.send({ set });
    const r = await fetched;
    assert.deepEqual([r.bad, r.count], [0, 30]);
    set.close();
  });

  test('a set closed unused is drained: the sender gets its memory back and the next transfer arrives whole', async () => {
    const set = makeSet(specs.slice(0, 20), 5, false);
    const dropped = ask(rx.control, { op: 'drop' });
    rx.data.send({ set });
    await dropped;
    await waitFor(() => rx.data.leases.count === 0, 'the dropped set\'s lease to end');
    const buffer = DeviceBuffer.allocate(4 * MiB, { device: Device.get(0) });
    kernels().fillPattern(buffer, 'u32', 99, 1);
    Device.get(0).synchronize();
    const reply = ask(rx.control, { op: 'buffer' });
    rx.data.send({ buffer, seed: 99 });
    buffer.close();
    assert.equal((await reply).bad, 0);
    set.close();
  });

  test('a receiver SIGKILLed mid-transfer: the sender\'s link closes with ERR_PEER_GONE, its memory comes back', async () => {
    const victim = await startReceiver(listener, childDevice());
    const bytes = (onNetwork ? 2048 : 8192) * MiB;
    const before = deviceMemoryStats();
    const buffer = DeviceBuffer.allocate(bytes, { device: Device.get(0) });
    await ask(victim.control, { op: 'receive-only' });
    const closed = new Promise<IpcError | undefined>((resolve) => victim.data.once('close', resolve));
    victim.data.send({ buffer, seed: 1 });
    buffer.close();
    await sleep(onNetwork ? 300 : 5);
    victim.child.kill('SIGKILL');
    const reason = await within(closed, 30_000, 'the sender noticing the receiver died');
    assert.equal(reason?.code, 'ERR_PEER_GONE');
    await waitFor(() => deviceMemoryStats().allocatedBytes <= before.allocatedBytes, 'the sent buffer to be freed', 30_000);
  });

  test('a sender SIGKILLed mid-transfer: the receive fails with a typed error, nothing is held', async () => {
    const { child, link: control } = await spawn(new URL('../fixtures/nccl-link-child.js', import.meta.url), [], { device: childDevice(), stdio: 'inherit', env: childEnv() });
    const accepted = listener.accept();
    await ask(control, { op: 'connect', url: listener.url, token });
    const data = await accepted;
    const before = deviceMemoryStats();
    const bytes = (onNetwork ? 2048 : 8192) * MiB;
    const received = data.receive();
    await ask(control, { op: 'send-buffer', bytes, seed: 3 });
    await sleep(onNetwork ? 300 : 5);
    child.kill('SIGKILL');
    const error = await within(received.then(() => undefined, (e: unknown) => e), 30_000, 'the receiver noticing the sender died') as IpcError | undefined;
    // The bytes may all have arrived before the kill on a fast path: then the message is whole.
    if (error !== undefined) assert.ok(['ERR_PEER_GONE', 'ERR_NCCL', 'ERR_LINK_CLOSED'].includes(error.code), `a typed error, got ${String(error.code)}: ${error.message}`);
    await waitFor(() => deviceMemoryStats().allocatedBytes <= before.allocatedBytes, 'the receiving buffer to be freed', 30_000);
  });

  test('nothing of the tests is left allocated here', async () => {
    await waitFor(() => deviceMemoryStats().allocations <= baseline.allocations + 8, 'allocations back to the start (the communicators\' staging aside)');
  });
});

async function waitFor(check: () => boolean, what: string, ms = 10_000): Promise<void> {
  const end = Date.now() + ms;
  while (!check()) {
    if (Date.now() > end) assert.fail(`timed out waiting for ${what}`);
    await sleep(20);
  }
}
