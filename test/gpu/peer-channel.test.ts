// A device-slot channel between processes on different GPUs: the producer's slots live on its
// GPU, the consumer (spawned with { device }) checksums every message with a kernel on its own.
// On one GPU, the same run with both ends on GPU 0; the two-GPU run skips with the reason.
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { once } from 'node:events';
import { noGpu } from '../helpers/gpu.js';
import { noPeerPair } from '../helpers/peer.js';
import { Device } from '../../src/cuda/device.js';
import { Stream } from '../../src/cuda/stream.js';
import { BuiltinKernels } from '../../src/cuda/builtins.js';
import { referenceChecksum } from '../../src/cuda/builtin-kernels.js';
import type { DeviceBuffer } from '../../src/cuda/buffer.js';
import { spawn } from '../../src/link/index.js';
import { createChannel } from '../../src/channel/index.js';

const CHILD = new URL('../fixtures/peer-channel-child.js', import.meta.url);

/** `messages` checksummed messages from a producer here on `from` to a consumer working on `to`. */
async function channelAcross(from: Device, to: Device, messages: number): Promise<void> {
  const { child, link } = await spawn(CHILD, [], { device: to, stdio: 'inherit' });
  const exited = once(child, 'exit');
  try {
    using stream = Stream.create(from);
    const kernels = BuiltinKernels.for(from);
    const slotBytes = 16 << 10;
    const host = new Uint32Array(slotBytes / 4);
    const ch = await createChannel(link, { role: 'producer', slots: 8, slotBytes, memory: { device: from } });
    for (let seq = 0; seq < messages; seq++) {
      // A different pattern per message: a stale or misplaced slot shows in the checksum.
      const a = Math.imul(seq, 2654435761) >>> 0;
      const b = (2 * seq + 1) >>> 0;
      for (let i = 0; i < host.length; i++) host[i] = (a + Math.imul(i, b)) >>> 0;
      const sums = referenceChecksum(new Uint8Array(host.buffer));
      const slot = await ch.acquire({ stream });
      kernels.fillPattern(slot.buffer as DeviceBuffer, 'u32', a, b, stream);
      ch.publish(slot, { stream, meta: { seq, byteSum: String(sums.byteSum), weightedSum: String(sums.weightedSum) } });
    }
    await ch.end();
    const r = await link.receive({ signal: AbortSignal.timeout(120_000) });
    assert.deepEqual(r, { count: messages, bad: 0, outOfOrder: 0, device: to.uuid, resident: from.uuid });
    await stream.synchronize();
  } finally {
    await exited;
  }
}

describe('a device-slot channel, both ends on GPU 0 (the one-GPU run of the peer channel)', { skip: noGpu }, () => {
  test('2,000 checksummed messages to a consumer spawned with { device: GPU 0 }', async () => {
    const d0 = Device.get(0);
    await channelAcross(d0, d0, 2000);
  });
});

describe('a device-slot channel from GPU 0 to a consumer on GPU 1', { skip: noPeerPair }, () => {
  test('10,000 checksummed messages: slots on GPU 0, checksum kernels on GPU 1, none lost, none corrupt, in order', async () => {
    await channelAcross(Device.get(0), Device.get(1), 10_000);
  });

  test('the other way: 2,000 messages from GPU 1 to a consumer on GPU 0', async () => {
    await channelAcross(Device.get(1), Device.get(0), 2000);
  });
});
