// The host RunCopier of sharded syncs (src/tensors/sharded/host-copy.ts): contiguous and strided
// runs land where the table says and nowhere else; a table that reaches past a memory writes
// nothing; device memory is refused.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { IpcError } from '../../src/errors.js';
import { hostRunCopier } from '../../src/tensors/sharded/index.js';
import type { PlanPair, RunMemory } from '../../src/tensors/sharded/index.js';

const pair = (runs: number[]): PlanPair => ({ src: 0, dst: 1, path: 'ipc', bytes: 0, runs: Float64Array.from(runs) });
const host = (bytes: Uint8Array): RunMemory => ({ kind: 'host', bytes });

test('contiguous and strided runs land where the table says, the other bytes untouched', async () => {
  const src = Uint8Array.from({ length: 64 }, (_, i) => i);
  const dst = new Uint8Array(48).fill(0xee);
  const copier = hostRunCopier();
  // Run 1: 4 bytes from 8 to 0. Run 2: 3 blocks of 2 bytes, every 12 bytes from 32, every 4 from 10.
  await copier.copy({ pairs: [{ pair: pair([0, 0, 8, 0, 4, 1, 0, 0, 0, 0, 32, 10, 2, 3, 12, 4]), sources: [host(src)] }], destinations: [host(dst)] });
  const want = new Uint8Array(48).fill(0xee);
  want.set([8, 9, 10, 11], 0);
  want.set([32, 33], 10); want.set([44, 45], 14); want.set([56, 57], 18);
  assert.deepEqual(dst, want);
  await copier.close();
  await assert.rejects(copier.copy({ pairs: [], destinations: [] }), (e: IpcError) => e.code === 'ERR_CLOSED');
});

test('a run past either memory writes nothing (ERR_OUT_OF_RANGE); device memory is refused (ERR_SHARD_MEMORY)', async () => {
  const src = new Uint8Array(16).fill(1);
  const dst = new Uint8Array(16);
  const copier = hostRunCopier();
  const good = [0, 0, 0, 0, 4, 1, 0, 0];
  for (const bad of [[0, 0, 0, 0, 4, 5, 4, 4], [0, 0, 14, 0, 4, 1, 0, 0], [0, 1, 0, 0, 4, 1, 0, 0], [1, 0, 0, 0, 4, 1, 0, 0]]) {
    await assert.rejects(copier.copy({ pairs: [{ pair: pair([...good, ...bad]), sources: [host(src)] }], destinations: [host(dst)] }), (e: IpcError) => e.code === 'ERR_OUT_OF_RANGE', String(bad));
    assert.deepEqual(dst, new Uint8Array(16), 'nothing written, not even the good run before it');
  }
  const device = { kind: 'device', device: {} as never, pointer: 4096n, extent: 16 } as RunMemory;
  await assert.rejects(copier.copy({ pairs: [{ pair: pair(good), sources: [device] }], destinations: [host(dst)] }), (e: IpcError) => e.code === 'ERR_SHARD_MEMORY');
});
