// Stage 1: fills each slot with seq*1000 + i and publishes it.
import { pipelineStage, Stream, BuiltinKernels, type DeviceBuffer } from '../../src/index.js';
import { u32 } from '../common.js';

const { output } = await pipelineStage();
const [messages, elements] = [Number(process.argv[2]), Number(process.argv[3])];
const ch = output!;
const stream = ch.device ? Stream.create(ch.device) : undefined;
const kernels = ch.device ? BuiltinKernels.for(ch.device) : undefined;
for (let seq = 0; seq < messages; seq++) {
  // With a stream, the wait for the consumers' release fences is queued on it (no CPU wait).
  const slot = await ch.acquire({ stream });
  if (kernels) {
    kernels.fillPattern(slot.buffer as DeviceBuffer, 'u32', seq * 1000, 1, stream);
  } else {
    const a = u32(slot.bytes);
    for (let i = 0; i < elements; i++) a[i] = seq * 1000 + i;
  }
  // Writes the slot's publish fence on the stream: the next stage's GPU work waits for it.
  ch.publish(slot, { stream, meta: { seq } });
}
await ch.end();
console.log(`produce (pid ${process.pid}): ${messages} messages`);
stream?.close();
