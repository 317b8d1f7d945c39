// A pipeline of three processes chained by channels:
//   produce   fills each slot with u32 values seq*1000 + i (a kernel on the GPU)
//   transform multiplies every value by 3 into its output slot (a copy and a kernel)
//   checksum  sums the bytes of each message (a kernel) and compares with the expected sum
// On a GPU the slots are device memory from IPC pools and nothing is copied between processes:
// each stage's GPU work waits for the previous stage's through per-slot fence words in the
// channel's control block, with no CPU synchronisation in between. Without a GPU (or with --host) the same runs on host shared memory.
//
//   node dist/examples/pipeline/main.js [--messages 64] [--elements 262144] [--slots 4] [--host]
import { pipeline } from '../../src/index.js';
import { pickDevice, flag } from '../common.js';

const device = pickDevice();
const messages = flag('messages', 64);
const elements = flag('elements', 1 << 18);
const slots = flag('slots', 4);
const here = (f: string) => new URL(f, import.meta.url);

console.log(`pipeline: ${messages} messages of ${elements} u32 (${(elements * 4 / 1048576).toFixed(2)} MiB) through 3 processes, ` +
  `${device ? `device memory on ${device.name}` : 'host shared memory (no GPU, or --host)'}`);
const t0 = performance.now();
const p = await pipeline([here('./produce.js'), here('./transform.js'), here('./checksum.js')], {
  slots,
  slotBytes: elements * 4,
  memory: device ? { device } : 'host',
  args: [[String(messages), String(elements)], [String(elements)], [String(messages), String(elements)]],
  spawn: { stdio: 'inherit' },
});
const result = (await p.stages[2]!.link.receive()) as { messages: number; mismatches: number; bytes: number };
await p.done();
const s = (performance.now() - t0) / 1000;
console.log(`pipeline: ${result.messages} messages checked, ${result.mismatches} wrong, ` +
  `${(result.bytes / 1048576).toFixed(0)} MiB through each stage in ${s.toFixed(2)} s`);
if (result.messages !== messages || result.mismatches !== 0) {
  console.log('pipeline: FAILED');
  process.exit(1);
}
console.log('pipeline: OK');
