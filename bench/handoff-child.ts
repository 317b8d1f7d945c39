// Child of the handoff benchmark: for each buffer received (a pool buffer, a legacy-handle
// buffer or a host buffer), read one value, release it, ack with the value.
import { parentLink } from '../src/link/index.js';
import { DeviceBuffer } from '../src/cuda/buffer.js';
import { HostBuffer } from '../src/host/index.js';

const link = parentLink();
const one = new Uint32Array(1);
link.on('message', (m: unknown) => {
  if (m === 'end') {
    void link.end();
    return;
  }
  let value: number;
  if (m instanceof DeviceBuffer) {
    m.read(one);
    value = one[0]!;
    m.close();
  } else if (m instanceof HostBuffer) {
    value = new Uint32Array(m.bytes.buffer, m.bytes.byteOffset, 1)[0]!;
    m.close();
  } else if (typeof m === 'number') {
    value = m; // the bare link round trip
  } else {
    throw new Error(`unexpected message ${String(m)}`);
  }
  link.send(value);
});
