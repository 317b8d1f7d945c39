// safetensors on the CPU: files the test writes (one, sharded, with an index), loaded end to end
// into host memory (one HostBuffer), values read back; every rule of the format checked with
// corrupt files, each failing with ERR_SAFETENSORS_INVALID naming the file and the tensor.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { IpcError } from '../../src/errors.js';
import { HostArray, TensorMap, loadSafetensors, readSafetensorsHeader, writeSafetensors, type SafetensorsInput } from '../../src/tensors/index.js';
import { tensorMapContents } from '../../src/tensors/tensor-map.js';
import { linkPair } from '../fixtures/link-pair.js';

const dir = mkdtempSync(join(tmpdir(), 'cuda-ipc-st-'));
process.on('exit', () => rmSync(dir, { recursive: true, force: true }));

function tensors(seed: number): Array<[string, SafetensorsInput]> {
  const f32 = Float32Array.from({ length: 24 }, (_, i) => seed + i * 0.5);
  const i64 = BigInt64Array.from({ length: 3 }, (_, i) => BigInt(seed) * 1000n - BigInt(i));
  const bf16 = Uint16Array.from({ length: 6 }, (_, i) => 0x3f80 + seed + i);
  const f16 = Uint16Array.from({ length: 2 }, (_, i) => 0x3c00 + i);
  const u8 = Uint8Array.from({ length: 5 }, (_, i) => (seed + i) & 0xff);
  const flags = Uint8Array.from([1, 0, 1]);
  const f8 = Uint8Array.from([0x38, 0x40]);
  // Larger elements first keeps every tensor aligned, as the reference writer does.
  return [
    [`s${seed}.embed.weight`, { dtype: 'float32', shape: [4, 6], data: f32 }],
    [`s${seed}.positions`, { dtype: 'int64', shape: [3], data: i64 }],
    [`s${seed}.norm.weight`, { dtype: 'bfloat16', shape: [2, 3], data: bf16 }],
    [`s${seed}.half`, { dtype: 'float16', shape: [2], data: f16 }],
    [`s${seed}.ids`, { dtype: 'uint8', shape: [5], data: u8 }],
    [`s${seed}.mask`, { dtype: 'bool', shape: [3], data: flags }],
    [`s${seed}.scale.f8`, { dtype: 'float8_e4m3fn', shape: [2], data: f8 }],
    [`s${seed}.empty`, { dtype: 'float32', shape: [0, 4], data: new Float32Array(0) }],
  ];
}

function bytesOf(a: HostArray): number[] {
  const v = a.read() as ArrayLike<number | bigint>;
  return Array.from(v, Number);
}

test('a checkpoint written here loads into one host allocation with every dtype, value and the metadata', async () => {
  const path = join(dir, 'model.safetensors');
  const written = tensors(1);
  writeSafetensors(path, written, { format: 'pt', note: 'ü' });
  const header = await readSafetensorsHeader(path);
  assert.equal(header.dataOffset % 8, 0, 'the data starts 8-byte aligned');
  const map = await loadSafetensors(path, { memory: 'host' });
  try {
    assert.deepEqual(map.metadata, { format: 'pt', note: 'ü' });
    assert.deepEqual([...map.keys()], written.map(([n]) => n));
    for (const [name, t] of written) {
      const a = map.get(name)!;
      assert.equal(a.dtype, t.dtype, name);
      assert.deepEqual(a.shape, t.shape, name);
      assert.deepEqual(bytesOf(a), Array.from(t.data as unknown as ArrayLike<number | bigint>, Number), name);
    }
    // One allocation: sent over a link, the set carries one.
    const [tx, rx] = await linkPair();
    const { empty: _, ...rest } = Object.fromEntries([...map].filter(([n]) => !n.endsWith('.empty')));
    tx.send(new TensorMap(Object.entries(rest)));
    const got = (await rx.receive()) as TensorMap<HostArray>;
    const c = tensorMapContents(got);
    assert.equal(c.kind === 'received' && c.received.allocations.length, 1);
    got.close();
    tx.close();
    rx.close();
  } finally {
    map.close();
  }
});

test('sharded checkpoints: an index.json or a list of files gives one map; the index is checked against the files', async () => {
  const a = join(dir, 'model-00001-of-00002.safetensors');
  const b = join(dir, 'model-00002-of-00002.safetensors');
  writeSafetensors(a, tensors(1));
  writeSafetensors(b, tensors(2));
  const weightMap = Object.fromEntries([...tensors(1).map(([n]) => [n, 'model-00001-of-00002.safetensors']), ...tensors(2).map(([n]) => [n, 'model-00002-of-00002.safetensors'])]);
  const index = join(dir, 'model.safetensors.index.json');
  writeFileSync(index, JSON.stringify({ metadata: { total_size: 1 }, weight_map: weightMap }));
  for (const source of [index, [a, b]]) {
    const map = await loadSafetensors(source, { memory: 'host' });
    assert.equal(map.size, 16);
    assert.deepEqual(bytesOf(map.get('s2.embed.weight')!), Array.from(tensors(2)[0]![1].data as Float32Array));
    assert.deepEqual(bytesOf(map.get('s1.positions')!), [1000, 999, 998]);
    map.close();
  }
  const rejects = async (json: unknown, fragment: RegExp) => {
    writeFileSync(index, JSON.stringify(json));
    await assert.rejects(loadSafetensors(index, { memory: 'host' }), (e: IpcError) => e.code === 'ERR_SAFETENSORS_INVALID' && fragment.test(e.message));
  };
  await rejects({ weight_map: { ...weightMap, 's1.ids': 'model-00002-of-00002.safetensors' } }, /tensor "s1.ids" is listed in the index under .*00002/);
  await rejects({ weight_map: { ...weightMap, 'ghost.weight': 'model-00002-of-00002.safetensors' } }, /tensor "ghost.weight" of the index's weight_map is not in this file/);
  const { 's2.mask': _, ...less } = weightMap;
  await rejects({ weight_map: less }, /tensor "s2.mask" is not in the index's weight_map/);
  await rejects({ weight_map: { x: '../elsewhere.safetensors' } }, /not a file beside the index/);
  await rejects({ nothing: 1 }, /no "weight_map" object/);
  writeFileSync(index, '{"weight_map": ');
  await assert.rejects(loadSafetensors(index, { memory: 'host' }), /the index is not JSON/);
  await assert.rejects(loadSafetensors([a, a], { memory: 'host' }), /tensor "s1.embed.weight" is also in/);
});

/** Tensors packed back to back as the reference writer does: all but the first misaligned in the file. */
function misaligned(seed: number): Array<[string, SafetensorsInput]> {
  return [
    [`m${seed}.odd`, { dtype: 'uint8', shape: [3], data: Uint8Array.from([seed, seed + 1, seed + 2]) }],
    [`m${seed}.f64`, { dtype: 'float64', shape: [2], data: Float64Array.from([Math.PI * seed, -1e300]) }],
    [`m${seed}.u8b`, { dtype: 'uint8', shape: [1], data: Uint8Array.from([9]) }],
    [`m${seed}.f32`, { dtype: 'float32', shape: [3], data: Float32Array.from([1.5, -2.25, seed]) }],
    [`m${seed}.empty`, { dtype: 'int64', shape: [0], data: new BigInt64Array(0) }],
    [`m${seed}.bf16`, { dtype: 'bfloat16', shape: [1, 3], data: Uint16Array.from([0x3f80, 0xc000, 0x7f80 + seed]) }],
    [`m${seed}.i64`, { dtype: 'int64', shape: [2], data: BigInt64Array.from([-(2n ** 62n), BigInt(seed)]) }],
  ];
}

test('misaligned tensors (packed back to back) load, each aligned to its elements in memory', async () => {
  const one = join(dir, 'misaligned-1.safetensors');
  const two = join(dir, 'misaligned-2.safetensors');
  writeSafetensors(one, misaligned(1));
  writeSafetensors(two, misaligned(2));
  const header = await readSafetensorsHeader(one);
  assert.deepEqual(header.tensors.map((t) => t.begin), [0, 3, 19, 20, 32, 32, 38], 'the file really is misaligned');
  const index = join(dir, 'misaligned.safetensors.index.json');
  writeFileSync(index, JSON.stringify({ weight_map: Object.fromEntries([
    ...misaligned(1).map(([n]) => [n, 'misaligned-1.safetensors']), ...misaligned(2).map(([n]) => [n, 'misaligned-2.safetensors'])]) }));
  for (const source of [one, [one, two], index]) {
    const map = await loadSafetensors(source, { memory: 'host' });
    try {
      for (const [name, t] of [...misaligned(1), ...(source === one ? [] : misaligned(2))]) {
        const a = map.get(name)!;
        const itemsize = t.data.byteLength / Math.max(1, t.shape.reduce((x, y) => x * y, 1));
        assert.deepEqual(a.shape, t.shape, name);
        if (a.size === 0) continue;
        assert.equal(a.buffer.address % BigInt(itemsize), 0n, `${name} is aligned to its ${itemsize}-byte elements`);
        assert.deepEqual(Array.from(a.values() as ArrayLike<number | bigint>), Array.from(t.data as unknown as ArrayLike<number | bigint>), name);
      }
    } finally {
      map.close();
    }
  }
});

test('an index naming a shard that is not there fails naming the index and the shard', async () => {
  const index = join(dir, 'missing.safetensors.index.json');
  writeFileSync(index, JSON.stringify({ weight_map: { w: 'model-00009-of-00009.safetensors' } }));
  await assert.rejects(loadSafetensors(index, { memory: 'host' }), (e: IpcError) => {
    assert.equal(e.code, 'ERR_SAFETENSORS_INVALID');
    assert.ok(e.message.startsWith(index), e.message);
    assert.equal(e.message, `${index}: the index names the shard ${join(dir, 'model-00009-of-00009.safetensors')}, which does not exist (ENOENT)`, 'the cause once');
    assert.equal(e.message.split('ENOENT').length, 2);
    return true;
  });
  // A shard that is a directory: not a regular file, said by the safe-file check.
  mkdirSync(join(dir, 'shard-dir.safetensors'), { recursive: true });
  writeFileSync(index, JSON.stringify({ weight_map: { w: 'shard-dir.safetensors' } }));
  await assert.rejects(loadSafetensors(index, { memory: 'host' }), (e: IpcError) => e.code === 'ERR_FILE_UNSAFE' && /shard-dir\.safetensors is a directory/.test(e.message));
  // A missing index is the fs error of the file named, not "the index is not JSON".
  await assert.rejects(loadSafetensors(join(dir, 'no-such.safetensors.index.json'), { memory: 'host' }), (e: NodeJS.ErrnoException) => e.code === 'ENOENT');
});

/** A file from a header object (JSON-encoded here) and `data` bytes. */
function rawFile(name: string, header: unknown, data: number, opts: { headerText?: string; lengthField?: bigint } = {}): string {
  const json = Buffer.from(opts.headerText ?? JSON.stringify(header), 'utf8');
  const len = Buffer.alloc(8);
  len.writeBigUInt64LE(opts.lengthField ?? BigInt(json.byteLength));
  const path = join(dir, name);
  writeFileSync(path, Buffer.concat([len, json, Buffer.alloc(data)]));
  return path;
}

test('corrupt files: every rule is checked and the error names the file and the tensor', async () => {
  const ok = { a: { dtype: 'F32', shape: [2], data_offsets: [0, 8] }, b: { dtype: 'U8', shape: [4], data_offsets: [8, 12] } };
  const cases: Array<[string, () => string, RegExp]> = [
    ['short', () => { const p = join(dir, 'short'); writeFileSync(p, Buffer.alloc(5)); return p; }, /fewer than the 8 of the header length/],
    ['len-past-end', () => rawFile('len-past-end', ok, 12, { lengthField: 10_000n }), /the header of 10000 bytes runs past the end/],
    ['len-huge', () => rawFile('len-huge', ok, 12, { lengthField: 1n << 40n }), /more than the 100000000 bytes a header may have/],
    ['not-brace', () => rawFile('not-brace', undefined, 0, { headerText: ' {}' }), /does not start with "\{"/],
    ['not-json', () => rawFile('not-json', undefined, 0, { headerText: '{"a": ' }), /the header is not JSON/],
    ['not-utf8', () => { const p = rawFile('not-utf8', undefined, 0, { headerText: '{"\u00e9":1}' }); const b = readFileSync(p); b[10] = 0xff; writeFileSync(p, b); return p; }, /not UTF-8/],
    ['dtype', () => rawFile('dtype', { a: { dtype: 'F8_E8M0', shape: [1], data_offsets: [0, 1] } }, 1), /tensor "a" has dtype "F8_E8M0"; supported: BOOL, U8/],
    ['shape', () => rawFile('shape', { a: { dtype: 'F32', shape: [-1], data_offsets: [0, 4] } }, 4), /tensor "a" has a bad shape \[-1\]/],
    ['offsets', () => rawFile('offsets', { a: { dtype: 'F32', shape: [1], data_offsets: [0] } }, 4), /tensor "a" has data_offsets \[0\], not \[begin, end\]/],
    ['past-end', () => rawFile('past-end', { ...ok, b: { dtype: 'U8', shape: [4], data_offsets: [8, 40] } }, 12), /tensor "b" has data_offsets \[8, 40\] past the end of the data \(12 bytes\)/],
    ['truncated', () => rawFile('truncated', ok, 10), /tensor "b" has data_offsets \[8, 12\] past the end of the data \(10 bytes\)/],
    ['size', () => rawFile('size', { ...ok, a: { dtype: 'F32', shape: [3], data_offsets: [0, 8] } }, 12), /tensor "a" has 8 bytes of data, but shape \[3\] of F32 needs 12/],
    ['backwards', () => rawFile('backwards', { a: { dtype: 'U8', shape: [0], data_offsets: [4, 0] } }, 4), /tensor "a" has data_offsets \[4, 0\] that end before they begin/],
    ['overlap', () => rawFile('overlap', { a: { dtype: 'U8', shape: [8], data_offsets: [0, 8] }, b: { dtype: 'U8', shape: [4], data_offsets: [4, 8] } }, 8), /tensor "b" overlaps the tensor before it/],
    ['gap', () => rawFile('gap', { a: { dtype: 'U8', shape: [4], data_offsets: [0, 4] }, b: { dtype: 'U8', shape: [4], data_offsets: [8, 12] } }, 12), /bytes 4\.\.8 of the data belong to no tensor \(before "b"\)/],
    ['tail', () => rawFile('tail', ok, 16), /the tensors cover 12 bytes of data but the file has 16/],
    ['metadata', () => rawFile('metadata', { __metadata__: { n: 1 }, ...ok }, 12), /"__metadata__" entry "n" is not a string/],
    ['field', () => rawFile('field', { a: { dtype: 'F32', shape: [2], data_offsets: [0, 8], extra: 1 }, b: ok.b }, 12), /tensor "a" has an unknown field "extra"/],
  ];
  for (const [name, make, fragment] of cases) {
    const path = make();
    await assert.rejects(loadSafetensors(path, { memory: 'host' }), (e: IpcError) => {
      assert.equal(e.code, 'ERR_SAFETENSORS_INVALID', `${name}: ${e.message}`);
      assert.ok(e.message.startsWith(path), `${name}: the message names the file: ${e.message}`);
      assert.match(e.message, fragment, name);
      return true;
    });
  }
  // {} is a valid, empty checkpoint.
  const empty = await loadSafetensors(rawFile('empty', undefined, 0, { headerText: '{}' }), { memory: 'host' });
  assert.equal(empty.size, 0);
  empty.close();
});
