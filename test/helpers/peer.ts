// Two-GPU availability for the peer tests: they run where GPUs 0 and 1 can reach each other, and
// skip with the printed reason elsewhere (their one-GPU variants run on GPU 0 alone).
import { noGpu } from './gpu.js';
import { driver } from '../../src/cuda/driver.js';

function reason(): string | undefined {
  if (noGpu) return noGpu;
  const n = driver.deviceGetCount();
  if (n < 2) return `needs two GPUs with peer access; this machine shows ${n} (CUDA_VISIBLE_DEVICES=${process.env.CUDA_VISIBLE_DEVICES ?? 'unset'})`;
  if (!driver.deviceCanAccessPeer(1, 0) || !driver.deviceCanAccessPeer(0, 1)) return 'GPUs 0 and 1 have no peer access to each other (cuDeviceCanAccessPeer)';
  return undefined;
}

/** undefined where GPUs 0 and 1 have peer access both ways; otherwise why two-GPU tests skip. */
export const noPeerPair: string | undefined = reason();

/** Polls `read` until it is within `tolerance` of `target` or `ms` pass; returns the last value. */
export async function settle(read: () => number, target: number, tolerance: number, ms = 10_000): Promise<number> {
  const until = Date.now() + ms;
  for (;;) {
    const v = read();
    if (Math.abs(v - target) <= tolerance || Date.now() > until) return v;
    await new Promise((r) => setTimeout(r, 50));
  }
}
