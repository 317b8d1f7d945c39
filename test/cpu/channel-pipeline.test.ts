// pipeline(): stages in separate processes chained by channels; a stage's death ends the others
// with errors instead of hangs; the two examples on host memory.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { pipeline } from '../../src/channel/index.js';
import { readPayload, writePayload } from '../fixtures/channel-payload.js';

const STAGE = new URL('../fixtures/channel-stage.js', import.meta.url);
const code = (c: string) => (e: unknown) => (e as { code?: string }).code === c;

test('a three-stage pipeline: source -> relay -> sink, every message in order', async () => {
  const p = await pipeline([STAGE, STAGE, STAGE], { slots: 4, slotBytes: 64, args: [['source', '5000'], ['relay'], ['sink']] });
  const r = (await p.stages[2]!.link.receive()) as { count: number; error?: string; index: number; of: number };
  await p.done();
  assert.deepEqual({ count: r.count, error: r.error, index: r.index, of: r.of }, { count: 5000, error: undefined, index: 2, of: 3 });
});

test('this process feeds the first stage and reads the last', async () => {
  const p = await pipeline([STAGE, STAGE], { slots: 4, slotBytes: 64, input: true, output: true, args: [['relay'], ['relay']] });
  const n = 3000;
  const feeding = (async () => {
    for (let i = 0; i < n; i++) {
      const slot = await p.input!.acquire();
      p.input!.publish(slot, { length: writePayload(slot.bytes, i, 0) });
    }
    await p.input!.end();
  })();
  let next = 0;
  for await (const msg of p.output!) {
    assert.equal(readPayload(msg.bytes).seq, next++);
    assert.deepEqual(msg.meta, { stage: 1 });
    msg.release();
  }
  await feeding;
  assert.equal(next, n);
  await p.done();
  p.output!.close();
});

test('a middle stage SIGKILLed: the sink ends with ERR_PEER_GONE, done() rejects naming the stage', async () => {
  const p = await pipeline([STAGE, STAGE, STAGE], { slots: 4, slotBytes: 64, args: [['source', '1000000'], ['relay', '1'], ['sink', 'announce']] });
  // Killed once the sink has its first message (it says so), not after a guess at how long that takes.
  assert.deepEqual(await p.stages[2]!.link.receive({ signal: AbortSignal.timeout(30_000) }), { started: true });
  p.stages[1]!.child.kill('SIGKILL');
  const r = (await p.stages[2]!.link.receive({ signal: AbortSignal.timeout(10_000) })) as { count: number; next: number; error?: string };
  assert.equal(r.error, 'ERR_PEER_GONE');
  assert.ok(r.count > 0 && r.count === r.next, 'the sink got an unbroken prefix first');
  await assert.rejects(p.done(), (e: unknown) => code('ERR_PEER_GONE')(e) && /stage 1 .* SIGKILL/.test((e as Error).message));
});

const examples = fileURLToPath(new URL('../../examples/', import.meta.url));
for (const [name, file, args, expect] of [
  ['pipeline', 'pipeline/main.js', ['--messages', '24', '--elements', '65536'], /pipeline: 24 messages checked, 0 wrong[\s\S]*pipeline: OK/],
  ['inference server', 'inference/server.js', ['--workers', '3', '--requests', '120', '--elements', '65536'], /inference: 120 answers[\s\S]*0 wrong\s+inference: OK/],
] as const) {
  test(`example: ${name} on host memory (--host)`, () => {
    const r = spawnSync(process.execPath, [examples + file, ...args, '--host'], { encoding: 'utf8', timeout: 60_000 });
    assert.equal(r.status, 0, r.stdout + r.stderr);
    assert.match(r.stdout, /host shared memory/);
    assert.match(r.stdout, expect);
  });
}
