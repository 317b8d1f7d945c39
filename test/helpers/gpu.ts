// GPU availability for tests: GPU tests run for real where a driver and device exist, and skip
// with the printed reason elsewhere.
import { probeDriver, driver } from '../../src/cuda/driver.js';

function reason(): string | undefined {
  const probe = probeDriver();
  if (!probe.ok) return `no CUDA driver here: ${probe.error.message}`;
  try {
    if (driver.deviceGetCount() === 0) return 'the CUDA driver sees no device';
  } catch (e) {
    return `no usable CUDA device: ${(e as Error).message}`;
  }
  return undefined;
}

/** undefined where a GPU is usable; otherwise the reason to skip, for `test(name, { skip }, fn)`. */
export const noGpu: string | undefined = reason();
export const hasGpu = noGpu === undefined;
