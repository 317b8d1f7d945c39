// `cuda-ipc status` on a GPU: device memory exported to a child (a pool buffer and a legacy-handle
// buffer) shows with its sizes on both sides, per peer, and goes away when the child does.
import { describe, test, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { once } from 'node:events';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { setTimeout as sleep } from 'node:timers/promises';
import { noGpu } from '../helpers/gpu.js';
import { Device } from '../../src/cuda/device.js';
import { DeviceBuffer } from '../../src/cuda/buffer.js';
import '../../src/ipc/pool.js';
import { spawn } from '../../src/link/index.js';
import type { ProcessStatus, StatusSnapshot } from '../../src/observe/reader.js';

const cli = fileURLToPath(new URL('../../src/cli/main.js', import.meta.url));
const CHILD = new URL('../fixtures/gpu-lease-child.js', import.meta.url);

// This process and its child publish their records here (read when the first change happens).
const runtime = mkdtempSync(join(tmpdir(), 'cuda-ipc-gpu-status-'));
process.env.XDG_RUNTIME_DIR = runtime;
after(() => rmSync(runtime, { recursive: true, force: true }));

const MiB = 1 << 20;

function statusJson(): StatusSnapshot {
  const r = spawnSync(process.execPath, [cli, 'status', '--json'], { encoding: 'utf8' });
  assert.equal(r.status, 0, r.stderr);
  return JSON.parse(r.stdout) as StatusSnapshot;
}

async function until(what: string, ok: (s: StatusSnapshot) => boolean): Promise<StatusSnapshot> {
  const deadline = Date.now() + 15_000;
  let s = statusJson();
  while (!ok(s)) {
    if (Date.now() > deadline) assert.fail(`status never showed ${what}; last: ${JSON.stringify(s, null, 2)}`);
    await sleep(50);
    s = statusJson();
  }
  return s;
}

const proc = (s: StatusSnapshot, pid: number): ProcessStatus | undefined => s.processes.find((p) => p.pid === pid);

describe('status on a GPU', { skip: noGpu }, () => {
  test('device exports and leases appear with their sizes, per peer, on both sides', async (t) => {
    const device = Device.get(0);
    const pool = device.createIpcPool();
    const pooled = pool.allocate(1 * MiB);
    // 2 MiB, a multiple of the allocation granularity: its address range is exactly this long.
    const plain = DeviceBuffer.allocate(2 * MiB, { device });
    pooled.fillUint32(11);
    plain.fillUint32(22);
    const { child, link } = await spawn(CHILD, ['consumer']);
    const childPid = child.pid!;
    try {
      link.send({ buffer: pooled });
      assert.equal(await link.receive(), 11);
      link.send({ buffer: plain });
      assert.equal(await link.receive(), 22);
      // Ours are closed: from here on the memory lives only for the child's leases.
      pooled.close();
      plain.close();

      const s = await until('the leases on both sides', (s) =>
        proc(s, process.pid)?.device.heldBytes === 3 * MiB && proc(s, childPid)?.device.imports === 2);
      const me = proc(s, process.pid)!;
      const kid = proc(s, childPid)!;
      t.diagnostic(`parent: ${JSON.stringify(me.device)}; child: ${JSON.stringify(kid.device)}`);
      assert.equal(me.device.allocations, 2);
      assert.equal(me.device.allocatedBytes, 3 * MiB);
      assert.equal(me.device.leased, 2);
      assert.equal(me.device.leasedBytes, 3 * MiB);
      assert.equal(me.device.heldBytes, 3 * MiB);
      assert.deepEqual(me.leasedTo, [{ pid: childPid, count: 2, bytes: 3 * MiB }]);
      assert.equal(me.importCache.exports, 1, 'the plain buffer went as a legacy handle');
      assert.equal(kid.device.allocations, 0);
      assert.equal(kid.device.imports, 2);
      assert.equal(kid.device.importedBytes, 3 * MiB);
      assert.deepEqual(kid.importedFrom, [{ pid: process.pid, count: 2, bytes: 3 * MiB }]);
      assert.equal(kid.importCache.mappings, 1);

      const text = spawnSync(process.execPath, [cli, 'status'], { encoding: 'utf8' });
      assert.equal(text.status, 0, text.stderr);
      t.diagnostic(text.stdout);
      assert.match(text.stdout, /device +2 allocations, 3\.0 MiB; peers lease 2 of them \(3\.0 MiB\), 3\.0 MiB kept only for peers/);
      assert.match(text.stdout, new RegExp(`leased to +pid ${childPid}: 2 leases, 3\\.0 MiB`));
      assert.match(text.stdout, /mapped from other processes: 2 allocations, 3\.0 MiB/);
      assert.match(text.stdout, new RegExp(`holds from +pid ${process.pid}: 2 leases, 3\\.0 MiB`));
    } finally {
      link.close();
      await once(child, 'exit');
    }
    // The child is gone: its leases ended, so the memory kept for it was freed.
    const s = await until('the child gone and the memory freed', (s) => !proc(s, childPid) && proc(s, process.pid)?.device.allocations === 0);
    assert.deepEqual(proc(s, process.pid)!.leasedTo, []);
    pool.close();
  });

  test('a --device beyond the devices here is a usage error', () => {
    const r = spawnSync(process.execPath, [cli, 'roundtrip', '--device', '99'], { encoding: 'utf8' });
    assert.equal(r.status, 2, r.stdout + r.stderr);
    assert.match(r.stderr, /--device 99: there is no device 99; this machine has \d+/);
  });
});
