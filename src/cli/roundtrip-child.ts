// The child of `cuda-ipc roundtrip`: receives the buffer, verifies 100, 101, ..., writes
// 0, -1, -2, ..., releases its mapping and reports.
import { parentLink } from '../link/index.js';
import { DeviceBuffer } from '../cuda/buffer.js';
import { Stream } from '../cuda/stream.js';
import { HostBuffer } from '../host/index.js';
import { devicePatternMemory, hostPatternMemory, type PatternMemory } from './roundtrip-memory.js';

const link = parentLink();
const { buffer, elements } = (await link.receive()) as { buffer: DeviceBuffer | HostBuffer; elements: number };
let stream: Stream | undefined;
let mine: PatternMemory;
if (buffer instanceof DeviceBuffer) {
  stream = Stream.create(buffer.device);
  mine = devicePatternMemory(buffer, stream);
  console.log(`child ${process.pid}: isMapped ${buffer.isMapped}, ${buffer.byteLength} bytes (${elements} int32)`);
} else {
  mine = hostPatternMemory(buffer);
  console.log(`child ${process.pid}: host shared memory mapped from an fd, ${buffer.byteLength} bytes (${elements} int32)`);
}
let report: { ok: boolean; message?: string };
try {
  console.log(`child ${process.pid}: received ${mine.firstFive().join(', ')}, ...`);
  const bad = await mine.mismatches(100, 1);
  if (bad !== 0) {
    report = { ok: false, message: `${bad} of ${elements} elements were not 100, 101, ...` };
  } else {
    await mine.fill(0, -1);
    console.log(`child ${process.pid}: verified, wrote ${mine.firstFive().join(', ')}, ...`);
    report = { ok: true };
  }
} catch (e) {
  report = { ok: false, message: (e as Error).message };
} finally {
  // Release the mapping before the parent learns we are done, so it never frees memory in use.
  buffer.close();
  stream?.close();
}
link.send(report);
await link.end();
