// Byte runs: what a copy does. A run is `count` blocks of `bytes` contiguous bytes; block i starts
// at srcOffset + i*srcStride in the source's local tensor and at dstOffset + i*dstStride in the
// destination's (count 1: one contiguous run, strides 0). One run is what cuMemcpy2D copies, a row
// of a copy kernel's table, or `count*bytes` packed bytes of an NCCL staging chunk. A plan keeps a
// pair's runs in one Float64Array, RUN_FIELDS numbers per run (integers below 2^53).

/** Numbers per run in a pair's `runs` table. */
export const RUN_FIELDS = 8;

/** One run of a plan, as an object (planRuns() makes these from a pair's table). */
export interface PlanRun {
  /** Index of the local tensor in the source rank's layout (its `sources`). */
  readonly srcTensor: number;
  /** Index of the local tensor in the destination rank's layout (its `destinations`). */
  readonly dstTensor: number;
  /** Byte offsets from each local tensor's first element. */
  readonly srcOffset: number;
  readonly dstOffset: number;
  /** Bytes per block, blocks, and the byte distance between blocks on each side (0 when count is 1). */
  readonly bytes: number;
  readonly count: number;
  readonly srcStride: number;
  readonly dstStride: number;
}

/** Appends runs to a flat list: the runs of one box copied from one local tensor to another. */
export class RunSink {
  readonly values: number[] = [];

  /**
   * The runs of a box of lengths `length` whose first element sits at byte `src` / `dst`, with the
   * two sides' byte strides (`srcStrides[ss + d]`, `dstStrides[ds + d]`): the innermost dimensions
   * contiguous on both sides become one block, the next dimension the count, the outer ones one run each.
   */
  box(srcTensor: number, dstTensor: number, src: number, dst: number, length: readonly number[], srcStrides: ArrayLike<number>, ss0: number, dstStrides: ArrayLike<number>, ds0: number, itemsize: number): void {
    let block = itemsize;
    let d = length.length - 1;
    while (d >= 0 && (length[d] === 1 || (srcStrides[ss0 + d] === block && dstStrides[ds0 + d] === block))) block *= length[d--]!;
    if (d < 0) {
      this.values.push(srcTensor, dstTensor, src, dst, block, 1, 0, 0);
      return;
    }
    const count = length[d]!;
    const ss = srcStrides[ss0 + d]!;
    const ds = dstStrides[ds0 + d]!;
    const outer: number[] = [];
    for (let i = 0; i < d; i++) if (length[i]! > 1) outer.push(i);
    const index = outer.map(() => 0);
    for (;;) {
      let s = src;
      let t = dst;
      for (let k = 0; k < outer.length; k++) {
        s += index[k]! * srcStrides[ss0 + outer[k]!]!;
        t += index[k]! * dstStrides[ds0 + outer[k]!]!;
      }
      this.values.push(srcTensor, dstTensor, s, t, block, count, ss, ds);
      let k = outer.length - 1;
      while (k >= 0 && ++index[k]! === length[outer[k]!]!) index[k--] = 0;
      if (k < 0) return;
    }
  }
}

/**
 * A pair's runs in their one order (destination tensor, destination offset, then source), the
 * adjacent ones merged: contiguous continuations grow a run, rows of equal size at equal
 * distances become one strided run. The same runs in any order give the same table.
 */
export function sortAndMerge(values: readonly number[]): Float64Array {
  const n = values.length / RUN_FIELDS;
  const order = new Uint32Array(n);
  for (let i = 0; i < n; i++) order[i] = i;
  const v = values;
  const compare = (a: number, b: number): number => {
    const x = a * RUN_FIELDS;
    const y = b * RUN_FIELDS;
    return v[x + 1]! - v[y + 1]! || v[x + 3]! - v[y + 3]! || v[x]! - v[y]! || v[x + 2]! - v[y + 2]!;
  };
  // Often already in order (one tensor after another): sort only when not.
  let sorted = true;
  for (let i = 1; i < n && sorted; i++) sorted = compare(i - 1, i) <= 0;
  if (!sorted) order.sort(compare);
  const out: number[] = [];
  for (let i = 0; i < n; i++) {
    const b = order[i]! * RUN_FIELDS;
    const a = out.length - RUN_FIELDS;
    if (a >= 0 && out[a] === v[b] && out[a + 1] === v[b + 1]) {
      const [aSrc, aDst, aBytes, aCount, aSs, aDs] = [out[a + 2]!, out[a + 3]!, out[a + 4]!, out[a + 5]!, out[a + 6]!, out[a + 7]!];
      const [bSrc, bDst, bBytes, bCount, bSs, bDs] = [v[b + 2]!, v[b + 3]!, v[b + 4]!, v[b + 5]!, v[b + 6]!, v[b + 7]!];
      if (aCount === 1 && bCount === 1 && bSrc === aSrc + aBytes && bDst === aDst + aBytes) {
        out[a + 4] = aBytes + bBytes;
        continue;
      }
      if (aBytes === bBytes) {
        if (aCount > 1 && (bCount === 1 || (bSs === aSs && bDs === aDs)) && bSrc === aSrc + aCount * aSs && bDst === aDst + aCount * aDs) {
          out[a + 5] = aCount + bCount;
          continue;
        }
        if (aCount === 1 && bSrc - aSrc >= aBytes && bDst - aDst >= aBytes && (bCount === 1 || (bSs === bSrc - aSrc && bDs === bDst - aDst))) {
          out[a + 5] = 1 + bCount;
          out[a + 6] = bSrc - aSrc;
          out[a + 7] = bDst - aDst;
          continue;
        }
      }
    }
    for (let k = 0; k < RUN_FIELDS; k++) out.push(v[b + k]!);
  }
  return Float64Array.from(out);
}

/** A pair's runs as objects. */
export function runsOf(table: Float64Array): PlanRun[] {
  const runs: PlanRun[] = [];
  for (let i = 0; i < table.length; i += RUN_FIELDS) {
    runs.push({
      srcTensor: table[i]!, dstTensor: table[i + 1]!, srcOffset: table[i + 2]!, dstOffset: table[i + 3]!,
      bytes: table[i + 4]!, count: table[i + 5]!, srcStride: table[i + 6]!, dstStride: table[i + 7]!,
    });
  }
  return runs;
}

/** Bytes a table moves. */
export function tableBytes(table: Float64Array): number {
  let n = 0;
  for (let i = 0; i < table.length; i += RUN_FIELDS) n += table[i + 4]! * table[i + 5]!;
  return n;
}
