// `cuda-ipc consume FILE`: open the producer's descriptor, verify every element, double them in
// place, close, and signal the producer. What FILE describes decides the path: GPU memory (a
// legacy IPC handle; needs a GPU here) or host shared memory behind a link (host-handoff.ts).
import { existsSync } from 'node:fs';
import { IpcError } from '../errors.js';
import { openIpcArray } from '../arrays/device-array.js';
import { parseDescriptorJson } from '../ipc/descriptor.js';
import { Deadline, writeFileAtomic, waitForFile, checkFileArgument } from './files.js';
import { secondsOption, UsageError, type ParsedArgs } from './args.js';
import { isUrl } from '../link/transport/link-url.js';
import { deviceChoice, whyNoGpu } from './availability.js';
import { findMismatch, firstFive } from './pattern.js';
import { consumeOnHost, isHostDescriptor } from './host-handoff.js';
import { processGone } from '../processes.js';

export async function consume(args: ParsedArgs): Promise<number> {
  const file = args.positionals[0]!; // required by the parser
  // Any SCHEME:// is a URL, never a file: consumeOverTcp refuses one that is not tcp://HOST:PORT.
  if (isUrl(file)) return (await import('./tcp-handoff.js')).consumeOverTcp(args, file);
  if (args.values['token-file'] !== undefined) throw new UsageError('--token-file goes with a tcp://HOST:PORT producer; FILE is shared on this machine');
  if (args.values.device !== undefined) throw new UsageError('--device goes with a tcp://HOST:PORT producer; FILE names the device its memory is on');
  const deadline = new Deadline(secondsOption(args, 'timeout', 60));
  checkFileArgument(file, 'FILE', `cuda-ipc consume ${file.replace(/\/+$/, '')}/handle.json`, { writes: true });
  // A new file: a FILE.done already there (anyone's) is never written over (ERR_FILE_UNSAFE).
  const ack = (ok: boolean, message?: string) => writeFileAtomic(`${file}.done`, JSON.stringify({ ok, pid: process.pid, message }) + '\n', { what: 'the report' });

  if (!existsSync(file)) console.log(`consume: waiting up to ${deadline.ms / 1000} s for ${file} (start \`cuda-ipc produce --out ${file}\` in another terminal)`);
  // The user named FILE: a symlink there is followed, but only to a regular file of a descriptor's size.
  const { text } = await waitForFile(file, deadline, `start the producer first (cuda-ipc produce --out ${file}), or raise --timeout`, {
    followSymlinks: true,
    what: 'the descriptor',
  });
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch {
    throw new IpcError('ERR_DESCRIPTOR_INVALID', `${file} is not JSON; give the file that \`cuda-ipc produce --out FILE\` writes`);
  }
  if (isHostDescriptor(parsed)) return consumeOnHost(parsed, file, deadline);
  let desc;
  try {
    desc = parseDescriptorJson(parsed, 'cuda-legacy-handle');
  } catch (e) {
    const err = e as IpcError;
    throw new IpcError(err.code ?? 'ERR_DESCRIPTOR_INVALID', `${file} is not a descriptor that \`cuda-ipc produce\` writes: ${err.message}`, { cause: e });
  }
  // Memory shared by a legacy handle dies with its process: a descriptor whose producer no longer
  // runs (killed: it could not remove FILE) describes nothing, and no wait will change that.
  if (processGone(desc.pid)) {
    // No report: nobody waits for one, and it would be a file left behind.
    throw new IpcError('ERR_HANDLE_STALE', `${file} describes memory of process ${desc.pid}, which no longer runs: the memory went with it (a killed producer leaves its descriptor behind); remove ${file} and start \`cuda-ipc produce --out ${file}\` again`);
  }
  const why = whyNoGpu(0);
  if (why !== undefined) {
    const message = `${file} describes GPU memory (device ${desc.deviceUuid}), and this process has no usable GPU: ${why}`;
    ack(false, message);  // the producer stops waiting
    throw new IpcError('ERR_UNSUPPORTED', message);
  }
  // CUDA_IPC_DEVICE, where set, is the device the library maps the memory for: checked as the
  // CLI checks it (an ordinal becomes the UUID the library reads).
  deviceChoice(args);
  let ok = false;
  try {
    using array = openIpcArray(desc);
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
