import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import { HostBuffer } from '../../src/host/index.js';
import { fdCount } from '../fixtures/fd-count.js';

setFlagsFromString('--expose-gc');
const gc = runInNewContext('gc') as () => void;

function mappings(): number {
  return readFileSync('/proc/self/maps', 'utf8').split('\n').filter((l) => l.includes('cuda-ipc-host')).length;
}

async function collect(): Promise<void> {
  for (let i = 0; i < 4; i++) {
    gc();
    await new Promise((r) => setImmediate(r));
  }
}

test('a HostBuffer dropped without close: one leak warning, fd released, memory kept while a view needs it', async () => {
  const warnings: Error[] = [];
  const onWarning = (w: Error): void => void warnings.push(w);
  process.on('warning', onWarning);
  try {
    await collect();
    const fds = fdCount();
    const maps = mappings();
    let bytes: Uint8Array | undefined = (() => {
      let leaked: HostBuffer | undefined;
      for (let i = 0; i < 4; i++) leaked = HostBuffer.allocate(1 << 20); // four leaks, one place: one warning
      leaked!.fill(9);
      return leaked!.bytes;
    })();
    await collect();
    assert.equal(fdCount(), fds, 'the garbage-collected buffers closed their fds');
    assert.equal(bytes[12345], 9, 'a live Uint8Array still reads the memory');
    assert.equal(mappings(), maps + 1, 'only the mapping still in use remains');
    bytes = undefined;
    await collect();
    assert.equal(mappings(), maps, 'the last view gone, the memory is unmapped');
    const leakWarnings = warnings.filter((w) => (w as { code?: string }).code === 'CUDA_IPC_LEAK');
    assert.equal(leakWarnings.length, 1);
    assert.match(leakWarnings[0]!.message, /A HostBuffer \(1048576 bytes\) was garbage-collected without close\(\)/);
    assert.match(leakWarnings[0]!.message, /Created at:\n.*host-gc\.test\.js:\d+/, 'the warning names where the buffer was created');
  } finally {
    process.off('warning', onWarning);
  }
});
