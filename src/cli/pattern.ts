// The known pattern of the examples: exact in float32 before and after doubling.
export const patternValue = (i: number) => (i % 4096) + 0.5;

export function fillPattern(a: Float32Array, scale = 1): void {
  for (let i = 0; i < a.length; i++) a[i] = patternValue(i) * scale;
}

/** Index of the first element that differs from the pattern times `scale`, or -1. */
export function findMismatch(a: Float32Array, scale = 1): number {
  for (let i = 0; i < a.length; i++) if (a[i] !== patternValue(i) * scale) return i;
  return -1;
}

export const firstFive = (a: ArrayLike<number>) => Array.from({ length: Math.min(5, a.length) }, (_, i) => a[i]).join(', ');
