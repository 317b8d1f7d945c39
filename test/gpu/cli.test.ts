// The CLI on a GPU: info, and the two-terminal producer/consumer flow as two processes.
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync, existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { noGpu } from '../helpers/gpu.js';

const cli = fileURLToPath(new URL('../../src/cli/main.js', import.meta.url));

function run(args: string[]): Promise<{ code: number | null; out: string; err: string }> {
  return new Promise((resolve) => {
    const p = spawn(process.execPath, [cli, ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    let err = '';
    p.stdout.on('data', (d) => { out += d; });
    p.stderr.on('data', (d) => { err += d; });
    p.on('exit', (code) => resolve({ code, out, err }));
  });
}

describe('cli on a GPU', { skip: noGpu }, () => {
  test('info prints the device table and JSON', () => {
    const r = spawnSync(process.execPath, [cli, 'info'], { encoding: 'utf8' });
    assert.equal(r.status, 0, r.stderr);
    assert.match(r.stdout, /Device 0: /);
    assert.match(r.stdout, /UUID\s+GPU-[0-9a-f]{8}-/);
    assert.match(r.stdout, /POSIX-fd pool handles\s+(yes|no)/);
    const j = spawnSync(process.execPath, [cli, 'info', '--json'], { encoding: 'utf8' });
    const report = JSON.parse(j.stdout);
    assert.ok(report.devices.length >= 1);
    assert.equal(report.error, null);
    assert.ok(report.devices[0].freeMemory > 0);
  });

  test('produce and consume in two processes, consumer started first', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'two-terminals-'));
    try {
      const file = join(dir, 'handle.json');
      const consumer = run(['consume', file, '--timeout', '60']);
      await new Promise((r) => setTimeout(r, 500)); // the consumer is waiting for the file
      const producer = run(['produce', '--out', file, '--elements', '1000000', '--timeout', '60']);
      const [c, p] = await Promise.all([consumer, producer]);
      assert.equal(c.code, 0, `consumer: ${c.out}${c.err}`);
      assert.equal(p.code, 0, `producer: ${p.out}${p.err}`);
      assert.match(c.out, /verified every element and doubled them: 1, 3, 5, 7, 9/);
      assert.match(p.out, /doubled every value: 1, 3, 5, 7, 9, \.\.\. OK/);
      assert.equal(existsSync(file), false, 'the producer removes its files');
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  test('a consumer with no producer times out with a clear message', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'two-terminals-'));
    try {
      const r = await run(['consume', join(dir, 'nothing.json'), '--timeout', '0.5']);
      assert.equal(r.code, 1);
      assert.match(r.err, /ERR_TIMEOUT.*start the producer first/);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
