// What bench/sharded-plan.ts and its per-rank child share: the records file (the records one
// after another: each says its own length at byte 8) and a digest of a plan's pairs.
import { createHash } from 'node:crypto';
import type { PlanPair } from '../src/tensors/sharded/index.js';

/** The records of a file written as the concatenation of layout records. */
export function splitRecords(buf: Buffer): Uint8Array[] {
  const out: Uint8Array[] = [];
  for (let p = 0; p < buf.length;) {
    const n = buf.readUInt32LE(p + 8);
    out.push(new Uint8Array(buf.subarray(p, p + n)));
    p += n;
  }
  return out;
}

/** SHA-256 of pairs: ranks, path, bytes and every run. */
export function pairsDigest(pairs: readonly PlanPair[]): string {
  const h = createHash('sha256');
  for (const p of pairs) {
    h.update(`${p.src} ${p.dst} ${p.path} ${p.bytes} ${p.runs.length};`);
    h.update(new Uint8Array(p.runs.buffer, p.runs.byteOffset, p.runs.byteLength));
  }
  return h.digest('hex');
}
