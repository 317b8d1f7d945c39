// Child of the handoff benchmark: for each buffer received (a pool buffer, a legacy-handle
// buffer or a host buffer), read one value, release it, ack with the value. For --breakdown it
// also records where its time goes (breakdown.ts) and sends the log back on request.
import { parentLink } from '../src/link/index.js';
import { DeviceBuffer } from '../src/cuda/buffer.js';
import { HostBuffer } from '../src/host/index.js';
import { Mark, Recorder } from './breakdown.js';

const link = parentLink();
const one = new Uint32Array(1);
let recorder: Recorder | undefined;
let log: Float64Array | undefined;
// Most doubles per reply: a link frame holds 128 KiB.
const CHUNK = 8192;

link.on('message', (m: unknown) => {
  const mark = recorder?.mark;
  mark?.(Mark.HandlerIn);
  let value: unknown;
  if (m instanceof DeviceBuffer) {
    m.read(one);
    mark?.(Mark.ReadDone);
    value = one[0]!;
    m.close();
  } else if (m instanceof HostBuffer) {
    m.read(one); // as for device buffers: a copy of one value (no view of the whole buffer made)
    mark?.(Mark.ReadDone);
    value = one[0]!;
    m.close();
  } else if (typeof m === 'number') {
    value = m; // the bare link round trip
    mark?.(Mark.ReadDone);
  } else if (m === 'end') {
    void link.end();
    return;
  } else if (m === 'record') {
    link.send('recording');
    recorder = new Recorder();
    recorder.install(); // after the reply, so that the log starts with the first handoff
    return;
  } else if (typeof m === 'object' && m !== null && 'log' in m) {
    // { log: offset }: stop recording, send the log from `offset` on (empty when done).
    if (recorder) {
      recorder.uninstall();
      log = recorder.monotonic();
      recorder = undefined;
    }
    const from = (m as { log: number }).log;
    link.send(log!.slice(from, from + CHUNK));
    return;
  } else {
    throw new Error(`unexpected message ${String(m)}`);
  }
  mark?.(Mark.ClosedDone);
  link.send(value);
});
