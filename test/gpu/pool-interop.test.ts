// A Node pool buffer given to another process through the public export API (poolBufferExport +
// pool.exportFd()), opened there by Node's importIpcPool + importBuffer and by cuda.core's own IPC
// import (DeviceMemoryResource.from_allocation_handle + Buffer.from_ipc_descriptor). Values are
// checked both ways.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { closeSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { noGpu } from '../helpers/gpu.js';
import { PYTHON, PYTHON_PACKAGE_DIR, noPython, pythonFixture } from '../helpers/python.js';
import { Device } from '../../src/cuda/device.js';
import { poolBufferExport } from '../../src/ipc/pool-interop.js';
import '../../src/ipc/pool.js';

const N = 1024;

function run(command: string, args: string[], fd: number, env: NodeJS.ProcessEnv = process.env): Promise<{ code: number | null; out: string }> {
  return new Promise((resolve, reject) => {
    const p = spawn(command, args, { stdio: ['ignore', 'pipe', 'inherit', fd], env });
    let out = '';
    p.stdout!.on('data', (d) => (out += d));
    p.once('error', reject);
    p.once('exit', (code) => resolve({ code, out }));
  });
}

for (const opener of ['node', 'cuda.core'] as const) {
  const skip = noGpu ?? (opener === 'cuda.core' ? noPython : undefined);
  test(`a Node pool buffer opened by ${opener === 'node' ? "another Node process's importIpcPool" : "cuda.core's own IPC import"} from the public export`, { skip }, async (t) => {
    using pool = Device.get(0).createIpcPool();
    using whole = pool.allocate(4 * N + 8192);
    const buffer = whole.view(8192, 4 * N);  // not at the start of its allocation: the offset must travel
    buffer.write(Float32Array.from({ length: N }, (_, i) => i * 0.5 + 1));
    const exp = poolBufferExport(buffer);
    assert.equal(exp.exportData.byteLength, 64);
    assert.equal(exp.offset, 8192);
    assert.equal(exp.allocationSize, 4 * N + 8192);
    const spec = JSON.stringify({ ...exp, exportData: Buffer.from(exp.exportData).toString('hex') });
    const fd = pool.exportFd();
    let r;
    try {
      r = opener === 'node'
        ? await run(process.execPath, [fileURLToPath(new URL('../fixtures/pool-import-child.js', import.meta.url)), spec], fd)
        : await run(PYTHON, [pythonFixture('cuda_core_import.py'), spec], fd, { ...process.env, PYTHONPATH: PYTHON_PACKAGE_DIR });
    } finally {
      closeSync(fd);
    }
    assert.equal(r.code, 0, r.out);
    const result = JSON.parse(r.out.trim().split('\n').pop()!);
    if (result.skipped) { t.skip(result.skipped); buffer.close(); return; }
    assert.equal(result.ok, true, JSON.stringify(result));
    const back = buffer.read();
    assert.ok(new Float32Array(back.buffer, back.byteOffset, N).every((v) => v === 5), `${opener} wrote into our buffer`);
    buffer.close();
  });
}
