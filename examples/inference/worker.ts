// A worker of the inference example: maps the weights once, then answers requests.
import {
  parentLink, acceptChannel, Stream, BuiltinKernels, DeviceBuffer, type HostBuffer,
} from '../../src/index.js';
import { u32 } from '../common.js';

const link = parentLink();
const { weights, elements } = (await link.receive()) as { weights: DeviceBuffer | HostBuffer; elements: number };
const requests = await acceptChannel(link, { role: 'consumer' });
const responses = await acceptChannel(link, { role: 'producer' });
const onGpu = weights instanceof DeviceBuffer;
const stream = onGpu ? Stream.create(weights.device) : undefined;
const kernels = onGpu ? BuiltinKernels.for(weights.device) : undefined;
let served = 0;
for await (const req of requests) {
  const [id, k] = u32(req.bytes);
  req.release();  // the request was read; its slot can take the next one
  const out = await responses.acquire({ stream });
  if (kernels && stream) {
    (out.buffer as DeviceBuffer).copyFrom(weights as DeviceBuffer, { stream });  // reads the weights through the pool
    kernels.scale(out.buffer as DeviceBuffer, 'u32', k!, stream);
  } else {
    const w = u32((weights as HostBuffer).bytes);
    const o = u32(out.bytes);
    for (let i = 0; i < elements; i++) o[i] = Math.imul(w[i]!, k!) >>> 0;
  }
  responses.publish(out, { stream, meta: { id, k, worker: process.pid } });
  served++;
}
await responses.end();
weights.close();
stream?.close();
await link.end();
