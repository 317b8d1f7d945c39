// The handoff benchmark: hand a fresh 1 MiB buffer to a child, which reads one value and
// acknowledges; the time is from allocating the buffer to having the ack and the buffer freed.
import { Device } from '../src/cuda/device.js';
import { DeviceBuffer } from '../src/cuda/buffer.js';
import { HostBuffer } from '../src/host/index.js';
import { spawn, type Link } from '../src/link/index.js';
import { summarize, type Summary } from './stats.js';

export const HANDOFF_BYTES = 1 << 20;

async function run(link: Link, make: () => { send: unknown; release: () => void }): Promise<number> {
  const t0 = process.hrtime.bigint();
  const { send, release } = make();
  link.send(send);
  await link.receive();
  release();
  return Number(process.hrtime.bigint() - t0) / 1000;
}

/** Runs each available handoff kind; returns microsecond summaries by name. */
export async function handoffBenchmarks(iterations: number, warmup: number, gpu: boolean): Promise<Map<string, Summary>> {
  const { child, link } = await spawn(new URL('./handoff-child.js', import.meta.url), [], { stdio: 'inherit' });
  const results = new Map<string, Summary>();
  let pool: import('../src/ipc/pool.js').IpcPool | undefined;
  try {
    const cases: Array<{ name: string; make: () => { send: unknown; release: () => void }; check: () => Promise<void> }> = [];
    // Correctness first: each kind hands over a marked buffer and the child must read the mark.
    const expectMark = async (send: unknown, release: () => void, mark: number, what: string) => {
      link.send(send);
      const got = await link.receive();
      release();
      if (got !== mark) throw new Error(`${what}: the child read ${String(got)}, not the marker ${mark}`);
    };
    cases.push({
      name: 'host buffer (memfd)',
      make: () => { const b = HostBuffer.allocate(HANDOFF_BYTES); return { send: b, release: () => b.close() }; },
      check: async () => { const b = HostBuffer.allocate(HANDOFF_BYTES); b.write(new Uint32Array([0xc0ffee])); await expectMark(b, () => b.close(), 0xc0ffee, 'host'); },
    });
    if (gpu) {
      const device = Device.get(0);
      const p = (pool = device.createIpcPool());
      cases.unshift({
        name: 'pool buffer (IPC pool)',
        make: () => { const b = p.allocate(HANDOFF_BYTES); return { send: b, release: () => b.close() }; },
        check: async () => { const b = p.allocate(HANDOFF_BYTES); b.write(new Uint32Array([0xbeef])); await expectMark(b, () => b.close(), 0xbeef, 'pool'); },
      });
      cases.splice(1, 0, {
        name: 'legacy handle (cuIpcGetMemHandle)',
        make: () => {
          const b = DeviceBuffer.allocate(HANDOFF_BYTES, { device });
          return { send: b, release: () => b.close() };
        },
        check: async () => { const b = DeviceBuffer.allocate(HANDOFF_BYTES, { device }); b.write(new Uint32Array([0xfeed])); await expectMark(b, () => b.close(), 0xfeed, 'legacy'); },
      });
    }
    for (const c of cases) {
      await c.check();
      for (let i = 0; i < warmup; i++) await run(link, c.make);
      const times = new Float64Array(iterations);
      for (let i = 0; i < iterations; i++) times[i] = await run(link, c.make);
      results.set(c.name, summarize(times));
    }
    // The control-plane floor: the same link carrying a number each way.
    const times = new Float64Array(iterations);
    for (let i = 0; i < warmup + iterations; i++) {
      const t0 = process.hrtime.bigint();
      link.send(4);
      await link.receive();
      if (i >= warmup) times[i - warmup] = Number(process.hrtime.bigint() - t0) / 1000;
    }
    results.set('link round trip, no buffer (floor)', summarize(times));
  } finally {
    pool?.close();
    link.send('end');
    await new Promise((r) => (child.exitCode !== null ? r(null) : child.once('exit', r)));
  }
  return results;
}
