// `cuda-ipc produce --out FILE`: allocate, fill a known pattern, write the descriptor, wait for a
// consumer to double the values, verify them.
import { parseArgs } from 'node:util';
import { rmSync } from 'node:fs';
import { Device } from '../cuda/device.js';
import { DeviceArray } from '../ipc/array.js';
import { descriptorToJson } from '../ipc/descriptor.js';
import { writeFileAtomic, waitForFile, parseSeconds, parseCount, parseOrdinal } from './files.js';
import { fillPattern, findMismatch, firstFive } from './pattern.js';

export async function produce(argv: string[]): Promise<number> {
  const { values } = parseArgs({
    args: argv,
    options: { out: { type: 'string' }, elements: { type: 'string' }, device: { type: 'string' }, timeout: { type: 'string' } },
  });
  if (!values.out) {
    console.error('cuda-ipc produce: --out FILE is required (where to write the descriptor)');
    return 2;
  }
  const out = values.out;
  const doneFile = `${out}.done`;
  const n = parseCount(values.elements, 1 << 20, '--elements');
  const timeoutMs = parseSeconds(values.timeout, 600, '--timeout');
  const device = Device.get(parseOrdinal(values.device, '--device'));

  rmSync(doneFile, { force: true });
  using array = DeviceArray.allocate('float32', [n], { device });
  const host = new Float32Array(n);
  fillPattern(host);
  array.write(host);
  const cleanup = () => { rmSync(out, { force: true }); rmSync(doneFile, { force: true }); };
  process.once('SIGINT', () => { cleanup(); process.exit(130); });

  writeFileAtomic(out, JSON.stringify(descriptorToJson(array.ipcHandle()), null, 2) + '\n');
  console.log(`producer ${process.pid}: ${n} float32 on device ${device.ordinal} (${device.name}): ${firstFive(host)}, ...`);
  console.log(`descriptor written to ${out}; waiting for a consumer: cuda-ipc consume ${out}`);

  try {
    const ack = JSON.parse(await waitForFile(doneFile, timeoutMs, `no consumer finished; run \`cuda-ipc consume ${out}\``)) as { ok: boolean; pid: number; message?: string };
    if (!ack.ok) {
      console.error(`producer: consumer ${ack.pid} reported a failure: ${ack.message}`);
      return 1;
    }
    const back = array.read() as Float32Array;
    const bad = findMismatch(back, 2);
    if (bad >= 0) {
      console.error(`producer: element ${bad} is ${back[bad]}, expected ${host[bad]! * 2}: the consumer's writes did not arrive`);
      return 1;
    }
    console.log(`producer: consumer ${ack.pid} doubled every value: ${firstFive(back)}, ... OK`);
    return 0;
  } finally {
    cleanup();
  }
}
