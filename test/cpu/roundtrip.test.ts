// `cuda-ipc roundtrip` and `demo` on a machine without a GPU: the host-memory paths, and they say so.
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

test('demo transform and tensors without a GPU run on host shared memory and say so; demo events says why it needs a GPU', { skip: hasGpu ? 'a GPU is present: the GPU suite runs the demos' : undefined }, () => {
  const transform = spawnSync(process.execPath, [cli, 'demo', 'transform', '--elements', '4096'], { encoding: 'utf8' });
  assert.equal(transform.status, 0, transform.stdout + transform.stderr);
  assert.match(transform.stdout, /demo transform: no usable GPU here \(.*libcuda.*\); running on host shared memory \(memfd\) instead/);
  assert.match(transform.stdout, /parent \d+: after the child: 200, 202, 204, 206, 208, \.\.\./);
  assert.match(transform.stdout, /demo transform: OK \(every element is 200 \+ 2i; host shared memory, no GPU memory was shared\)/);
  const tensors = spawnSync(process.execPath, [cli, 'demo', 'tensors', '--count', '3'], { encoding: 'utf8' });
  assert.equal(tensors.status, 0, tensors.stdout + tensors.stderr);
  assert.match(tensors.stdout, /running on host shared memory/);
  assert.match(tensors.stdout, /consumer \d+: tensor 2: \[3, 3, 3, 3, 3, \.\.\.\] OK/);
  assert.match(tensors.stdout, /all 3 buffers freed after the consumer released them/);
  assert.match(tensors.stdout, /demo tensors: OK/);
  const events = spawnSync(process.execPath, [cli, 'demo', 'events'], { encoding: 'utf8' });
  assert.equal(events.status, 0, events.stdout + events.stderr);
  assert.match(events.stdout, /demo events: skipped, no usable GPU here: .*libcuda/);
  assert.match(events.stdout, /no host-memory form; 'demo transform' and 'demo tensors' run on host memory here/);
});

test('--device on a machine without a GPU is a usage error, not ignored', { skip: hasGpu ? 'a GPU is present: --device is checked against its devices (cli.test)' : undefined }, () => {
  for (const [args, rest] of [
    [['roundtrip', '--device', '7'], 'leave --device out to run the round trip on host shared memory'],
    [['produce', '--out', 'h.json', '--device', '0'], 'leave --device out to share host shared memory instead'],
    [['demo', 'transform', '--device', '1'], 'leave --device out to run demo transform on host shared memory'],
  ] as const) {
    const r = spawnSync(process.execPath, [cli, ...args], { encoding: 'utf8' });
    assert.equal(r.status, 2, `${args.join(' ')}: ${r.stdout}${r.stderr}`);
    assert.match(r.stderr, new RegExp(`--device ${args.at(-1)}: there is no GPU here to choose \\(.*libcuda`));
    assert.ok(r.stderr.includes(rest), r.stderr);
    assert.equal(r.stdout, '', 'nothing ran');
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
