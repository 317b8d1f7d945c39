import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Worker } from 'node:worker_threads';
import { fdCount } from '../fixtures/fd-count.js';
import { waitUntil } from '../helpers/wait.js';

test('workers that exit with buffers, links and listeners open release them and do not crash', async () => {
  const directory = mkdtempSync(join(tmpdir(), 'cuda-ipc-worker-'));
  try {
    const run = async (index: number, how: 'terminate' | 'exit'): Promise<void> => {
      const w = new Worker(new URL('../fixtures/worker-resources.js', import.meta.url), { workerData: { index, directory } });
      const [pending] = (await Promise.all([new Promise((r, j) => (w.once('message', r), w.once('error', j)))])) as [number];
      assert.equal(pending, 1);
      const exited = new Promise((r) => w.once('exit', r));
      if (how === 'terminate') void w.terminate();
      else w.postMessage('exit');
      await exited;
    };
    await run(0, 'terminate');  // the first run loads modules and opens lazily created fds
    await new Promise((r) => setTimeout(r, 50));
    const before = fdCount();
    for (let i = 1; i <= 4; i++) await run(i, i % 2 ? 'terminate' : 'exit');
    await waitUntil(() => fdCount() === before, `the workers' fds to be closed (${fdCount()} open, ${before} before)`);
  } finally {
    rmSync(directory, { recursive: true, force: true });
  }
});
