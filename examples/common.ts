// Shared by the examples: whether a GPU is usable, and small helpers for host-memory fallbacks.
import { Device } from '../src/index.js';

/** The device to use, or undefined when there is none (or --host was given). */
export function pickDevice(argv: readonly string[] = process.argv): Device | undefined {
  if (argv.includes('--host')) return undefined;
  try {
    return Device.all().length > 0 ? Device.get(0) : undefined;
  } catch {
    return undefined;
  }
}

export function flag(name: string, fallback: number, argv: readonly string[] = process.argv): number {
  const i = argv.indexOf(`--${name}`);
  if (i < 0) return fallback;
  const v = Number(argv[i + 1]);
  if (!Number.isSafeInteger(v) || v <= 0) throw new Error(`--${name} needs a positive integer`);
  return v;
}

/** A Uint32Array over host bytes (aligned: slots and buffers start on page boundaries). */
export function u32(bytes: Uint8Array): Uint32Array {
  return new Uint32Array(bytes.buffer, bytes.byteOffset, bytes.byteLength >>> 2);
}

/** Sum of all bytes of the little-endian u32 values v(i) for i in 0..n-1. */
export function byteSumOf(n: number, v: (i: number) => number): number {
  let s = 0;
  for (let i = 0; i < n; i++) {
    const x = v(i) >>> 0;
    s += (x & 0xff) + ((x >>> 8) & 0xff) + ((x >>> 16) & 0xff) + (x >>> 24);
  }
  return s;
}
