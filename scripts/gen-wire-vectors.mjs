#!/usr/bin/env node
// Regenerates test/vectors/ (the wire conformance vectors) with the current encoders: for each
// vector of test/helpers/wire-vectors.ts, NAME.hex (the bytes, 32 a line) and NAME.json (kind,
// note, the value they decode to). Build first (npx tsc -p tsconfig.json); run from the repo root:
//   node scripts/gen-wire-vectors.mjs
// Both test/cpu/wire-vectors.test.ts (Node) and python/tests/test_wire_vectors.py read the folder.
// A new record kind adds its codec and vectors there (and its decoder in the Python test).
import { mkdirSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = fileURLToPath(new URL('..', import.meta.url));
const { CODECS, VECTORS, hexLines } = await import(join(root, 'dist/test/helpers/wire-vectors.js'));
const dir = join(root, 'test/vectors');
mkdirSync(dir, { recursive: true });
for (const f of readdirSync(dir)) if (f.endsWith('.hex') || f.endsWith('.json')) rmSync(join(dir, f));
for (const v of VECTORS) {
  const bytes = CODECS[v.kind].encode(v.value);
  const decoded = CODECS[v.kind].decode(bytes, v.fds ?? 0);
  // What is recorded is what the bytes decode to (the value as the decoders give it back).
  writeFileSync(join(dir, `${v.name}.hex`), hexLines(bytes));
  writeFileSync(join(dir, `${v.name}.json`), `${JSON.stringify({ kind: v.kind, note: v.note, ...(v.fds ? { fds: v.fds } : {}), value: decoded }, null, 2)}\n`);
}
console.log(`gen-wire-vectors: ${VECTORS.length} vectors in ${dir}`);
