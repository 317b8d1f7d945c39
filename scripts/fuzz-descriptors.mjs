#!/usr/bin/env node
// Fuzzes the descriptor decoders: node scripts/fuzz-descriptors.mjs [--cases N] [--seed S] [--first I]
// Runs N cases (default 1,000,000) of mutated binary and JSON descriptors against
// dist/src/ipc/descriptor.js (build first: npx tsc -p .), prints counts, and exits 1 on any
// exception other than an IpcError with a descriptor code, or on an accepted input that does not
// round-trip. Each case has its own PRNG stream, so `--first I --cases 1` replays case I alone.
import { fuzzRange } from './fuzz-options.mjs';
import { FuzzFailure, runDescriptorFuzz } from '../dist/test/cpu/descriptor-fuzzer.js';

const { cases, seed, first } = fuzzRange();
console.log(`fuzz-descriptors: seed ${seed}, cases ${first}..${first + cases - 1}`);

const started = performance.now();
const total = { cases: 0, binaryCases: 0, jsonCases: 0, decodedOk: 0, rejected: {} };
const chunk = 100_000;
try {
  for (let done = 0; done < cases; done += chunk) {
    const stats = runDescriptorFuzz({ cases: Math.min(chunk, cases - done), seed, firstCase: first + done });
    for (const key of ['cases', 'binaryCases', 'jsonCases', 'decodedOk']) total[key] += stats[key];
    for (const [code, n] of Object.entries(stats.rejected)) total.rejected[code] = (total.rejected[code] ?? 0) + n;
    if (cases > chunk) process.stderr.write(`  ${total.cases} cases...\n`);
  }
} catch (error) {
  console.error(error instanceof FuzzFailure ? `FAIL ${error.message}` : error);
  if (error instanceof FuzzFailure) console.error('cause:', error.cause);
  process.exit(1);
}
const seconds = (performance.now() - started) / 1000;
const rejected = Object.values(total.rejected).reduce((a, b) => a + b, 0);
console.log(`cases:        ${total.cases} (binary ${total.binaryCases}, json ${total.jsonCases})`);
console.log(`decoded ok:   ${total.decodedOk} (each re-validated and round-tripped)`);
console.log(`rejected:     ${rejected}`);
for (const [code, n] of Object.entries(total.rejected).sort()) console.log(`  ${code.padEnd(24)}${n}`);
console.log(`time:         ${seconds.toFixed(1)} s (${Math.round(total.cases / seconds)} cases/s)`);
