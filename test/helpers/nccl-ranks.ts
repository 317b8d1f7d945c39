// For the NCCL GPU tests: why they skip, ranks in child processes (test/fixtures/nccl-gpu-child.ts)
// driven over their links, and a guard that turns a hang into a failure.
import assert from 'node:assert/strict';
import { mkdtempSync, readdirSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { ChildProcess } from 'node:child_process';
import { noGpu } from './gpu.js';
import { driver } from '../../src/cuda/driver.js';
import { Device } from '../../src/cuda/device.js';
import { spawn, type Link } from '../../src/link/index.js';
import { loadNccl, type NcclLibrary } from '../../src/nccl/index.js';

export const GiB = 1 << 30;
export const MiB = 1 << 20;
const CHILD = new URL('../fixtures/nccl-gpu-child.js', import.meta.url);

/** The reason NCCL tests skip here (no GPU, no NCCL), or the library loadNccl found. */
export async function ncclOrReason(path?: string): Promise<NcclLibrary | string> {
  if (noGpu) return noGpu;
  try {
    return await loadNccl(path === undefined ? undefined : { path });
  } catch (e) {
    return `no usable NCCL: ${(e as Error).message}`;
  }
}

/** The reason a test needing `n` GPUs skips here, or undefined. NCCL refuses two ranks on one GPU of one host. */
export function fewerGpusThan(n: number): string | undefined {
  if (noGpu) return noGpu;
  const count = driver.deviceGetCount();
  return count < n ? `needs ${n} GPUs (NCCL refuses two ranks on one GPU); this machine shows ${count} (CUDA_VISIBLE_DEVICES=${process.env.CUDA_VISIBLE_DEVICES ?? 'unset'})` : undefined;
}

// NET_ENV and asOwnHost (an NCCL rank as a machine of its own) are the benches' too.
export { NET_ENV, asOwnHost } from '../../bench/nccl-env.js';

/** The GPU of rank `i` of a network-path test: GPU i where there are that many, else the last one (ranks as their own hosts share it). */
export function netRankDevice(i: number): Device {
  return Device.get(Math.min(i, driver.deviceGetCount() - 1));
}

/** Sends `msg` and waits (at most `ms`) for the reply; fails the test on { ok: false }. */
export async function ask(link: Link, msg: Record<string, unknown>, ms = 300_000): Promise<any> {
  link.send(msg);
  const reply = await link.receive({ signal: AbortSignal.timeout(ms) }) as any;
  assert.equal(reply?.ok, true, `the rank failed '${String(msg.op)}': ${JSON.stringify(reply)}`);
  return reply;
}

/** The code of within()'s failure. */
export const HANG = 'TEST_HANG';

/** `promise`, or a failure (code TEST_HANG) naming `what` after `ms`: a hang becomes a test failure, not a stuck run. */
export async function within<T>(promise: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(Object.assign(new Error(`${what} did not finish within ${ms} ms: it hangs`), { code: HANG })), ms);
  });
  try {
    return await Promise.race([promise, late]);
  } finally {
    clearTimeout(timer);
  }
}

export interface Rank {
  child: ChildProcess;
  link: Link;
  device: Device;
}

/** Child ranks on `devices` (each its working device), with `env` (or env(i) for the i-th) added to this process's. */
export async function spawnRanks(devices: readonly Device[], env: NodeJS.ProcessEnv | ((i: number) => NodeJS.ProcessEnv) = {}): Promise<Rank[]> {
  return Promise.all(devices.map(async (device, i) => {
    const { child, link } = await spawn(CHILD, [], { device, stdio: 'inherit', env: { ...process.env, ...(typeof env === 'function' ? env(i) : env) } });
    return { child, link, device };
  }));
}

/** Ends the child ranks: exit asked, else killed after 30 s. */
export async function endRanks(ranks: readonly Rank[]): Promise<void> {
  await Promise.all(ranks.map(async ({ child, link }) => {
    if (child.exitCode !== null || child.signalCode !== null) return;
    const exited = new Promise((r) => child.once('exit', r));
    if (!link.closed) link.send({ op: 'exit' });
    const timer = setTimeout(() => child.kill('SIGKILL'), 30_000);
    await exited;
    clearTimeout(timer);
  }));
}

/** A folder for NCCL_DEBUG_FILE logs of child ranks, and their text once written. */
export function ncclDebugLogs(): { env: NodeJS.ProcessEnv; text(): string } {
  const dir = mkdtempSync(join(tmpdir(), 'cuda-ipc-nccl-debug-'));
  return {
    env: { NCCL_DEBUG: 'INFO', NCCL_DEBUG_SUBSYS: 'INIT,NET,P2P,SHM', NCCL_DEBUG_FILE: join(dir, 'nccl.%h.%p.log') },
    text: () => readdirSync(dir).map((f) => readFileSync(join(dir, f), 'utf8')).join('\n'),
  };
}

/** GB/s of `bytes` in `ms`, for diagnostics. */
export function rate(bytes: number, ms: number): string {
  return `${(bytes / (ms / 1000) / 1e9).toFixed(1)} GB/s (${ms.toFixed(1)} ms)`;
}
