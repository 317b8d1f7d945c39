// `cuda-ipc consume FILE`: open the producer's descriptor, verify every element, double them in
// place, close, and signal the producer.
import { openIpcArray } from '../ipc/array.js';
import { writeFileAtomic, waitForFile, checkFileArgument } from './files.js';
import { secondsOption, type ParsedArgs } from './args.js';
import { whyNoGpu } from './availability.js';
import { findMismatch, firstFive } from './pattern.js';

export async function consume(args: ParsedArgs): Promise<number> {
  const file = args.positionals[0]!; // required by the parser
  const timeoutMs = secondsOption(args, 'timeout', 60);
  checkFileArgument(file, 'FILE', `cuda-ipc consume ${file.replace(/\/+$/, '')}/handle.json`, { writes: true });
  const why = whyNoGpu(0);
  if (why !== undefined) {
    console.log(`consume: skipped, no usable GPU here: ${why}`);
    return 0;
  }
  const ack = (ok: boolean, message?: string) => writeFileAtomic(`${file}.done`, JSON.stringify({ ok, pid: process.pid, message }) + '\n');

  const text = await waitForFile(file, timeoutMs, `start the producer first (cuda-ipc produce --out ${file}), or raise --timeout`);
  let ok = false;
  try {
    using array = openIpcArray(text);
    if (array.dtype !== 'float32' || array.shape.length !== 1) {
      throw new Error(`expected a 1-d float32 array from cuda-ipc produce, got ${array.dtype} [${array.shape}]`);
    }
    const values = array.read() as Float32Array;
    console.log(`consumer ${process.pid}: opened ${values.length} float32: ${firstFive(values)}, ...`);
    const bad = findMismatch(values);
    if (bad >= 0) throw new Error(`element ${bad} is ${values[bad]}, which is not the producer's pattern`);
    for (let i = 0; i < values.length; i++) values[i]! *= 2;
    array.write(values);
    console.log(`consumer: verified every element and doubled them: ${firstFive(values)}, ...`);
    ok = true;
  } catch (e) {
    ack(false, (e as Error).message);
    throw e;
  }
  ack(ok);
  return 0;
}
