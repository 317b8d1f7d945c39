// `npm run example:weights` on host memory (--host): a checkpoint loaded once, Python workers mapping
// it, a trainer's weights copied in place, the workers' answers checked before and after by the
// example itself. Skips without python3.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { noPython } from '../helpers/python.js';

const main = fileURLToPath(new URL('../../examples/weights/main.js', import.meta.url));

test('example:weights on host memory: loaded once, served, updated in place, served again', { skip: noPython }, () => {
  const r = spawnSync(process.execPath, [main, '--host', '--workers', '2', '--requests', '4'], { encoding: 'utf8', timeout: 120_000 });
  assert.equal(r.status, 0, r.stderr || r.stdout);
  assert.match(r.stdout, /loaded .*mlp\.safetensors once: 4 tensors/);
  assert.match(r.stdout, /4 requests over 2 workers answered with the loaded weights/);
  assert.match(r.stdout, /sent new weights: 4 tensors, \d+ bytes copied in place/);
  assert.match(r.stdout, /4 requests over 2 workers answered with the trainer's weights/);
  assert.match(r.stdout, /example:weights: ok/);
});
