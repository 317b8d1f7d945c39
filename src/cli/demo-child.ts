// The child of `cuda-ipc demo events|transform|tensors` (on device memory, or on host shared
// memory where the parent has no GPU).
import { parentLink } from '../link/index.js';
import { Stream } from '../cuda/stream.js';
import { Event } from '../cuda/event.js';
import { DeviceBuffer } from '../cuda/buffer.js';
import { BuiltinKernels } from '../cuda/builtins.js';
import { HostBuffer } from '../host/index.js';

const link = parentLink();
const mode = process.argv[2];

if (mode === 'tensors') {
  // Keep everything first, read later: the producer has dropped its references by then.
  const received: Array<{ index: number; tensor: DeviceBuffer | HostBuffer }> = [];
  for (;;) {
    const m = (await link.receive()) as { index?: number; tensor?: DeviceBuffer | HostBuffer; done?: boolean };
    if (m.done) break;
    received.push({ index: m.index!, tensor: m.tensor! });
  }
  await new Promise((r) => setTimeout(r, 200));
  const bad: number[] = [];
  for (const { index, tensor } of received) {
    const values = new Float32Array(tensor.byteLength / 4);
    if (tensor instanceof HostBuffer) tensor.read(values);
    else tensor.read(values);
    const ok = values.every((v) => v === index + 1);
    if (!ok) bad.push(index);
    console.log(`consumer ${process.pid}: tensor ${index}: [${Array.from(values.subarray(0, 5)).join(', ')}, ...] ${ok ? 'OK' : 'WRONG'}`);
    tensor.close();
  }
  link.send({ ok: bad.length === 0, bad });
  await link.end();
  process.exit(0);
}

const msg = (await link.receive()) as { event?: Event; buffer?: DeviceBuffer | HostBuffer };

if (mode === 'events') {
  const event = msg.event!;
  const pendingAtStart = !event.query();
  const t0 = performance.now();
  await event.synchronize();
  const waitedMs = performance.now() - t0;
  console.log(`child ${process.pid}: waited ${waitedMs.toFixed(0)} ms on the parent's interprocess event`);
  event.close();
  link.send({ waitedMs, pendingAtStart });
} else if (msg.buffer instanceof HostBuffer) {
  const buffer = msg.buffer;
  const values = new Float32Array(buffer.bytes.buffer, buffer.bytes.byteOffset, Math.floor(buffer.byteLength / 4));
  for (let i = 0; i < values.length; i++) values[i]! *= 2;
  console.log(`child ${process.pid}: doubled ${values.length} values in place in the parent's host shared memory`);
  buffer.close();
  link.send({ ok: true });
} else {
  const buffer = msg.buffer!;
  try {
    using stream = Stream.create(buffer.device);
    BuiltinKernels.for(buffer.device).scale(buffer, 'f32', 2, stream);
    await stream.synchronize();
    console.log(`child ${process.pid}: doubled ${buffer.byteLength / 4} values in place with a kernel on the shared memory`);
    buffer.close();
    link.send({ ok: true });
  } catch (e) {
    buffer.close();
    link.send({ ok: false, message: (e as Error).message });
  }
}
await link.end();
