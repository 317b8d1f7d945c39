// Tensor sets between Node and a Python child on host memory (CPU only): many named tensors each way
// in one message, values, dtypes, shapes and strides checked on the other side, a set sent back as
// it came, Python's in-place update from a Node set and its mismatch errors, every lease ending and
// no fd left behind. Skips with the reason where there is no python3 (>= 3.10).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { once } from 'node:events';
import { HostBuffer } from '../../src/host/index.js';
import { spawnPython, type Link } from '../../src/link/index.js';
import { HostArray, TensorMap } from '../../src/tensors/index.js';
import { noPython, pythonFixture } from '../helpers/python.js';
import { fdCount } from '../fixtures/fd-count.js';

const CHILD = pythonFixture('tensor_child.py');
const skip = noPython;

async function ask(link: Link, message: unknown): Promise<any> {
  link.send(message);
  return link.receive({ signal: AbortSignal.timeout(20_000) });
}

/** `count` tensors over two HostBuffers: float32 matrices (every fifth transposed), bf16 and uint8 vectors. */
function nodeTensors(count: number): { buffers: HostBuffer[]; map: TensorMap<HostArray>; expected: Map<string, number[]> } {
  const floats = HostBuffer.allocate(count * 64);
  const small = HostBuffer.allocate(count * 8);
  const f = new Float32Array(floats.bytes.buffer, floats.bytes.byteOffset, count * 16);
  for (let i = 0; i < f.length; i++) f[i] = i * 0.5;
  for (let i = 0; i < small.byteLength; i++) small.bytes[i] = (i * 7) & 0xff;
  const map = new TensorMap<HostArray>();
  const expected = new Map<string, number[]>();
  for (let i = 0; i < count; i++) {
    const layer = `model.layers.${Math.floor(i / 8)}.mlp.experts.${i % 8}`;
    if (i % 5 === 4) {
      const a = new HostArray(floats.view(64 * i, 64), { dtype: 'float32', shape: [4, 4], strides: [4, 16] });
      map.set(`${layer}.w.T`, a);
      expected.set(`${layer}.w.T`, Array.from(a.read() as Float32Array));
    } else if (i % 5 === 3) {
      const a = new HostArray(small.view(8 * i, 8), { dtype: 'bfloat16', shape: [4] });
      map.set(`${layer}.bias`, a);
      expected.set(`${layer}.bias`, Array.from(a.read() as Uint16Array));
    } else if (i % 5 === 2) {
      const a = new HostArray(small.view(8 * i, 8), { dtype: 'uint8', shape: [2, 4] });
      map.set(`${layer}.bytes`, a);
      expected.set(`${layer}.bytes`, Array.from(a.read() as Uint8Array));
    } else {
      const a = new HostArray(floats.view(64 * i, 64), { dtype: 'float32', shape: [4, 4] });
      map.set(`${layer}.w`, a);
      expected.set(`${layer}.w`, Array.from(a.read() as Float32Array));
    }
  }
  return { buffers: [floats, small], map, expected };
}

async function released(buffers: HostBuffer[], ms = 5000): Promise<void> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`not released within ${ms} ms (leases: ${buffers.map((b) => b.leases)})`)), ms);
  });
  await Promise.race([Promise.all(buffers.map((b) => b.released())), late]).finally(() => clearTimeout(timer));
}

test('Node -> Python: 4,000 host tensors in one message (metadata over a 128 KiB frame), values, dtypes, shapes and strides as sent; the lease ends', { skip }, async () => {
  const fds = fdCount();
  const { child, link } = await spawnPython(CHILD);
  const exited = once(child, 'exit');
  const { buffers, map, expected } = nodeTensors(4000);
  try {
    const got = await ask(link, { op: 'describe', weights: map });
    assert.equal(got.memory, 'host');
    assert.equal(got.allocations, 2, 'each allocation once');
    assert.deepEqual(got.names, [...map.keys()]);
    let i = 0;
    for (const [name, a] of map) {
      assert.equal(got.dtypes[i], a.dtype, name);
      assert.deepEqual(got.shapes[i], a.shape, name);
      assert.deepEqual(got.strides[i], a.strides, name);
      assert.deepEqual(got.values[name], expected.get(name), name);
      i++;
    }
    map.close();
    for (const b of buffers) b.close();
    await released(buffers);
  } finally {
    await link.end();
    await exited;
  }
  assert.equal(fdCount(), fds, 'no fd left behind');
});

test('Python -> Node: a set of 4,000 Python host tensors arrives in one message as a TensorMap; closing it releases Python\'s lease', { skip }, async () => {
  const { child, link } = await spawnPython(CHILD);
  const exited = once(child, 'exit');
  try {
    const { weights } = (await ask(link, { op: 'produce', count: 4000 })) as { weights: TensorMap<HostArray> };
    assert.ok(weights instanceof TensorMap && weights.received);
    assert.equal(weights.size, 4000, 'the metadata of 4,000 tensors: over a frame, in one message');
    let i = 0;
    for (const [name, a] of weights) {
      const base = Array.from({ length: 16 }, (_, k) => i * 16 + k);
      const want = i % 3 === 2 ? [0, 1, 2, 3].flatMap((r) => [0, 1, 2, 3].map((c) => base[c * 4 + r]!)) : base;
      assert.equal(name, i % 3 === 2 ? `block.${i}.w.T` : `block.${i}.w`);
      assert.deepEqual(Array.from(a.read() as Float32Array), want, name);
      i++;
    }
    assert.deepEqual(await ask(link, { op: 'leases' }), { count: 1 }, 'one lease for the whole set');
    weights.close();
    // Asked (in order behind our RELEASE) until Python saw it, with a deadline.
    let leases: { count: number };
    for (const until = Date.now() + 30_000; (leases = await ask(link, { op: 'leases' })).count !== 0 && Date.now() < until;);
    assert.deepEqual(leases, { count: 0 });
  } finally {
    await link.end();
    await exited;
  }
});

test('a set sent back by Python as it came maps the same memory again; Python updates its own tensors from a Node set', { skip }, async () => {
  const { child, link } = await spawnPython(CHILD);
  const exited = once(child, 'exit');
  const { buffers, map, expected } = nodeTensors(50);
  try {
    const { weights } = (await ask(link, { op: 'echo', weights: map })) as { weights: TensorMap<HostArray> };
    assert.deepEqual([...weights.keys()], [...map.keys()]);
    const first = [...map.keys()][0]!;
    weights.get(first)!.values()[0] = 1234;  // the same memory as ours
    assert.equal((map.get(first)!.values() as Float32Array)[0], 1234);
    (map.get(first)!.values() as Float32Array)[0] = expected.get(first)![0]!;
    weights.close();

    const shapes = Object.fromEntries([...map].map(([n, a]) => [n, [a.dtype, a.shape]]));
    const r = await ask(link, { op: 'update', weights: map, shapes });
    assert.equal(r.copied, map.size);
    for (const [name, want] of expected) assert.deepEqual(r.values[name], want, name);

    const wrong = { ...shapes, [first]: ['float32', [16]], 'not.sent': ['float32', [1]] };
    const e = await ask(link, { op: 'update', weights: map, shapes: wrong });
    assert.equal(e.error, 'ERR_TENSOR_MISMATCH');
    assert.match(e.message, new RegExp(`'${first.replace(/\./g, '\\.')}': shape \\[4, 4\\] received, \\[16\\] here`));
    assert.match(e.message, /1 missing from what was received \('not.sent'\)/);
    map.close();
    for (const b of buffers) b.close();
    await released(buffers);
  } finally {
    await link.end();
    await exited;
  }
});

test('Python holding a set keeps Node\'s memory until it lets go, and its death lets go too', { skip }, async () => {
  const { child, link } = await spawnPython(CHILD);
  const exited = once(child, 'exit');
  const { buffers, map } = nodeTensors(20);
  assert.deepEqual(await ask(link, { op: 'hold', weights: map }), { held: 1 });
  map.close();
  for (const b of buffers) b.close();
  assert.equal(buffers[0]!.leases, 1);
  child.kill('SIGKILL');
  await exited;
  await released(buffers);
  link.close();
});
