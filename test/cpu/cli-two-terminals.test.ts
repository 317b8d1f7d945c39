// The two-terminal example (`cuda-ipc produce` / `cuda-ipc consume`) without a GPU: the producer
// shares host shared memory through a link, the consumer finds it through FILE; and the
// consumer's failures (no file, not a descriptor, GPU memory without a GPU) exit 1 with the reason.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { descriptorToJson, legacyHandleDescriptor } from '../../src/ipc/descriptor.js';
import { hasGpu } from '../helpers/gpu.js';

const cli = fileURLToPath(new URL('../../src/cli/main.js', import.meta.url));
const noGpuOnly = hasGpu ? 'a GPU is present: test/gpu/cli.test covers the GPU flow' : undefined;

/** Runs the CLI; `onOut` sees its standard output so far after each chunk. */
function run(args: string[], onOut?: (out: string) => void): Promise<{ code: number | null; out: string; err: string }> {
  return new Promise((resolve) => {
    const p = spawn(process.execPath, [cli, ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    let err = '';
    p.stdout.on('data', (d) => { out += d; onOut?.(out); });
    p.stderr.on('data', (d) => { err += d; });
    p.on('exit', (code) => resolve({ code, out, err }));
  });
}

async function inDir(fn: (dir: string) => Promise<void>): Promise<void> {
  const dir = mkdtempSync(join(tmpdir(), 'two-terminals-'));
  try {
    await fn(dir);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

test('produce and consume without a GPU share host memory through a link, consumer started first', { skip: noGpuOnly }, () => inDir(async (dir) => {
  const file = join(dir, 'handle.json');
  let waiting!: () => void;
  const saysWaiting = new Promise<void>((resolve) => { waiting = resolve; });
  const consumer = run(['consume', file, '--timeout', '60'], (out) => { if (/consume: waiting up to 60 s for /.test(out)) waiting(); });
  // The producer starts once the consumer said it waits for the file (or exited: its output says why).
  await Promise.race([saysWaiting, consumer]);
  const producer = run(['produce', '--out', file, '--elements', '100000', '--timeout', '60']);
  const [c, p] = await Promise.all([consumer, producer]);
  assert.equal(p.code, 0, `producer: ${p.out}${p.err}`);
  assert.equal(c.code, 0, `consumer: ${c.out}${c.err}`);
  assert.match(p.out, /produce: no usable GPU here \(.*libcuda.*\); sharing host shared memory \(memfd\) through a link instead/);
  assert.match(c.out, /consume: waiting up to 60 s for .*handle\.json/);
  assert.match(c.out, /describes host shared memory of process \d+; connecting to its link 'cuda-ipc-produce-\d+'/);
  assert.match(c.out, /verified every element and doubled them: 1, 3, 5, 7, 9/);
  assert.match(p.out, /doubled every value: 1, 3, 5, 7, 9, \.\.\. OK/);
  assert.equal(existsSync(file), false, 'the producer removes its file');
}));

test('produce without a GPU and no consumer gives up after --timeout (1) and removes its file', { skip: noGpuOnly }, () => inDir(async (dir) => {
  const file = join(dir, 'handle.json');
  const p = await run(['produce', '--out', file, '--elements', '16', '--timeout', '0.5']);
  assert.equal(p.code, 1, p.out + p.err);
  assert.match(p.err, /\[ERR_TIMEOUT\] no consumer connected within 0\.5 s \(--timeout\): run `cuda-ipc consume .*handle\.json`/);
  assert.equal(existsSync(file), false);
}));

test('consume of a file that never appears fails (1) after --timeout, without looking for a GPU first', () => inDir(async (dir) => {
  const file = join(dir, 'nonexistent.json');
  const r = await run(['consume', file, '--timeout', '0.5']);
  assert.equal(r.code, 1, r.out + r.err);
  assert.match(r.out, /consume: waiting up to 0\.5 s for .*nonexistent\.json \(start `cuda-ipc produce --out .*nonexistent\.json` in another terminal\)/);
  assert.match(r.err, /\[ERR_TIMEOUT\] nothing appeared at .*nonexistent\.json within 0\.5 s \(--timeout\): start the producer first/);
  assert.doesNotMatch(r.out + r.err, /GPU/);
}));

test('consume of a file that is not a producer\'s descriptor fails (1) and names the file', () => inDir(async (dir) => {
  for (const [text, why] of [['not json', /is not JSON/], ['{"hello":1}', /is not a descriptor that `cuda-ipc produce` writes: descriptor\.kind/]] as const) {
    const file = join(dir, 'bad.json');
    writeFileSync(file, text);
    const r = await run(['consume', file]);
    assert.equal(r.code, 1, r.out + r.err);
    assert.match(r.err, /\[ERR_DESCRIPTOR_INVALID\] .*bad\.json/);
    assert.match(r.err, why);
  }
}));

test('consume of a GPU descriptor without a GPU fails (1), says why, and tells the producer', { skip: noGpuOnly }, () => inDir(async (dir) => {
  const file = join(dir, 'handle.json');
  const desc = legacyHandleDescriptor({
    handle: new Uint8Array(64).fill(7), offset: 0, byteLength: 4096, deviceUuid: 'GPU-0123abcd-4567-89ab-cdef-0123456789ab', pid: process.pid, // a live producer: one that is gone is ERR_HANDLE_STALE (cli-files.test)
    array: { dtype: 'float32', shape: [1024] },
  });
  writeFileSync(file, JSON.stringify(descriptorToJson(desc)));
  const r = await run(['consume', file]);
  assert.equal(r.code, 1, r.out + r.err);
  assert.match(r.err, /\[ERR_UNSUPPORTED\] .*handle\.json describes GPU memory \(device GPU-0123abcd-.*\), and this process has no usable GPU: .*libcuda/);
  assert.ok(existsSync(`${file}.done`), 'the producer is told, so that it stops waiting');
}));
