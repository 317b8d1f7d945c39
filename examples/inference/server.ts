// An inference-style server. This process loads the "weights" onto the GPU once, in an IPC pool;
// N worker processes map them through the pool (no copy), take requests from a work-sharing
// channel and answer through a second channel whose slots are device memory. The server checks
// every answer with a kernel that reads the response slot where the worker's kernel wrote it.
//
//   requests:  host shared memory, server -> workers (each request to one worker)
//   responses: device memory (host without a GPU), workers -> server (many producers, one consumer)
//   answer = weights * k, where k comes in the request; weights[i] = 1000 + i
//
//   node dist/examples/inference/server.js [--workers 3] [--requests 300] [--elements 1048576] [--host]
import {
  ChannelHub, HostBuffer, Stream, BuiltinKernels, spawn, type DeviceBuffer, type SpawnedChild,
} from '../../src/index.js';
import { pickDevice, flag, u32 } from '../common.js';

const device = pickDevice();
const workers = flag('workers', 3);
const requests = flag('requests', 300);
const elements = flag('elements', 1 << 20);
const bytes = elements * 4;
console.log(`inference: ${workers} workers, ${requests} requests, weights of ${(bytes / 1048576).toFixed(1)} MiB ` +
  `${device ? `on ${device.name}` : 'in host shared memory (no GPU, or --host)'}`);

// 1. Load the weights once.
const pool = device?.createIpcPool();
let weights: DeviceBuffer | HostBuffer;
const stream = device ? Stream.create(device) : undefined;
const kernels = device ? BuiltinKernels.for(device) : undefined;
if (pool && kernels) {
  weights = pool.allocate(bytes);
  kernels.fillPattern(weights, 'u32', 1000, 1, stream);
  await stream!.synchronize();
} else {
  weights = HostBuffer.allocate(bytes);
  const w = u32(weights.bytes);
  for (let i = 0; i < elements; i++) w[i] = 1000 + i;
}

// 2. The two channels; this process creates (and watches) both, with one end of each here.
const requestHub = ChannelHub.create({ slots: 2 * workers, slotBytes: 64, consumers: workers, maxPeers: workers + 1 });
const responseHub = ChannelHub.create({
  slots: 2 * workers, slotBytes: bytes, producers: workers, maxPeers: workers + 1,
  memory: pool ? { pool } : 'host',
});
const requestCh = requestHub.producer();
const responseCh = responseHub.consumer();

// 3. Start the workers: each gets the weights once (the pool's fd, then 64 bytes), then its ends.
const kids: SpawnedChild[] = [];
for (let i = 0; i < workers; i++) {
  const kid = await spawn(new URL('./worker.js', import.meta.url), [], { stdio: 'inherit' });
  kid.link.send({ weights, elements });
  await requestHub.attach(kid.link, { role: 'consumer' });
  await responseHub.attach(kid.link, { role: 'producer' });
  kids.push(kid);
}
weights.close();  // the workers hold it now; it stays alive while they map it

// 4. Send requests while collecting answers.
const t0 = performance.now();
const sending = (async () => {
  for (let id = 0; id < requests; id++) {
    const slot = await requestCh.acquire();
    const req = u32(slot.bytes);
    req[0] = id;
    req[1] = 2 + (id % 7);  // k
    requestCh.publish(slot, { length: 8 });
  }
  await requestCh.end();  // resolves once every request was taken and released
})();
const perWorker = new Map<number, number>();
const latest = new Set<number>();
let wrong = 0;
for await (const msg of responseCh) {
  const { id, k, worker } = msg.meta as { id: number; k: number; worker: number };
  if (kernels && stream) {
    msg.waitOn(stream);  // the worker's kernel, ordered on the GPU
    const r = await kernels.verifyPattern(msg.buffer as DeviceBuffer, 'u32', Math.imul(1000, k) >>> 0, k, stream);
    if (r.mismatches !== 0n) wrong++;
  } else {
    const a = u32(msg.bytes);
    for (let i = 0; i < elements; i += 4099) if (a[i] !== Math.imul(1000 + i, k) >>> 0) { wrong++; break; }
  }
  msg.release({ stream });
  latest.add(id);
  perWorker.set(worker, (perWorker.get(worker) ?? 0) + 1);
}
await sending;
const s = (performance.now() - t0) / 1000;
responseHub.close();
requestHub.close();
for (const kid of kids) if (kid.child.exitCode === null) await new Promise((r) => kid.child.once('exit', r));
stream?.close();
pool?.close();
console.log(`inference: ${latest.size} answers in ${s.toFixed(2)} s (${Math.round(latest.size / s)} requests/s); ` +
  `per worker: ${[...perWorker.values()].join(', ')}; ${wrong} wrong`);
if (latest.size !== requests || wrong !== 0) {
  console.log('inference: FAILED');
  process.exit(1);
}
console.log('inference: OK');
