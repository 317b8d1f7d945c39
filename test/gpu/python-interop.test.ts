// Python interop: Numba and CuPy open descriptors that Node wrote, and Node opens a descriptor
// that CuPy wrote. Runs where python3 with numba and cupy is installed (the GPU machine).
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { createInterface } from 'node:readline';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { noGpu } from '../helpers/gpu.js';
import { DeviceArray, openIpcArray } from '../../src/arrays/device-array.js';
import { descriptorToJson } from '../../src/ipc/descriptor.js';

const script = fileURLToPath(new URL('../../../test/python/interop.py', import.meta.url));

function pythonReason(): string | undefined {
  if (noGpu) return noGpu;
  const r = spawnSync('python3', ['-c', 'import numba.cuda, cupy, numpy'], { encoding: 'utf8' });
  if (r.error) return `python3 is not available: ${r.error.message}`;
  if (r.status !== 0) return `python3 lacks numba, cupy or numpy: ${r.stderr.trim().split('\n').pop()}`;
  return undefined;
}
const skip = pythonReason();

function lastJson(text: string): any {
  const lines = text.trim().split('\n');
  return JSON.parse(lines[lines.length - 1]!);
}

describe('Python interop', { skip }, () => {
  for (const lib of ['numba', 'cupy'] as const) {
    test(`${lib} opens a Node array from its JSON descriptor, reads it, and writes back`, () => {
      const dir = mkdtempSync(join(tmpdir(), 'interop-'));
      try {
        const n = 3 * 1024;
        using array = DeviceArray.allocate('float32', [3, 1024]);
        const values = new Float32Array(n).map((_, i) => i * 0.5 + 1);
        array.write(values);
        const file = join(dir, 'desc.json');
        writeFileSync(file, JSON.stringify(descriptorToJson(array.ipcHandle())));
        const r = spawnSync('python3', [script, `${lib}-double`, file], { encoding: 'utf8', env: { ...process.env, PYTHONUNBUFFERED: '1' } });
        assert.equal(r.status, 0, r.stderr);
        const result = lastJson(r.stdout);
        assert.equal(result.error, undefined, result.error);
        assert.equal(result.ok, true, `python saw ${result.first}`);
        assert.deepEqual(result.first, [1, 1.5, 2, 2.5, 3]);
        const back = array.read() as Float32Array;
        assert.deepEqual(back, values.map((v) => v * 2), 'Node reads what Python wrote');
      } finally {
        rmSync(dir, { recursive: true, force: true });
      }
    });
  }

  test('Node opens a CuPy allocation from a descriptor that Python wrote, reads it, and writes back', async () => {
    const n = 4096;
    const p = spawn('python3', [script, 'cupy-export', String(n)], { stdio: ['pipe', 'pipe', 'inherit'], env: { ...process.env, PYTHONUNBUFFERED: '1' } });
    const lines = createInterface({ input: p.stdout! })[Symbol.asyncIterator]();
    const first = (await lines.next()).value as string;
    const desc = JSON.parse(first);
    assert.equal(desc.error, undefined, desc.error);
    {
      using array = openIpcArray(first);
      assert.equal(array.dtype, 'float32');
      assert.deepEqual(array.shape, [n]);
      const got = array.read() as Float32Array;
      for (let i = 0; i < n; i++) assert.equal(got[i], 3 * i + 1, `element ${i}`);
      array.write(got.map((v) => -v));
    }
    p.stdin!.write('written\n');
    const result = JSON.parse((await lines.next()).value as string);
    await new Promise((resolve) => p.once('exit', resolve));
    assert.equal(result.error, undefined, result.error);
    assert.equal(result.ok, true, `python saw ${result.first}`);
  });
});
