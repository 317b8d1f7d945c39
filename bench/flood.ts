// The flood of issue 17: a parent sends `--messages` messages (default 20,000) of one 4 KiB
// HostBuffer each to a child that reads nothing for `--pause-ms` (default 3000), then reads them
// all. Run it under the descriptor limit of the issue (`ulimit -n 20000`).
// Modes: --mode naive sends in a loop and ignores what send() says (the issue's program; a full
// queue throws and ends the loop); --mode drain waits for 'drain' whenever send() returns false.
// Prints the peaks (queued messages, bytes and fds, open fds, RSS) and how the run ended.
import { once } from 'node:events';
import { readdirSync } from 'node:fs';
import { spawn } from '../src/link/index.js';
import { HostBuffer } from '../src/host/index.js';
import { IpcError } from '../src/errors.js';
import { benchArgs } from './args.js';

const values = benchArgs('bench/flood', 'usage: node dist/bench/flood.js [--messages 20000] [--pause-ms 3000] [--mode drain|naive] [--json]', {
  messages: { type: 'string', default: '20000' },
  'pause-ms': { type: 'string', default: '3000' },
  mode: { type: 'string', default: 'drain' },
  json: { type: 'boolean', default: false },
});
const messages = Number(values.messages);
const mode = values.mode as 'naive' | 'drain';

const peak = { queuedMessages: 0, queuedBytes: 0, queuedFds: 0, openFds: 0, rssMiB: 0 };
let fdError: string | undefined;
function sample(link: { sendQueue?: { messages: number; bytes: number; fds: number }; pendingSends: number }): void {
  const q = link.sendQueue ?? { messages: link.pendingSends, bytes: 0, fds: 0 };
  peak.queuedMessages = Math.max(peak.queuedMessages, q.messages);
  peak.queuedBytes = Math.max(peak.queuedBytes, q.bytes);
  peak.queuedFds = Math.max(peak.queuedFds, q.fds);
  try {
    peak.openFds = Math.max(peak.openFds, readdirSync('/proc/self/fd').length);
    peak.rssMiB = Math.max(peak.rssMiB, process.memoryUsage().rss / 2 ** 20);
  } catch (e) {
    fdError ??= `${(e as NodeJS.ErrnoException).code}: ${(e as Error).message}`;
  }
}

const { child, link } = await spawn(new URL('./flood-child.js', import.meta.url), [values['pause-ms']!], { stdio: 'inherit' });
const started = performance.now();
let sent = 0;
let falses = 0;
let refused: string | undefined;
const sampler = setInterval(() => sample(link as never), 20);
try {
  for (let i = 0; i < messages; i++) {
    const h = HostBuffer.allocate(4096);
    let ok: unknown;
    try {
      ok = link.send(h);
    } catch (e) {
      h.close();
      refused = e instanceof IpcError ? `${e.code}${e.limit ? ` (${e.limit})` : ''} after ${sent} sends` : String(e);
      break;
    }
    h.close();  // the lease keeps the memory until the child is done with it
    sent++;
    if (i % 64 === 0) sample(link as never);
    if (ok === false) {
      falses++;
      if (mode === 'drain') await once(link, 'drain');
    }
  }
  link.send({ done: true });
  const reply = (await link.receive()) as { got: number };
  clearInterval(sampler);
  const seconds = (performance.now() - started) / 1000;
  const result = { mode, messages, sent, sendReturnedFalse: falses, refused: refused ?? null, childGot: reply.got, seconds: Number(seconds.toFixed(2)), peak: { ...peak, rssMiB: Number(peak.rssMiB.toFixed(1)) }, fdError: fdError ?? null };
  console.log(values.json ? JSON.stringify(result) : result);
} catch (e) {
  clearInterval(sampler);
  console.log({ mode, sent, failedWith: String((e as Error)?.stack ?? e), peak, fdError });
  process.exitCode = 1;
} finally {
  link.close();
  if (child.exitCode === null) child.kill();
}
