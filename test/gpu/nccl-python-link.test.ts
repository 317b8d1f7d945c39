// Device memory over TCP links with the Python companion (PROTOCOL.md 8; python/cuda_ipc/link/nccl_*.py,
// nccl_tensor_*.py): PyTorch processes (test/python/nccl_link_child.py, spawnPython) on GPU 0 and GPU 1,
// and this Node process. Python -> Python: torch tensors of three dtypes arrive as torch tensors on the
// receiver's GPU with the same values; a model's state dict synced in place three times (update_in_place
// straight into its parameters, method 'nccl') matches what torch's load_state_dict puts there, then
// once by fetch() + load_state_dict, then read by name; a receiver SIGKILLed while 8 GiB (2 GiB on the
// network path) are in flight: the sender's link closes with ERR_PEER_GONE and its memory, leases and
// threads go back. Node <-> Python: a DeviceBuffer and a DeviceArray to a torch tensor, a TensorMap into
// Python parameters; a torch tensor to a DeviceArray, a Python state dict into Node parameters, three
// syncs. Run on NCCL's default path and, by nccl-python-link-net.test.ts, on its network path (socket
// transport over loopback; each process an NCCL host of its own, so one GPU serves them all). Every
// process loads PyTorch's wheel NCCL (ranks must run one version). Skips, saying why, without python3
// with torch or the wheel, and on NCCL's default path without two GPUs.
import { describe, test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { setTimeout as sleep } from 'node:timers/promises';
import { Device } from '../../src/cuda/device.js';
import { driver } from '../../src/cuda/driver.js';
import { DeviceBuffer } from '../../src/cuda/buffer.js';
import { BuiltinKernels } from '../../src/cuda/builtins.js';
import { DeviceArray } from '../../src/arrays/device-array.js';
import { listen, spawnPython, type Link, type SpawnedChild, type TcpListener } from '../../src/link/index.js';
import { TensorMap } from '../../src/tensors/tensor-map.js';
import { updateInPlace } from '../../src/tensors/update.js';
import { NCCL_LIBRARY_ENV } from '../../src/nccl/index.js';
import { wheelLibraries } from '../../src/nccl/discovery.js';
import '../../src/tensors/index.js';
import { PYTHON, pythonFixture, pythonLacks } from '../helpers/python.js';
import { asOwnHost, fewerGpusThan, ncclOrReason, within, MiB } from '../helpers/nccl-ranks.js';

const onNetwork = process.env.CUDA_IPC_TEST_NCCL_NET === '1';
// On the network path each process is an NCCL host of its own (asOwnHost), so one GPU serves them all.
Object.assign(process.env, { NCCL_NVLS_ENABLE: '0' }, onNetwork ? asOwnHost('node') : {});
const wheels = await wheelLibraries(PYTHON);
const reason = (onNetwork ? undefined : fewerGpusThan(2)) ?? pythonLacks('torch') ?? (wheels.paths.length ? undefined : `PyTorch's NCCL wheel is not found: ${wheels.why}`);
// Every process (this one and the children, which inherit it) loads the wheel's NCCL.
if (!reason) process.env[NCCL_LIBRARY_ENV] = wheels.paths[0];
const nccl = reason ?? await ncclOrReason(wheels.paths[0]);
const skip = typeof nccl === 'string' ? nccl : undefined;
const token = 'a test token of 32 bytes or so..';
const path = onNetwork ? 'network path (NET/Socket over loopback)' : 'default path';
const CHILD = 'nccl_link_child.py';

interface Py { child: SpawnedChild['child']; control: Link }

async function ask(p: Py, msg: Record<string, unknown>, ms = 300_000): Promise<any> {
  p.control.send(msg);
  const reply = await within(p.control.receive({ signal: AbortSignal.timeout(ms) }), ms + 1000, `Python's '${String(msg.op)}'`) as any;
  assert.equal(reply?.ok, true, `Python failed '${String(msg.op)}':\n${reply?.error}`);
  return reply;
}

let started = 0;
/** The GPU of a child asked for GPU `ordinal`: on the network path, the last GPU where there are fewer (the children are NCCL hosts of their own). */
const gpuOf = (ordinal: number): number => (onNetwork ? Math.min(ordinal, driver.deviceGetCount() - 1) : ordinal);
/** A Python child on gpuOf(ordinal). */
async function startPython(ordinal: number): Promise<Py> {
  const env = { ...process.env, ...(onNetwork && asOwnHost(`python-${++started}`)) };
  const { child, link } = await spawnPython(pythonFixture(CHILD), [], { stdio: ['ignore', 'inherit', 'inherit'], env });
  const p = { child, control: link };
  await ask(p, { op: 'init', ordinal: gpuOf(ordinal) });
  return p;
}

async function stopPython(p: Py | undefined): Promise<void> {
  if (!p || p.child.exitCode !== null || p.child.signalCode !== null) return;
  const exited = new Promise((r) => p.child.once('exit', r));
  try {
    await ask(p, { op: 'exit' }, 30_000);
  } catch {
    p.child.kill('SIGKILL');
  }
  const timer = setTimeout(() => p.child.kill('SIGKILL'), 30_000);
  await exited;
  clearTimeout(timer);
}

/** `sender` connects to `receiver`'s TCP listener: their data link. */
async function pair(sender: Py, receiver: Py): Promise<void> {
  const { url } = await ask(receiver, { op: 'listen', token });
  await ask(sender, { op: 'connect', url, token });
  await ask(receiver, { op: 'accepted' });
}

async function waitFor<T>(probe: () => Promise<T>, done: (v: T) => boolean, what: string, ms = 30_000): Promise<T> {
  const end = Date.now() + ms;
  for (;;) {
    const v = await probe();
    if (done(v)) return v;
    if (Date.now() > end) assert.fail(`timed out waiting for ${what}: ${JSON.stringify(v)}`);
    await sleep(100);
  }
}

describe(`Python <-> Python over a TCP link, NCCL's ${path}`, { skip }, () => {
  let tx: Py;
  let rx: Py;

  before(async () => {
    [tx, rx] = await Promise.all([startPython(0), startPython(1)]);
    await pair(tx, rx);
  });

  after(async () => {
    await Promise.all([stopPython(tx), stopPython(rx)]);
  });

  test('torch tensors arrive as torch tensors on the receiver\'s GPU, values equal', async () => {
    for (const [dtype, numel] of [['int32', 64 * MiB], ['bfloat16', 3 * MiB + 5], ['float32', 1001]] as const) {
      const got = ask(rx, { op: 'recv-tensor' });
      await ask(tx, { op: 'send-tensor', numel, seed: 17, dtype });
      const r = await got;
      assert.deepEqual([r.bad, r.dtype, r.shape, r.device, r.kind], [0, `torch.${dtype}`, [numel], gpuOf(1), 'torch.Tensor'], dtype);
    }
  });

  test('a state dict synced in place three times matches torch\'s load_state_dict of the sender\'s values', async () => {
    const [a, b] = await Promise.all([ask(tx, { op: 'model', seed: 1 }), ask(rx, { op: 'model', seed: 2 })]);
    assert.deepEqual([a.tensors, a.bytes], [b.tensors, b.bytes]);
    for (let step = 1; step <= 3; step++) {
      const got = ask(rx, { op: 'update', step, via: 'inplace', sender_seed: 1 });
      await ask(tx, { op: 'sync', step });
      const r = await got;
      assert.deepEqual([r.pending, r.method, r.copied, r.bad], [true, 'nccl', a.tensors, 0], `sync ${step}: ${JSON.stringify(r.timings)}`);
    }
    const got = ask(rx, { op: 'update', step: 4, via: 'fetch', sender_seed: 1 });
    await ask(tx, { op: 'sync', step: 4 });
    const r = await got;
    assert.deepEqual([r.pending, r.method, r.bad], [true, 'load_state_dict', 0]);
    const one = ask(rx, { op: 'fetch-one', name: '1.weight', step: 5 });
    await ask(tx, { op: 'sync', step: 5 });
    const f = await one;
    assert.deepEqual([f.pending, f.bad, f.device], [true, 0, gpuOf(1)]);
  });

  test('a receiver SIGKILLed mid-transfer: the sender\'s link closes with ERR_PEER_GONE, its memory, leases and threads go back', async () => {
    const [sender, victim] = await Promise.all([startPython(0), startPython(1)]);
    try {
      await pair(sender, victim);
      const baseline = (await ask(sender, { op: 'state' })).allocated as number;
      await ask(victim, { op: 'receive-only' });
      await ask(sender, { op: 'send-big', mib: onNetwork ? 2048 : 8192 });
      await sleep(onNetwork ? 300 : 5);
      victim.child.kill('SIGKILL');
      const s = await waitFor(() => ask(sender, { op: 'state' }),
        (v) => v.link_closed && v.allocated <= baseline && v.leases === 0 && v.threads.length === 0, 'the sender to let go of everything');
      assert.equal(s.reason, 'ERR_PEER_GONE');
    } finally {
      await Promise.all([stopPython(sender), stopPython(victim)]);
    }
  });
});

describe(`Node <-> Python over a TCP link, NCCL's ${path}`, { skip }, () => {
  let py: Py;
  let listener: TcpListener;
  let data: Link;
  const here = () => Device.get(0);
  const kernels = () => BuiltinKernels.for(here());
  const specs = [64 * MiB / 4, 1024, 3, 40 * MiB / 4, 777, ...Array.from({ length: 100 }, (_, i) => 256 + 17 * i)].map((numel, i) => ({ name: `layers.${i}.weight`, numel }));

  before(async () => {
    py = await startPython(1);
    listener = await listen('tcp://127.0.0.1:0', { token });
    const accepted = listener.accept();
    await ask(py, { op: 'connect', url: listener.url, token });
    data = await accepted;
    await ask(py, { op: 'params', specs });
  });

  after(async () => {
    await stopPython(py);
    data?.close();
    await listener?.close();
  });

  test('Node -> Python: a DeviceBuffer and a DeviceArray in one message (the first: a new communicator) arrive as torch tensors', async () => {
    const buffer = DeviceBuffer.allocate(256 * MiB, { device: here() });
    kernels().fillPattern(buffer, 'u32', 1000, 1);
    const array = DeviceArray.allocate('int32', [1024, 512], { device: here() });
    kernels().fillPattern(array.buffer, 'u32', 55, 1);
    here().synchronize();
    let got = ask(py, { op: 'recv-tensor' });
    // Two records naming the communicator this message makes: only the first carries its unique id.
    data.send({ t: buffer, seed: 1000, u: array, useed: 55 });
    buffer.close();  // leased until Python has the bytes
    let r = await got;
    assert.deepEqual([r.bad, r.dtype, r.shape, r.device], [0, 'torch.uint8', [256 * MiB], gpuOf(1)]);
    assert.deepEqual([r.u.bad, r.u.dtype, r.u.shape, r.u.device], [0, 'torch.int32', [1024, 512], gpuOf(1)]);
    kernels().fillPattern(array.buffer, 'u32', 77, 1);
    here().synchronize();
    got = ask(py, { op: 'recv-tensor' });
    data.send({ t: array, seed: 77 });
    r = await got;
    array.buffer.close();
    assert.deepEqual([r.bad, r.dtype, r.shape], [0, 'torch.int32', [1024, 512]]);
  });

  test('Node -> Python: a TensorMap received straight into Python parameters, three syncs', async () => {
    const map = new TensorMap<DeviceArray>();
    specs.forEach((s) => map.set(s.name, DeviceArray.allocate('int32', [s.numel], { device: here() })));
    try {
      for (let step = 1; step <= 3; step++) {
        const seed = step * 100_000;
        let k = 0;
        for (const [, a] of map) kernels().fillPattern(a.buffer, 'u32', seed + 1000 * k++, 1);
        here().synchronize();
        const got = ask(py, { op: 'update-params', seed });
        data.send({ set: map });
        const r = await got;
        assert.deepEqual([r.bad, r.method, r.copied], [0, 'nccl', specs.length], `sync ${step}`);
      }
      await waitFor(async () => data.leases.count, (n) => n === 0, 'Python to release what it received');
    } finally {
      map.close();
    }
  });

  test('Python -> Node: a torch tensor arrives as a DeviceArray, values equal', async () => {
    const numel = 16 * MiB;
    const received = data.receive<{ t: DeviceArray; seed: number }>({ signal: AbortSignal.timeout(300_000) });
    await ask(py, { op: 'send-tensor', numel, seed: 3, dtype: 'int32' });
    const { t, seed } = await received;
    assert.ok(t instanceof DeviceArray);
    assert.deepEqual([t.dtype, t.shape, t.buffer.device.ordinal], ['int32', [numel], 0]);
    assert.equal(Number((await kernels().verifyPattern(t.buffer, 'u32', seed, 1)).mismatches), 0);
    t.buffer.close();
  });

  test('Python -> Node: a state dict received straight into Node parameters, three syncs', async () => {
    const params = new Map(specs.map((s) => [s.name, DeviceArray.allocate('int32', [s.numel], { device: here() })] as const));
    try {
      for (let step = 1; step <= 3; step++) {
        const seed = step * 7_000_000;
        const received = data.receive<{ set: TensorMap }>({ signal: AbortSignal.timeout(300_000) });
        await ask(py, { op: 'send-params', seed });
        const { set } = await received;
        assert.equal(set.pending, true);
        const r = await updateInPlace(params, set);
        set.close();
        assert.deepEqual([r.method, r.copied], ['nccl', specs.length], `sync ${step}`);
        let k = 0;
        for (const [name, a] of params) {
          assert.equal(Number((await kernels().verifyPattern(a.buffer, 'u32', seed + 1000 * k++, 1)).mismatches), 0, `${name}, sync ${step}`);
        }
      }
    } finally {
      for (const a of params.values()) a.buffer.close();
    }
  });
});
