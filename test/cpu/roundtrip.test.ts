// `cuda-ipc roundtrip` on a machine without a GPU: the host-memory round trip, and it says so.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { hasGpu } from '../helpers/gpu.js';

const cli = fileURLToPath(new URL('../../src/cli/main.js', import.meta.url));

test('roundtrip without a GPU runs on host shared memory, says why, and exits 0', { skip: hasGpu ? 'a GPU is present: the GPU suite covers roundtrip' : undefined }, () => {
  for (const elements of ['1', '65536']) {
    const r = spawnSync(process.execPath, [cli, 'roundtrip', '--elements', elements], { encoding: 'utf8' });
    assert.equal(r.status, 0, r.stdout + r.stderr);
    assert.match(r.stdout, /CUDA IPC is not available here: .*libcuda/);
    assert.match(r.stdout, /host shared memory/);
    assert.match(r.stdout, /child \d+: verified, wrote 0(, -1)?/);
    assert.match(r.stdout, /IPC round-trip: OK \(host shared memory; no GPU memory was shared\)/);
  }
});

test('roundtrip rejects a bad element count with a clear message (a usage error: 2)', () => {
  const r = spawnSync(process.execPath, [cli, 'roundtrip', '--elements', 'many'], { encoding: 'utf8' });
  assert.equal(r.status, 2);
  assert.match(r.stderr, /--elements must be a positive integer, got 'many'/);
});

test('every demo without a GPU prints why and exits 0', { skip: hasGpu ? 'a GPU is present: the GPU suite runs the demos' : undefined }, () => {
  for (const mode of ['events', 'transform', 'tensors']) {
    const r = spawnSync(process.execPath, [cli, 'demo', mode], { encoding: 'utf8' });
    assert.equal(r.status, 0, r.stdout + r.stderr);
    assert.match(r.stdout, new RegExp(`demo ${mode}: skipped, no usable GPU here: .*libcuda`));
  }
});

test('demo with no or an unknown mode is a usage error', () => {
  const r = spawnSync(process.execPath, [cli, 'demo', 'fireworks'], { encoding: 'utf8' });
  assert.equal(r.status, 2);
  assert.match(r.stderr, /MODE must be one of 'events', 'transform', 'tensors'; got 'fireworks'/);
  const none = spawnSync(process.execPath, [cli, 'demo'], { encoding: 'utf8' });
  assert.equal(none.status, 2);
  assert.match(none.stderr, /missing MODE: choose 'events', 'transform' or 'tensors'/);
});
