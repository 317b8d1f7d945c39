import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import { HostBuffer } from '../../src/host/index.js';
import { traceLeaks } from '../../src/index.js';
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

/** Leaks four 1 MiB buffers from one line; returns the CUDA_IPC_LEAK warnings they caused. */
async function leakFour(): Promise<Error[]> {
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
  } finally {
    process.off('warning', onWarning);
  }
  return warnings.filter((w) => (w as { code?: string }).code === 'CUDA_IPC_LEAK');
}

test('a HostBuffer dropped without close: one leak warning naming kind and size, fd released, memory kept while a view needs it', async () => {
  const leaks = await leakFour();
  assert.equal(leaks.length, 1);
  assert.match(leaks[0]!.message, /A HostBuffer \(1048576 bytes\) was garbage-collected without close\(\)/);
  assert.match(leaks[0]!.message, /CUDA_IPC_TRACE_LEAKS=1/, 'the warning says how to find where it was created');
  assert.doesNotMatch(leaks[0]!.message, /Created at/, 'no creation stack is recorded by default');
});

test('traceLeaks(true): the leak warning names the line that created the buffer', async () => {
  traceLeaks(true);
  try {
    const leaks = await leakFour();
    assert.equal(leaks.length, 1);
    assert.match(leaks[0]!.message, /A HostBuffer \(1048576 bytes\) was garbage-collected without close\(\)/);
    assert.match(leaks[0]!.message, /Created at:\n.*host-gc\.test\.js:\d+/, 'the warning names where the buffer was created');
  } finally {
    traceLeaks(false);
  }
});

test('CUDA_IPC_TRACE_LEAKS=1 turns creation stacks on; without it, one warning per kind and size', () => {
  const fixture = fileURLToPath(new URL('../fixtures/leak-child.js', import.meta.url));
  const run = (trace: string | undefined): string[] => {
    const env = { ...process.env };
    delete env.CUDA_IPC_TRACE_LEAKS;
    if (trace !== undefined) env.CUDA_IPC_TRACE_LEAKS = trace;
    const r = spawnSync(process.execPath, [fixture], { encoding: 'utf8', env, timeout: 60_000 });
    assert.equal(r.status, 0, r.stderr);
    return JSON.parse(r.stdout.trim().split('\n').pop()!) as string[];
  };
  const plain = run(undefined).sort();
  assert.equal(plain.length, 2, `one warning per kind and size: ${JSON.stringify(plain)}`);
  assert.match(plain[0]!, /^A HostBuffer \(4096 bytes\) was garbage-collected without close\(\)/);
  assert.match(plain[1]!, /^A HostBuffer \(8192 bytes\) was garbage-collected without close\(\)/);
  for (const w of plain) assert.doesNotMatch(w, /Created at/);
  assert.deepEqual(run('0').sort(), plain, 'CUDA_IPC_TRACE_LEAKS=0 is off');

  const traced = run('1');
  assert.equal(traced.length, 1, `one warning per creating line: ${JSON.stringify(traced)}`);
  assert.match(traced[0]!, /Created at:\n.*leak-child\.js:\d+/);
});
