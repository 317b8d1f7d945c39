// Channels with a Python end on device slots: Node's kernel writes a request slot (after a slow
// spin, so that an unordered reader would see stale data), a PyTorch kernel in the Python consumer
// reads it in place and writes 3x+7 into a slot of the answer channel, and Node's kernel checks every
// answer, then holds the slot a while before releasing it (so that an unordered Python producer would
// overwrite it early). All ordering is by the channels' fences on the streams, no CPU sync. Then the
// Python example runs and prints OK. The Python end runs on both of its hot paths (the native helper,
// where it is built, and the standard library). Needs a GPU and python3 with torch.
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { once } from 'node:events';
import { spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { noGpu } from '../helpers/gpu.js';
import { noPython, PYTHON_HOT_PATHS, pythonFixture, pythonLacks } from '../helpers/python.js';
import { Device } from '../../src/cuda/device.js';
import { Stream } from '../../src/cuda/stream.js';
import type { DeviceBuffer } from '../../src/cuda/buffer.js';
import { BuiltinKernels } from '../../src/cuda/builtins.js';
import { spawnPython, type Link } from '../../src/link/index.js';
import { createChannel } from '../../src/channel/index.js';

const skip = noGpu ?? noPython ?? pythonLacks('torch');
const reply = (link: Link, ms = 120_000): Promise<any> => link.receive({ signal: AbortSignal.timeout(ms) });

describe('Python channel ends on device slots', { skip }, () => {
  for (const path of PYTHON_HOT_PATHS) test(`a PyTorch kernel on the Python consumer reads each request slot in place and answers into a device slot; values checked (Python hot path: ${path.name})`, { timeout: 300_000, skip: path.skip }, async (t) => {
    const device = Device.get(0);
    const py = await spawnPython(pythonFixture('gpu_channel_child.py'), [], { stdio: ['ignore', 'inherit', 'inherit'], env: { ...process.env, ...path.env } });
    using stream = Stream.create(device);
    using checkStream = Stream.create(device);
    const kernels = BuiltinKernels.for(device);
    const elements = 1 << 18;
    try {
      const requests = await createChannel(py.link, { role: 'producer', slots: 2, slotBytes: 4 * elements, memory: { device } });
      const answers = await createChannel(py.link, { role: 'consumer', slots: 2, slotBytes: 4 * elements, memory: { device } });
      assert.equal(requests.memory, 'device');
      const n = 200;
      const t0 = performance.now();
      const sending = (async () => {
        for (let seq = 0; seq < n; seq++) {
          const slot = await requests.acquire({ stream });  // GPU-side wait for Python's release
          kernels.spin(200_000n, stream);                    // slow: an unordered Python read would see stale data
          kernels.fillPattern(slot.buffer as DeviceBuffer, 'u32', (seq * 1000) >>> 0, 1, stream);
          requests.publish(slot, { stream, meta: { seq } });
        }
        await requests.end();
      })();
      let seen = 0;
      let wrong = 0;
      for await (const msg of answers) {
        const { seq } = msg.meta as { seq: number };
        assert.equal(seq, seen, 'answers come in order');
        msg.waitOn(checkStream);
        const r = await kernels.verifyPattern(msg.buffer as DeviceBuffer, 'u32', (seq * 3000 + 7) >>> 0, 3, checkStream);
        if (r.mismatches !== 0n) wrong++;
        kernels.spin(200_000n, checkStream);  // hold the slot: an unordered Python write would land early
        msg.release({ stream: checkStream });
        seen++;
      }
      await sending;
      answers.close();
      const done = await reply(py.link);
      assert.deepEqual(done, { count: n, checked: 3 });
      assert.equal(seen, n);
      assert.equal(wrong, 0, 'every answer holds 3x+7 of its request');
      t.diagnostic(`${n} request/answer pairs of ${(4 * elements) / 1048576} MiB through a PyTorch consumer in ${(performance.now() - t0).toFixed(0)} ms`);
      await checkStream.synchronize();
    } finally {
      if (py.child.exitCode === null) await once(py.child, 'exit');
      py.link.close();
    }
  });

  test('the Python example (npm run example:python) runs and prints OK', { timeout: 300_000 }, () => {
    const script = fileURLToPath(new URL('../../examples/python/server.js', import.meta.url));
    const r = spawnSync(process.execPath, [script, '--workers', '2', '--requests', '128'], { encoding: 'utf8', timeout: 280_000 });
    const out = `${r.stdout}\n${r.stderr}`;
    assert.equal(r.status, 0, out);
    assert.match(r.stdout, /^example:python: OK$/m, out);
  });
});
