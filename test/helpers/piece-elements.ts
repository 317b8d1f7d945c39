// Walking a piece of a sharded layout element by element, for the references of the sharded tests
// (test/cpu/sharded-reference.ts, test/helpers/shard-group.ts): global index, local index, their
// byte positions.

/** Calls fn(global index, local index) for each element of a piece (none for an empty piece). */
export function eachElement(start: readonly number[], length: readonly number[], at: readonly number[], fn: (g: number[], l: number[]) => void): void {
  const k = length.map(() => 0);
  if (length.some((n) => n === 0)) return;
  for (;;) {
    fn(k.map((x, d) => start[d]! + x), k.map((x, d) => at[d]! + x));
    let d = length.length - 1;
    while (d >= 0 && ++k[d]! === length[d]!) k[d--] = 0;
    if (d < 0) return;
  }
}

/** The element number of index `idx` in a row-major tensor of `shape`. */
export const flatIndex = (shape: readonly number[], idx: readonly number[]): number => idx.reduce((f, x, d) => f * shape[d]! + x, 0);

/** The byte offset of index `idx` with byte `strides`. */
export const byteOffset = (strides: readonly number[], idx: readonly number[]): number => idx.reduce((o, x, d) => o + x * strides[d]!, 0);
