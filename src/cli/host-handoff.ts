// The two-terminal example on host shared memory, where there is no usable GPU: the producer
// listens on a link and writes the link's name to FILE; the consumer connects, receives the
// memory (a memfd, passed over the link: nothing is copied), verifies and doubles it in place,
// closes its mapping and says so; the producer verifies in its own memory.
import { rmSync } from 'node:fs';
import { IpcError } from '../errors.js';
import { HostBuffer } from '../host/index.js';
import { connect, listen, type Link, type Listener } from '../link/index.js';
import { writeFileAtomic } from './files.js';
import { fillPattern, findMismatch, firstFive, patternValue } from './pattern.js';

/** What `produce` writes to FILE when it shares host memory. */
export interface HostDescriptor {
  memory: 'host';
  /** The name the producer listens on (`cuda-ipc consume` connects to it). */
  link: string;
  dtype: 'float32';
  shape: [number];
  pid: number;
}

interface Handoff {
  buffer: HostBuffer;
  elements: number;
}
interface Ack {
  ok: boolean;
  message?: string;
}

export function isHostDescriptor(value: unknown): value is HostDescriptor {
  const d = value as Partial<HostDescriptor> | null;
  return typeof d === 'object' && d !== null && d.memory === 'host' && typeof d.link === 'string';
}

const floats = (b: HostBuffer) => new Float32Array(b.bytes.buffer, b.bytes.byteOffset, Math.floor(b.byteLength / 4));

function acceptWithin(listener: Listener, ms: number, hint: string): Promise<Link> {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new IpcError('ERR_TIMEOUT', `no consumer connected within ${ms / 1000} s: ${hint}`)), ms);
    listener.accept().then(
      (link) => { clearTimeout(timer); resolve(link); },
      (e: unknown) => { clearTimeout(timer); reject(e); },
    );
  });
}

export async function produceOnHost(out: string, n: number, timeoutMs: number): Promise<number> {
  using buffer = HostBuffer.allocate(n * 4);
  const values = floats(buffer);
  fillPattern(values);
  const name = `cuda-ipc-produce-${process.pid}`;
  const listener = listen(name);
  const cleanup = () => { listener.close(); rmSync(out, { force: true }); };
  process.once('SIGINT', () => { cleanup(); process.exit(130); });
  try {
    const descriptor: HostDescriptor = { memory: 'host', link: name, dtype: 'float32', shape: [n], pid: process.pid };
    writeFileAtomic(out, JSON.stringify(descriptor, null, 2) + '\n');
    console.log(`producer ${process.pid}: ${n} float32 in host shared memory (memfd): ${firstFive(values)}, ...`);
    console.log(`descriptor written to ${out}; waiting for a consumer: cuda-ipc consume ${out}`);
    const link = (await acceptWithin(listener, timeoutMs, `run \`cuda-ipc consume ${out}\``)) as Link<Ack, Handoff>;
    try {
      link.send({ buffer, elements: n });
      const ack = await link.receive();
      if (!ack.ok) {
        console.error(`producer: consumer ${link.peer.pid} reported a failure: ${ack.message}`);
        return 1;
      }
      const bad = findMismatch(values, 2);
      if (bad >= 0) {
        console.error(`producer: element ${bad} is ${values[bad]}, expected ${patternValue(bad) * 2}: the consumer's writes did not arrive`);
        return 1;
      }
      console.log(`producer: consumer ${link.peer.pid} doubled every value: ${firstFive(values)}, ... OK`);
      return 0;
    } finally {
      link.close();
    }
  } finally {
    cleanup();
  }
}

export async function consumeOnHost(d: HostDescriptor, file: string): Promise<number> {
  console.log(`consumer ${process.pid}: ${file} describes host shared memory of process ${d.pid}; connecting to its link '${d.link}'`);
  const link = await connect<Handoff, Ack>(d.link);
  try {
    const { buffer } = await link.receive();
    let ack: Ack;
    try {
      const values = floats(buffer);
      console.log(`consumer ${process.pid}: mapped ${values.length} float32: ${firstFive(values)}, ...`);
      const bad = findMismatch(values);
      if (bad >= 0) throw new Error(`element ${bad} is ${values[bad]}, which is not the producer's pattern`);
      for (let i = 0; i < values.length; i++) values[i]! *= 2;
      console.log(`consumer: verified every element and doubled them: ${firstFive(values)}, ...`);
      ack = { ok: true };
    } catch (e) {
      ack = { ok: false, message: (e as Error).message };
    } finally {
      buffer.close(); // release the mapping before the producer learns we are done
    }
    link.send(ack);
    await link.end();
    if (!ack.ok) throw new Error(ack.message);
    return 0;
  } finally {
    link.close();
  }
}
