// `cuda-ipc produce --out FILE`: allocate, fill a known pattern, write the descriptor, wait for a
// consumer to double the values, verify them. Without a usable GPU it says why and shares host
// shared memory through a link instead (host-handoff.ts).
import { Device } from '../cuda/device.js';
import { DeviceArray } from '../arrays/device-array.js';
import { descriptorToJson } from '../ipc/descriptor.js';
import { Deadline, removeIfSame, writeFileAtomic, waitForFile, checkFileArgument, checkNothingThere, onSignalsRemove, type FileIdentity } from './files.js';
import { countOption, secondsOption, stringValue, UsageError, type ParsedArgs } from './args.js';
import { checkDeviceOrdinal, deviceChoice, whyNoGpu } from './availability.js';
import { fillPattern, findMismatch, firstFive } from './pattern.js';
import { produceOnHost } from './host-handoff.js';
import { terminalSafe } from './terminal-text.js';

/** The consumer's report in FILE.done: what `consume` writes, checked (it may come from anyone who can write there). */
function parseAck(text: string, path: string): { ok: boolean; pid: number; message?: string } {
  let v: { ok?: unknown; pid?: unknown; message?: unknown } | null;
  try {
    v = JSON.parse(text) as typeof v;
  } catch {
    v = null;
  }
  if (typeof v !== 'object' || v === null || typeof v.ok !== 'boolean' || !Number.isSafeInteger(v.pid) || (v.message !== undefined && typeof v.message !== 'string')) {
    return { ok: false, pid: 0, message: `${path} is not a report that \`cuda-ipc consume\` writes` };
  }
  return { ok: v.ok, pid: v.pid as number, ...(v.message !== undefined ? { message: v.message as string } : {}) };
}

export async function produce(args: ParsedArgs): Promise<number> {
  const listenAt = stringValue(args, 'listen');
  if (listenAt !== undefined) return (await import('./tcp-handoff.js')).produceOverTcp(args, listenAt);
  const out = stringValue(args, 'out');
  if (out === undefined) throw new UsageError('missing --out FILE: where to write the descriptor, e.g. --out handle.json (or --listen tcp://HOST:PORT to serve another machine)');
  if (args.values['token-file'] !== undefined) throw new UsageError('--token-file goes with --listen (a TCP link); --out shares on this machine');
  const doneFile = `${out}.done`;
  const n = countOption(args, 'elements', 1 << 20);
  const deadline = new Deadline(secondsOption(args, 'timeout', 600));
  const dev = deviceChoice(args);
  const ordinal = dev.ordinal;
  checkFileArgument(out, '--out', `--out ${out.replace(/\/+$/, '')}/handle.json`, { writes: true });
  const force = args.values.force === true;
  checkNothingThere(out, doneFile, force);
  checkDeviceOrdinal(ordinal, dev.explicit, 'share host shared memory instead', dev.option);
  const why = whyNoGpu(ordinal);
  if (why !== undefined) {
    console.log(`produce: no usable GPU here (${why}); sharing host shared memory (memfd) through a link instead`);
    return produceOnHost(out, n, deadline, force);
  }
  const device = Device.get(ordinal);

  using array = DeviceArray.allocate('float32', [n], { device });
  const host = new Float32Array(n);
  fillPattern(host);
  array.write(host);
  // Only what this process wrote (the descriptor) and read (this consumer's report) is removed.
  let written: FileIdentity | undefined;
  let report: FileIdentity | undefined;
  const cleanup = () => {
    if (written) removeIfSame(out, written);
    if (report) removeIfSame(doneFile, report);
  };
  onSignalsRemove(cleanup);

  written = writeFileAtomic(out, JSON.stringify(descriptorToJson(array.ipcHandle()), null, 2) + '\n', { replace: force ? 'own-regular-file' : 'never', what: 'the descriptor' });
  console.log(`producer ${process.pid}: ${n} float32 on device ${device.ordinal} (${device.name}): ${firstFive(host)}, ...`);
  console.log(`descriptor written to ${out}; waiting for a consumer: cuda-ipc consume ${out}`);

  try {
    const done = await waitForFile(doneFile, deadline, `no consumer finished; run \`cuda-ipc consume ${out}\``, { what: 'the consumer\'s report' });
    report = done.identity;
    const ack = parseAck(done.text, doneFile);
    if (!ack.ok) {
      console.error(terminalSafe(`producer: consumer ${ack.pid} reported a failure: ${ack.message}`));
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
