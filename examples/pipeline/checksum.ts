// Stage 3: sums the bytes of each message and compares with what 3 * (seq*1000 + i) gives.
import { pipelineStage, Stream, BuiltinKernels, type DeviceBuffer } from '../../src/index.js';
import { byteSumOf } from '../common.js';

const { input, link } = await pipelineStage();
const [messages, elements] = [Number(process.argv[2]), Number(process.argv[3])];
const ch = input!;
const stream = ch.device ? Stream.create(ch.device) : undefined;
const kernels = ch.device ? BuiltinKernels.for(ch.device) : undefined;
let count = 0;
let mismatches = 0;
let bytes = 0;
for await (const msg of ch) {
  const { seq } = msg.meta as { seq: number };
  let sum: number;
  if (kernels && stream) {
    msg.waitOn(stream);
    sum = Number((await kernels.checksum(msg.buffer as DeviceBuffer, stream)).byteSum);
  } else {
    sum = 0;
    const b = msg.bytes;
    for (let i = 0; i < b.length; i++) sum += b[i]!;
  }
  const expected = byteSumOf(elements, (i) => Math.imul(seq * 1000 + i, 3));
  if (sum !== expected) {
    mismatches++;
    console.error(`checksum: message ${seq}: byte sum ${sum}, expected ${expected}`);
  }
  bytes += msg.length;
  msg.release({ stream });
  count++;
}
ch.close();
console.log(`checksum (pid ${process.pid}): ${count} messages`);
link.send({ messages: count, mismatches, bytes });
stream?.close();
await link.end();
