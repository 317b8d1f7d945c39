// The two-terminal example on host shared memory, where there is no usable GPU: the producer
// listens on a link and writes the link's name to FILE; the consumer connects, receives the
// memory (a memfd, passed over the link: nothing is copied), verifies and doubles it in place,
// closes its mapping and says so; the producer verifies in its own memory.
import { processGone } from '../processes.js';
import { IpcError } from '../errors.js';
import { HostBuffer } from '../host/index.js';
import { connect, listen, type Link, type Listener } from '../link/index.js';
import { onSignalsRemove, removeIfSame, writeFileAtomic, type Deadline, type FileIdentity } from './files.js';
import { fillPattern, findMismatch, firstFive, patternValue } from './pattern.js';
import { terminalSafe } from './terminal-text.js';
import { failedReply, tellPeer } from './peer-failure.js';

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
  /** The failure's error code, where it had one. */
  code?: string;
}

/** Whether FILE says it describes host memory (checkHostDescriptor then checks the rest). */
export function isHostDescriptor(value: unknown): value is { memory: 'host' } {
  const d = value as { memory?: unknown } | null;
  return typeof d === 'object' && d !== null && d.memory === 'host';
}

/** `value` as a HostDescriptor, every field checked: FILE may have been written by anyone who can write its directory. */
function checkHostDescriptor(value: { memory: 'host' }, file: string): HostDescriptor {
  const d = value as Partial<Record<keyof HostDescriptor, unknown>>;
  const n = Array.isArray(d.shape) && d.shape.length === 1 ? d.shape[0] : undefined;
  if (typeof d.link !== 'string' || !Number.isSafeInteger(d.pid) || (d.pid as number) <= 0 || d.dtype !== 'float32' || !Number.isSafeInteger(n) || (n as number) < 0) {
    throw new IpcError('ERR_DESCRIPTOR_INVALID', `${file} is not a descriptor that \`cuda-ipc produce\` writes: a host descriptor has a link name, a pid, dtype float32 and a shape of one length`);
  }
  return { memory: 'host', link: d.link, dtype: 'float32', shape: [n as number], pid: d.pid as number };
}

const floats = (b: HostBuffer) => new Float32Array(b.bytes.buffer, b.bytes.byteOffset, Math.floor(b.byteLength / 4));

function acceptWithin(listener: Listener, deadline: Deadline, hint: string): Promise<Link> {
  return listener.accept({ timeout: deadline.left() }).catch((e: unknown) => {
    if ((e as { code?: string }).code !== 'ERR_TIMEOUT') throw e;
    throw new IpcError('ERR_TIMEOUT', `no consumer connected within ${deadline}: ${hint}`, { cause: e });
  });
}

/** `wait` with what is left of `deadline`; its ERR_TIMEOUT says the real bound (--timeout) and `what` did not happen. */
async function within<T>(deadline: Deadline, what: string, wait: (timeout: number) => Promise<T>): Promise<T> {
  const left = deadline.left();
  if (left === 0) throw new IpcError('ERR_TIMEOUT', `${what} within ${deadline}`);
  try {
    return await wait(left);
  } catch (e) {
    if ((e as { code?: string }).code !== 'ERR_TIMEOUT') throw e;
    // The library's message names its option ('the timeout option'): here the bound is --timeout, said once.
    const why = ((e as { cause?: unknown }).cause as Error | undefined)?.message?.replace(/ \(the timeout option\)/g, '');
    throw new IpcError('ERR_TIMEOUT', `${what} within ${deadline}${why ? ` (${why})` : ''}`, { cause: e });
  }
}

export async function produceOnHost(out: string, n: number, deadline: Deadline, force: boolean): Promise<number> {
  using buffer = HostBuffer.allocate(n * 4);
  const values = floats(buffer);
  fillPattern(values);
  const name = `cuda-ipc-produce-${process.pid}`;
  const listener = listen(name);
  let written: FileIdentity | undefined;
  // Only the descriptor this process wrote is removed, and only while it is still that file.
  const cleanup = () => { listener.close(); if (written) removeIfSame(out, written); };
  onSignalsRemove(cleanup);
  try {
    const descriptor: HostDescriptor = { memory: 'host', link: name, dtype: 'float32', shape: [n], pid: process.pid };
    written = writeFileAtomic(out, JSON.stringify(descriptor, null, 2) + '\n', { replace: force ? 'own-regular-file' : 'never', what: 'the descriptor' });
    console.log(`producer ${process.pid}: ${n} float32 in host shared memory (memfd): ${firstFive(values)}, ...`);
    console.log(`descriptor written to ${out}; waiting for a consumer: cuda-ipc consume ${out}`);
    const link = (await acceptWithin(listener, deadline, `run \`cuda-ipc consume ${out}\``)) as Link<Ack, Handoff>;
    try {
      link.send({ buffer, elements: n });
      const ack = await within(deadline, `consumer ${link.peer.pid} did not report back`, (timeout) => link.receive({ timeout }));
      if (typeof ack !== 'object' || ack === null || typeof ack.ok !== 'boolean') {
        console.error(`producer: consumer ${link.peer.pid} sent something that is not a report`);
        return 1;
      }
      if (!ack.ok) {
        const code = typeof ack.code === 'string' && /^[A-Z][A-Z0-9_]{0,63}$/.test(ack.code) ? `[${ack.code}] ` : '';
        console.error(terminalSafe(`producer: consumer ${link.peer.pid} reported a failure: ${code}${String(ack.message)}`));
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

/**
 * The link to the producer of `d`. The producer listens before it writes FILE, so the socket of a
 * producer whose process is gone (killed) will not come back: one try says why (a stale socket, or
 * none) and ends the wait at once. A producer that runs is waited for until the deadline, and the
 * wait ends at once if its process ends meanwhile. (A try with timeout 0 is no probe of a live
 * producer: it may be accepted, then abandoned, and the producer would serve that dead link.)
 */
async function reachProducer(d: HostDescriptor, file: string, deadline: Deadline): Promise<Link<Handoff, Ack>> {
  const what = `could not reach the producer (pid ${d.pid}) on its link '${d.link}'`;
  const left = `${file} was left by a producer that ended without removing it (no process ${d.pid} runs now): remove it and start \`cuda-ipc produce --out ${file}\` again`;
  if (processGone(d.pid)) {
    try {
      return await connect<Handoff, Ack>(d.link, { timeout: 0 });
    } catch (e) {
      if ((e as { code?: string }).code === 'ERR_NO_LISTENER') throw new IpcError('ERR_NO_LISTENER', `${what}: ${(e as Error).message}. ${left}`, { cause: e });
      throw e;
    }
  }
  const gone = new AbortController();
  // Node has no event for another process's exit (no pidfd): a check every 200 ms, one stat of /proc.
  const watch = setInterval(() => { if (processGone(d.pid)) gone.abort(); }, 200);
  try {
    return await within(deadline, what, (timeout) => connect<Handoff, Ack>(d.link, { timeout, signal: gone.signal }));
  } catch (e) {
    if (gone.signal.aborted) throw new IpcError('ERR_NO_LISTENER', `${what}: its process ended while this consumer waited. ${left}`, { cause: e });
    throw e;
  } finally {
    clearInterval(watch);
  }
}

export async function consumeOnHost(value: { memory: 'host' }, file: string, deadline: Deadline): Promise<number> {
  const d = checkHostDescriptor(value, file);
  console.log(terminalSafe(`consumer ${process.pid}: ${file} describes host shared memory of process ${d.pid}; connecting to its link '${d.link}'`));
  const link = await reachProducer(d, file, deadline);
  try {
    let buffer: HostBuffer;
    try {
      ({ buffer } = await within(deadline, `the producer (pid ${d.pid}) sent no memory`, (timeout) => link.receive({ timeout })));
    } catch (e) {
      await tellPeer<Ack>(link, e, failedReply(e)); // the producer prints the same cause
      throw e;
    }
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
    await within(deadline, `the producer (pid ${d.pid}) did not take the report`, (timeout) => link.end({ timeout }));
    if (!ack.ok) throw new Error(ack.message);
    return 0;
  } finally {
    link.close();
  }
}
