// stats() sums up what this process shares: it works without a GPU, and leases of host memory
// show up per peer until the peer lets go.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readdirSync } from 'node:fs';
import { stats } from '../../src/stats.js';
import { HostBuffer } from '../../src/host/index.js';
import { spawn } from '../../src/link/index.js';

test('stats() without a GPU: empty device figures, the import cache, open fds', () => {
  const s = stats();
  assert.equal(s.device.allocations, 0);
  assert.equal(s.device.heldBytes, 0);
  assert.equal(s.importCache.mappings, 0);
  assert.equal(s.importCache.idleLimit, 16);
  assert.equal(s.openFds, readdirSync('/proc/self/fd').length - 1);
});

test('a leased host buffer shows in stats() per peer until the peer closes it', async () => {
  const { child, link } = await spawn(new URL('../fixtures/stats-child.js', import.meta.url));
  const buffer = HostBuffer.allocate(1 << 20);
  link.send({ buffer });
  assert.equal(await link.receive(), 'holding');
  buffer.close(); // ours is closed; the lease keeps the mapping
  let s = stats();
  assert.equal(s.leases.count, 1);
  assert.equal(s.leases.bytes, 1 << 20);
  assert.deepEqual(s.leases.links.map((l) => l.peerPid), [child.pid]);
  link.send('close it');
  assert.equal(await link.receive(), 'closed');
  await buffer.released();
  s = stats();
  assert.equal(s.leases.count, 0);
  assert.equal(s.leases.bytes, 0);
  await new Promise((r) => child.once('exit', r));
});
