// The package must load and explain itself on machines with no NVIDIA driver (like CI).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { probeDriver, driver } from '../../src/cuda/driver.js';
import { CudaError } from '../../src/errors.js';

const noDriver = probeDriver().ok ? 'a CUDA driver is present here' : undefined;
const cli = fileURLToPath(new URL('../../src/cli/main.js', import.meta.url));

test('importing the package works without touching CUDA', async () => {
  const mod = await import('../../src/index.js');
  assert.equal(typeof mod, 'object');
});

test('the first CUDA call throws a typed CudaError that says why', { skip: noDriver }, () => {
  assert.throws(() => driver.deviceGetCount(), (e: unknown) => {
    assert.ok(e instanceof CudaError);
    assert.equal(e.code, 'CUDA_DRIVER_NOT_FOUND');
    assert.equal(e.status, -1);
    assert.equal(e.call, 'dlopen(libcuda.so.1)');
    assert.match(e.message, /libcuda\.so\.1/);
    return true;
  });
  // And again: the failure is remembered, not a crash on the second call.
  assert.throws(() => driver.memAlloc(16), CudaError);
});

test('`cuda-ipc info` prints a diagnostic and exits 0 without a driver', { skip: noDriver }, () => {
  const r = spawnSync(process.execPath, [cli, 'info'], { encoding: 'utf8' });
  assert.equal(r.status, 0, r.stderr);
  assert.match(r.stdout, /CUDA: not available \(CUDA_DRIVER_NOT_FOUND\)/);
  assert.match(r.stdout, /libcuda\.so\.1/);
});

test('`cuda-ipc info --json` reports the missing driver as data', { skip: noDriver }, () => {
  const r = spawnSync(process.execPath, [cli, 'info', '--json'], { encoding: 'utf8' });
  assert.equal(r.status, 0, r.stderr);
  const report = JSON.parse(r.stdout);
  assert.equal(report.driverVersion, null);
  assert.equal(report.error.code, 'CUDA_DRIVER_NOT_FOUND');
  assert.deepEqual(report.devices, []);
});

test('unknown CLI commands fail with usage', () => {
  const r = spawnSync(process.execPath, [cli, 'frobnicate'], { encoding: 'utf8' });
  assert.equal(r.status, 2);
  assert.match(r.stderr, /unknown command 'frobnicate'/);
});
