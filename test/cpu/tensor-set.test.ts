// Tensor sets on host memory, Node to Node: many named tensors in one message, each allocation
// once, values read back, views and strided tensors, the lease ending when the receiver closes,
// no fds left behind; the record's checks against lying tables; in-place updates and what they
// say when names, dtypes or shapes do not match.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { HostBuffer } from '../../src/host/index.js';
import { IpcError } from '../../src/errors.js';
import { HostArray, TensorMap, updateInPlace } from '../../src/tensors/index.js';
import {
  AllocationKind, decodeTensorTable, encodeTensorSet, encodeTensorTable, parseTensorSet, type TensorSpec,
} from '../../src/tensors/wire.js';
import { linkPair } from '../fixtures/link-pair.js';
import { fdCount } from '../fixtures/fd-count.js';

function hostTensors(): { buffers: HostBuffer[]; map: TensorMap<HostArray> } {
  const a = HostBuffer.allocate(1 << 16);
  const b = HostBuffer.allocate(4096);
  const f = new Float32Array(a.bytes.buffer, a.bytes.byteOffset, (1 << 16) / 4);
  for (let i = 0; i < f.length; i++) f[i] = i * 0.25;
  b.bytes.forEach((_, i) => (b.bytes[i] = i & 0xff));
  const map = new TensorMap<HostArray>();
  map.set('model.layers.0.attn.q.weight', new HostArray(a.view(0, 64 * 4 * 16), { dtype: 'float32', shape: [16, 64] }));
  map.set('model.layers.0.attn.k.weight', new HostArray(a.view(4096, 4096), { dtype: 'float32', shape: [32, 32] }));
  // Transposed: shape [8, 4] over a 4x8 block, strides (4, 32) bytes.
  map.set('model.layers.0.attn.k.weight.T', new HostArray(a.view(8192, 128), { dtype: 'float32', shape: [8, 4], strides: [4, 32] }));
  // Every other element: strides with gaps.
  map.set('model.layers.1.mlp.ü', new HostArray(a.view(16384, 4096), { dtype: 'float32', shape: [10], strides: [8] }));
  map.set('bytes', new HostArray(b.view(100, 200), { dtype: 'uint8', shape: [2, 100] }));
  map.set('bias.bf16', new HostArray(b.view(1024, 64), { dtype: 'bfloat16', shape: [32] }));
  return { buffers: [a, b], map };
}

test('a map of host tensors crosses in one message, each allocation once; values, views and strides arrive', async () => {
  const before = fdCount();
  const [tx, rx] = await linkPair();
  const { buffers, map } = hostTensors();
  try {
    tx.send({ weights: map, step: 7 });
    const msg = (await rx.receive()) as { weights: TensorMap<HostArray>; step: number };
    assert.equal(msg.step, 7);
    const got = msg.weights;
    assert.ok(got instanceof TensorMap && got.received);
    assert.equal(got.memory, 'host');
    assert.deepEqual([...got.keys()], [...map.keys()], 'the sender\'s order');
    for (const [name, sent] of map) {
      const r = got.get(name)!;
      assert.equal(r.dtype, sent.dtype, name);
      assert.deepEqual(r.shape, sent.shape, name);
      assert.deepEqual(r.strides, sent.strides, name);
      assert.deepEqual(r.read(), sent.read(), name);
    }
    // Element [0][1] of the transposed view is 32 bytes (one row of the 4x8 block) past its start.
    assert.equal(got.get('model.layers.0.attn.k.weight.T')!.read()[1], ((8192 + 32) / 4) * 0.25, 'transposed element [0][1]');
    // Zero-copy: a write through the received view is seen by the sender.
    got.get('model.layers.0.attn.q.weight')!.values()[3] = -1;
    assert.equal(map.get('model.layers.0.attn.q.weight')!.values()[3], -1);
    assert.equal(buffers[0]!.leases, 1, 'one lease for the message, holding every allocation');
    assert.equal(buffers[1]!.leases, 1);
    map.close();
    for (const b of buffers) b.close();
    assert.ok(!buffers[0]!.closed || buffers[0]!.leases === 1, 'the peer still holds the memory');
    got.close();
    await Promise.all(buffers.map((b) => b.released()));
  } finally {
    tx.close();
    rx.close();
  }
  await new Promise((r) => setTimeout(r, 50));
  assert.equal(fdCount(), before, 'every fd of the test is closed: memfds, their duplicates, the socketpair');
});

test('a plain Map of HostArrays travels as a tensor set; a received map can be sent on unchanged', async () => {
  const [a, b] = await linkPair();
  const [c, d] = await linkPair();
  const buf = HostBuffer.allocate(8192);
  const arr = new HostArray(buf.view(0, 8192), { dtype: 'int32', shape: [2048] });
  arr.values().forEach((_, i, v) => (v[i] = i * 3));
  try {
    a.send(new Map([['x', arr]]));
    const first = (await b.receive()) as TensorMap<HostArray>;
    d.send({ relay: first });
    const second = ((await c.receive()) as { relay: TensorMap<HostArray> }).relay;
    assert.deepEqual(second.get('x')!.read(), arr.read());
    first.close();
    assert.equal(buf.leases, 1, 'the relay still holds it through its own lease');
    second.close();
    await new Promise((r) => setTimeout(r, 20));
    assert.equal(buf.leases, 0);
  } finally {
    arr.close();
    buf.close();
    for (const l of [a, b, c, d]) l.close();
  }
});

test('many tensors in one message: 1500 names sharing prefixes, values checked, the lease ends', async () => {
  const [tx, rx] = await linkPair();
  const buf = HostBuffer.allocate(1500 * 64);
  const map = new TensorMap<HostArray>();
  for (let i = 0; i < 1500; i++) {
    const a = new HostArray(buf.view(i * 64, 64), { dtype: 'float64', shape: [8] });
    a.values().fill(i);
    map.set(`model.layers.${i >> 6}.mlp.experts.${i & 63}.down_proj.weight`, a);
  }
  try {
    tx.send({ weights: map });
    const got = ((await rx.receive()) as { weights: TensorMap<HostArray> }).weights;
    assert.equal(got.size, 1500);
    let i = 0;
    for (const [name, a] of got) {
      assert.equal(name, `model.layers.${i >> 6}.mlp.experts.${i & 63}.down_proj.weight`);
      assert.deepEqual(Array.from(a.read() as Float64Array), new Array(8).fill(i));
      i++;
    }
    got.close();
    map.close();
    buf.close();
    await buf.released();
  } finally {
    tx.close();
    rx.close();
  }
});

test('updateInPlace copies by name into host parameters, strided ones included', async () => {
  const [tx, rx] = await linkPair();
  const { buffers, map } = hostTensors();
  const mine = new TensorMap<HostArray>();
  for (const [name, a] of map) {
    // Our parameters: the same shapes, all C-contiguous, in memory of our own.
    mine.set(name, HostArray.allocate(a.dtype, a.shape));
  }
  try {
    tx.send(map);
    const got = (await rx.receive()) as TensorMap<HostArray>;
    const r = await updateInPlace(mine, got);
    assert.equal(r.copied, map.size);
    assert.equal(r.method, 'host');
    assert.equal(r.bytes, [...map.values()].reduce((s, a) => s + a.size * (a.dtype === 'float32' ? 4 : a.dtype === 'bfloat16' ? 2 : 1), 0));
    for (const [name, a] of map) assert.deepEqual(mine.get(name)!.read(), a.read(), name);
    got.close();
  } finally {
    mine.close();
    map.close();
    for (const b of buffers) b.close();
    tx.close();
    rx.close();
  }
});

test('updateInPlace names what does not match and copies nothing', async () => {
  const src = new TensorMap<HostArray>([
    ['a', HostArray.allocate('float32', [4])],
    ['b', HostArray.allocate('float32', [2, 2])],
    ['c', HostArray.allocate('int8', [3])],
    ['extra', HostArray.allocate('uint8', [1])],
  ]);
  for (const a of src.values()) a.values().fill(1 as never);
  const dst = new TensorMap<HostArray>([
    ['a', HostArray.allocate('float32', [4])],
    ['b', HostArray.allocate('float32', [4])],
    ['c', HostArray.allocate('uint8', [3])],
    ['gone', HostArray.allocate('float32', [1])],
  ]);
  try {
    await assert.rejects(updateInPlace(dst, src), (e: IpcError) => {
      assert.equal(e.code, 'ERR_TENSOR_MISMATCH');
      assert.match(e.message, /"b": shape \[2,2\] received, \[4\] here/);
      assert.match(e.message, /"c": dtype int8 received, uint8 here/);
      assert.match(e.message, /1 missing from what was received \("gone"\)/);
      assert.match(e.message, /1 received that are not parameters \("extra"\)/);
      return true;
    });
    assert.deepEqual(Array.from(dst.get('a')!.read() as Float32Array), [0, 0, 0, 0], 'nothing was copied');
    // Only names differ: strict false copies the rest and reports them.
    const dst2 = new TensorMap<HostArray>([['a', HostArray.allocate('float32', [4])], ['gone', HostArray.allocate('float32', [1])]]);
    await assert.rejects(updateInPlace(dst2, src), /ERR_TENSOR_MISMATCH|pass \{ strict: false \}/);
    const r = await updateInPlace(dst2, src, { strict: false });
    assert.deepEqual({ copied: r.copied, missing: r.missing, unexpected: r.unexpected }, { copied: 1, missing: ['gone'], unexpected: ['b', 'c', 'extra'] });
    assert.deepEqual(Array.from(dst2.get('a')!.read() as Float32Array), [1, 1, 1, 1]);
    dst2.close();
  } finally {
    src.close();
    dst.close();
  }
});

// ---- the record's checks -------------------------------------------------------------------

function hostEntry(size: number): { kind: AllocationKind; fdCount: number; data: Uint8Array } {
  const data = new Uint8Array(24);
  const v = new DataView(data.buffer);
  v.setBigUint64(0, BigInt(size), true);
  v.setBigUint64(16, BigInt(size), true);
  return { kind: AllocationKind.Host, fdCount: 1, data };
}

const SPECS: TensorSpec[] = [
  { name: 'layer.0.weight', dtype: 'float32', shape: [4, 8], strides: [32, 4], offset: 0, allocation: 0 },
  { name: 'layer.0.bias', dtype: 'float32', shape: [8], strides: [4], offset: 128, allocation: 0 },
  { name: 'layer.1.weight.T', dtype: 'bfloat16', shape: [8, 4], strides: [2, 16], offset: 0, allocation: 1 },
];

function record(specs = SPECS, sizes = [256, 64]): Uint8Array {
  return encodeTensorSet(sizes.map(hostEntry), encodeTensorTable(specs, sizes.length), specs.length);
}

function decode(bytes: Uint8Array, fds = 2) {
  const p = parseTensorSet(bytes, fds);
  return decodeTensorTable(p.table, p.tensorCount, p.allocations.map((a) => a.size));
}

function rejects(fn: () => unknown, fragment: RegExp): void {
  assert.throws(fn, (e: IpcError) => {
    assert.equal(e.code, 'ERR_FRAME_INVALID', e.message);
    assert.match(e.message, fragment);
    return true;
  });
}

test('tensor-set bytes: a round trip keeps names, dtypes, shapes, strides and offsets', () => {
  const layout = decode(record());
  assert.deepEqual(layout.names, SPECS.map((s) => s.name));
  assert.deepEqual(layout.dtypes, SPECS.map((s) => s.dtype));
  assert.deepEqual(layout.shapes, SPECS.map((s) => s.shape));
  assert.deepEqual(layout.strides, SPECS.map((s) => s.strides));
  assert.deepEqual([...layout.offsets], [0, 128, 0]);
  assert.deepEqual([...layout.contiguous], [1, 1, 0]);
  assert.deepEqual([...layout.extents], [128, 32, 64]);
  // Front coding: 'layer.0.bias' shares 'layer.0.' with the name before it.
  const table = encodeTensorTable(SPECS, 2);
  const shared = new DataView(table.buffer).getUint16(12 * 3 + 2, true);
  assert.equal(shared, 'layer.0.'.length);
  assert.equal(table.byteLength % 8, 0);
});

test('tensor-set bytes: the same table bytes as the Python side writes (pinned in python/tests/test_tensor_set.py)', () => {
  const table = encodeTensorTable([
    { name: 'ab', dtype: 'uint8', shape: [4], strides: [1], offset: 0, allocation: 0 },
    { name: 'ac', dtype: 'uint8', shape: [2, 2], strides: [1, 2], offset: 4, allocation: 0 },
  ], 1);
  assert.equal(Buffer.from(table).toString('hex'),
    '0000000000000000' + '0400000000000000' + '00000000' + '00000000' + '0000' + '0100' + '0200' + '0100' + '0505' + '0102' + '0001' + '0000' +
    '0400000000000000' + '0200000000000000' + '0200000000000000' + '0100000000000000' + '0200000000000000' + '616263' + '0000000000');
});

test('tensor-set bytes: every lie is ERR_FRAME_INVALID naming what is wrong', () => {
  const good = record();
  const mutate = (f: (b: Uint8Array, v: DataView) => void) => {
    const b = good.slice();
    f(b, new DataView(b.buffer));
    return b;
  };
  const tableAt = good.byteLength - encodeTensorTable(SPECS, 2).byteLength;
  const T = 3;
  rejects(() => decode(good.subarray(0, 20)), /too few/);
  rejects(() => decode(mutate((b) => (b[0] = 0))), /bad magic/);
  rejects(() => decode(mutate((_, v) => v.setUint16(4, 2, true))), /version 2/);
  rejects(() => decode(mutate((b) => (b[25] = 1))), /reserved/);
  rejects(() => decode(good, 1), /claim 2 fds but the record has 1/);
  rejects(() => decode(mutate((b) => (b[32] = 9))), /unknown kind 9/);
  rejects(() => decode(mutate((b) => (b[33] = 0))), /claims 0 fds where it must carry 1/);
  rejects(() => decode(mutate((_, v) => v.setUint32(36, 23, true))), /23 bytes of data, not 24/);
  rejects(() => decode(mutate((_, v) => v.setBigUint64(40 + 8, 4n, true))), /does not describe one whole allocation/);
  rejects(() => decode(mutate((_, v) => v.setUint32(16, 8, true))), /does not end the record/);
  rejects(() => decode(mutate((_, v) => v.setUint32(8, 3, true))), /allocation 2 (has unknown kind|runs past the end)/);
  // Table columns: offsets at 0, allocations at 8T, shared at 12T, suffix at 14T, dtype 16T, ndim 17T, flags 18T.
  rejects(() => decode(mutate((_, v) => v.setBigUint64(tableAt + 8, 240n, true))), /"layer.0.bias" reaches byte 272 of its allocation, which holds 256/);
  rejects(() => decode(mutate((_, v) => v.setBigUint64(tableAt + 8, 230n, true))), /"layer.0.bias" starts at offset 230, not a multiple of its 4-byte elements/);
  rejects(() => decode(mutate((_, v) => v.setUint32(tableAt + 8 * T + 4, 5, true))), /"layer.0.bias" names allocation 5 of 2/);
  rejects(() => decode(mutate((_, v) => v.setUint32(tableAt + 8 * T + 8, 0, true))), /allocation 1 holds no tensor/);
  rejects(() => decode(mutate((b) => (b[tableAt + 16 * T + 1] = 99))), /"layer.0.bias" has unknown dtype code 99/);
  rejects(() => decode(mutate((b) => (b[tableAt + 17 * T] = 33))), /33 dimensions/);
  rejects(() => decode(mutate((b) => (b[tableAt + 18 * T] = 2))), /unknown flags 2/);
  rejects(() => decode(mutate((b) => (b[tableAt + 18 * T] = 1))), /should hold \d+ bytes/);
  rejects(() => decode(mutate((_, v) => v.setUint16(tableAt + 12 * T + 2, 99, true))), /shares 99 name bytes with a previous name of 14/);
  rejects(() => decode(mutate((b) => (b[tableAt + 19 * T] = 1))), /padding bytes are not zero/);
  rejects(() => decode(mutate((b) => (b[b.length - 1] = 1))), /padding bytes are not zero/);
  // A dimension of zero elements, and one beyond 2^53.
  const shapeAt = tableAt + ((19 * T + 7) & ~7);
  rejects(() => decode(mutate((_, v) => v.setBigUint64(shapeAt, 0n, true))), /"layer.0.weight" has dimension 0 of 0 elements/);
  rejects(() => decode(mutate((_, v) => v.setBigUint64(shapeAt, 1n << 60n, true))), /more than 2\^53-1/);
});

test('tensor-set bytes: names are checked (empty, duplicate, not UTF-8, not shared maximally) and strides are canonical', () => {
  const one = (name: string, extra?: Partial<TensorSpec>): TensorSpec => ({ name, dtype: 'uint8', shape: [4], strides: [1], offset: 0, allocation: 0, ...extra });
  assert.throws(() => encodeTensorTable([one('a'), one('a')], 1), /appears twice/);
  assert.throws(() => encodeTensorTable([one('')], 1), /non-empty name/);
  assert.throws(() => encodeTensorTable([one('z', { shape: [0], strides: [1] })], 1), /has no elements/);
  const good = encodeTensorSet([hostEntry(16)], encodeTensorTable([one('ab'), one('ac')], 1), 2);
  const tableAt = good.byteLength - encodeTensorTable([one('ab'), one('ac')], 1).byteLength;
  const namesAt = tableAt + ((19 * 2 + 7) & ~7) + 16;
  const dup = good.slice();
  dup[namesAt + 2] = 'b'.charCodeAt(0);  // 'ab' then 'a' + 'b'
  rejects(() => decode(dup, 1), /shares fewer name bytes|appears twice/);
  const bad = good.slice();
  bad[namesAt] = 0xff;
  rejects(() => decode(bad, 1), /not UTF-8/);
  // 'ab' then 'xb' (nothing shared), with the x turned into an a: 'ab' again, sharing too little.
  const lazy = encodeTensorSet([hostEntry(16)], encodeTensorTable([one('ab'), one('xb')], 1), 2);
  lazy[namesAt + 2] = 'a'.charCodeAt(0);
  rejects(() => decode(lazy, 1), /shares fewer name bytes with the previous name than it could/);
  // Explicit strides equal to the C ones are not canonical.
  const strided = encodeTensorTable([one('s', { shape: [2, 2], strides: [1, 2] })], 1);
  const v = new DataView(strided.buffer);
  const stridesAt = 24 + 16;
  v.setBigUint64(stridesAt, 2n, true);
  v.setBigUint64(stridesAt + 8, 1n, true);
  rejects(() => decode(encodeTensorSet([hostEntry(16)], strided, 1), 1), /explicit strides equal to the C-contiguous ones/);
});

test('a tensor set whose table lies fails that message only: the sender gets its lease back, the link stays open', async () => {
  const [tx, rx] = await linkPair();
  const { buffers, map } = hostTensors();
  const { tensorSetTransfer } = await import('../../src/tensors/tensor-set-transfer.js');
  const encode = tensorSetTransfer.encode;
  try {
    // A sender whose table claims a smaller second allocation than its tensors need.
    tensorSetTransfer.encode = (value, link) => {
      const enc = encode(value, link);
      const v = new DataView(enc.data.buffer, enc.data.byteOffset, enc.data.byteLength);
      const second = 32 + 8 + 24 + 8;  // header, first entry, second entry's header
      v.setBigUint64(second, 1000n, true);
      v.setBigUint64(second + 16, 1000n, true);
      return enc;
    };
    tx.send({ weights: map });
    await assert.rejects(rx.receive(), (e: IpcError) => {
      assert.equal(e.code, 'ERR_FRAME_INVALID');
      assert.match(e.message, /"bias.bf16" reaches byte 1088 of its allocation, which holds 1000/);
      return true;
    });
    tensorSetTransfer.encode = encode;
    await new Promise((r) => setTimeout(r, 20));
    tx.send({ ok: 1 });
    assert.deepEqual(await rx.receive(), { ok: 1 }, 'the link is still open');
    assert.equal(buffers[0]!.leases, 0, 'the failed message\'s lease came back');
    assert.equal(buffers[1]!.leases, 0);
  } finally {
    tensorSetTransfer.encode = encode;
    map.close();
    for (const b of buffers) b.close();
    tx.close();
    rx.close();
  }
});

test('HostArray checks its arguments as DeviceArray does: RangeError for too few bytes, TypeError for values that do not fit', () => {
  using b = HostBuffer.allocate(64);
  assert.throws(() => new HostArray(b.view(0, 64), { dtype: 'float32', shape: [4, 5] }),
    (e: unknown) => e instanceof RangeError && (e as { code?: string }).code === 'ERR_OUT_OF_RANGE' && /needs 80 bytes, but the buffer has 64/.test(e.message));
  const a = new HostArray(b.view(0, 64), { dtype: 'float32', shape: [2, 2], strides: [16, 4] });
  assert.throws(() => a.write(new Float32Array(3)), (e: unknown) => e instanceof TypeError && (e as { code?: string }).code === 'ERR_INVALID_ARG_VALUE');
  a.write(new Float32Array([1, 2, 3, 4]));
  assert.deepEqual([...a.read()], [1, 2, 3, 4]);
  assert.deepEqual([...new Float32Array(b.read(0, 32).buffer)], [1, 2, 0, 0, 3, 4, 0, 0]);
  a.close();
});
