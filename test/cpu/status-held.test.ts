// The status record follows what only peers' leases keep alive (heldBytes): closing our own
// buffer over leased memory rewrites the record, with no other change to prompt it. Device
// memory is stood in for by an owner whose release is recorded, so this runs without a GPU.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { SharedMemory, type MemoryOwner } from '../../src/cuda/buffer.js';
import { collectStatus, type ProcessStatus } from '../../src/observe/reader.js';
import type { Device } from '../../src/cuda/device.js';

const runtime = mkdtempSync(join(tmpdir(), 'cuda-ipc-status-held-'));
process.env.XDG_RUNTIME_DIR = runtime;
after(() => rmSync(runtime, { recursive: true, force: true }));

const BYTES = 3 << 20;

async function mine(what: string, ok: (p: ProcessStatus) => boolean): Promise<ProcessStatus> {
  const deadline = Date.now() + 10_000;
  for (;;) {
    const me = collectStatus().processes.find((p) => p.pid === process.pid);
    if (me && ok(me)) return me;
    if (Date.now() > deadline) assert.fail(`the status record never showed ${what}; last: ${JSON.stringify(me?.device)}`);
    await sleep(20);
  }
}

test('closing our reference to leased memory shows it as kept only for peers, and its release removes it', async () => {
  const released: boolean[] = [];
  const device = { activate() {} } as unknown as Device;
  const owner: MemoryOwner = { kind: 'device', device, base: 0x7f0000000000n, byteLength: BYTES, release: (forced) => { released.push(forced ?? false); } };
  const memory = new SharedMemory(owner);
  memory.acquire(); // our buffer
  const endLease = memory.lease(); // a peer's
  let me = await mine('the leased allocation', (p) => p.device.leased === 1);
  assert.equal(me.device.heldBytes, 0, 'our buffer is still open');

  memory.drop(); // our buffer closes: only the lease keeps the memory now
  me = await mine('the held bytes', (p) => p.device.heldBytes === BYTES);
  assert.equal(me.device.allocations, 1);
  assert.equal(me.device.leasedBytes, BYTES);
  assert.deepEqual(released, []);

  memory.acquire(); // a buffer over it again (a view made before, say): ours keeps it too
  me = await mine('the held bytes gone again', (p) => p.device.heldBytes === 0);
  assert.equal(me.device.leased, 1);
  memory.drop();
  await mine('the held bytes back', (p) => p.device.heldBytes === BYTES);

  endLease();
  assert.deepEqual(released, [false]);
  me = await mine('no allocation', (p) => p.device.allocations === 0);
  assert.equal(me.device.heldBytes, 0);
});
