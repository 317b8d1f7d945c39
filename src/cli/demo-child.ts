// The child of `cuda-ipc demo events|transform`.
import { parentLink } from '../link/index.js';
import { Stream } from '../cuda/stream.js';
import { Event } from '../cuda/event.js';
import { DeviceBuffer } from '../cuda/buffer.js';
import { BuiltinKernels } from '../cuda/builtins.js';

const link = parentLink();
const mode = process.argv[2];
const msg = (await link.receive()) as { event?: Event; buffer?: DeviceBuffer };

if (mode === 'events') {
  const event = msg.event!;
  const pendingAtStart = !event.query();
  const t0 = performance.now();
  await event.synchronize();
  const waitedMs = performance.now() - t0;
  console.log(`child ${process.pid}: waited ${waitedMs.toFixed(0)} ms on the parent's interprocess event`);
  event.close();
  link.send({ waitedMs, pendingAtStart });
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
