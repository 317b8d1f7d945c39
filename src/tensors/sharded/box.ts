// Boxes (start and length per dimension): volumes, intersections, and the two checks a local
// tensor needs (no two boxes overlap; boxes and padding leave no hole).
import type { Box } from './errors.js';

/** Elements in a box of these lengths (1 for no dimensions). */
export function volume(length: readonly number[]): number {
  let n = 1;
  for (const l of length) n *= l;
  return n;
}

/** The intersection of two boxes, or undefined when they share no element. */
export function intersect(a: Box, b: Box): Box | undefined {
  const start: number[] = [];
  const length: number[] = [];
  for (let i = 0; i < a.start.length; i++) {
    const s = Math.max(a.start[i]!, b.start[i]!);
    const e = Math.min(a.start[i]! + a.length[i]!, b.start[i]! + b.length[i]!);
    if (e <= s) return undefined;
    start.push(s);
    length.push(e - s);
  }
  return { start, length };
}

/** The first two boxes (by index, in start order) that overlap, and where; undefined when none do. */
export function boxesOverlap(boxes: readonly Box[]): [number, number, Box] | undefined {
  if (boxes.length < 2) return undefined;
  if (boxes[0]!.start.length === 0) return [0, 1, { start: [], length: [] }];
  // Sweep along dimension 0: only boxes whose first-dimension ranges meet can overlap.
  const order = boxes.map((_, i) => i).sort((a, b) => boxes[a]!.start[0]! - boxes[b]!.start[0]! || a - b);
  for (let x = 0; x < order.length; x++) {
    const a = boxes[order[x]!]!;
    const end = a.start[0]! + a.length[0]!;
    for (let y = x + 1; y < order.length && boxes[order[y]!]!.start[0]! < end; y++) {
      const range = intersect(a, boxes[order[y]!]!);
      if (range) return [Math.min(order[x]!, order[y]!), Math.max(order[x]!, order[y]!), range];
    }
  }
  return undefined;
}

/**
 * A box of `shape` that none of `boxes` covers (the boxes do not overlap), or undefined when they
 * cover all of it. Cheap when they do (volumes add up); otherwise a grid of the boxes' edges finds
 * the first uncovered cell.
 */
export function findHole(shape: readonly number[], boxes: readonly Box[]): Box | undefined {
  let covered = 0;
  for (const b of boxes) covered += volume(b.length);
  if (covered === volume(shape)) return undefined;
  const cuts = shape.map((n, d) => {
    const set = new Set<number>([0, n]);
    for (const b of boxes) {
      set.add(b.start[d]!);
      set.add(b.start[d]! + b.length[d]!);
    }
    return [...set].sort((x, y) => x - y);
  });
  const index = shape.map(() => 0);
  for (;;) {
    const cell = { start: index.map((k, d) => cuts[d]![k]!), length: index.map((k, d) => cuts[d]![k + 1]! - cuts[d]![k]!) };
    if (!boxes.some((b) => intersect(b, cell))) return cell;
    let d = shape.length - 1;
    while (d >= 0 && ++index[d]! === cuts[d]!.length - 1) index[d--] = 0;
    if (d < 0) return undefined;
  }
}
