// Stage 2: out = 3 * in, into a slot of the next channel.
import { pipelineStage, Stream, BuiltinKernels, type DeviceBuffer } from '../../src/index.js';
import { u32 } from '../common.js';

const { input, output } = await pipelineStage();
const elements = Number(process.argv[2]);
const device = output!.device;
const stream = device ? Stream.create(device) : undefined;
const kernels = device ? BuiltinKernels.for(device) : undefined;
let n = 0;
for await (const msg of input!) {
  const out = await output!.acquire({ stream });
  if (kernels && stream) {
    msg.waitOn(stream);  // GPU-side wait for the producer's kernel
    (out.buffer as DeviceBuffer).copyFrom(msg.buffer as DeviceBuffer, { stream });
    kernels.scale(out.buffer as DeviceBuffer, 'u32', 3, stream);
  } else {
    const a = u32(msg.bytes);
    const b = u32(out.bytes);
    for (let i = 0; i < elements; i++) b[i] = Math.imul(a[i]!, 3) >>> 0;
  }
  output!.publish(out, { stream, meta: msg.meta });
  msg.release({ stream });  // the producer's next write into this slot waits for our copy
  n++;
}
await output!.end();
input!.close();
console.log(`transform (pid ${process.pid}): ${n} messages`);
stream?.close();
