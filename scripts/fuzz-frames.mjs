#!/usr/bin/env node
// Fuzzes link frame decoding: node scripts/fuzz-frames.mjs [--cases N] [--seed S] [--first I] [--device-kinds]
// Runs N cases (default 1,000,000) of mutated and random link frames (every frame type, messages
// with every kind of transfer record, right and wrong fd counts) through the link's frame reader
// in dist/ (build first: npx tsc -p .), with real fds. Prints counts by outcome and the time, and
// exits 1 if any case threw something other than an IpcError, leaked an fd, or left a received
// lease open. --device-kinds also starts from records of the device kinds (pool buffers, pools,
// legacy buffers, events). Each case has its own PRNG stream: `--first I --cases 1` replays case I.
import { fuzzRange } from './fuzz-options.mjs';
import { runFrameFuzz } from '../dist/test/fixtures/link-fuzzer.js';

const { cases, seed, first } = fuzzRange();
const deviceKinds = process.argv.includes('--device-kinds');
console.log(`fuzz-frames: seed ${seed}, cases ${first}..${first + cases - 1}${deviceKinds ? ', device kinds included' : ''}`);

const started = performance.now();
const total = { cases: 0, casesWithFds: 0, wrongFdCount: 0, leasesOpened: 0, outcomes: {}, failures: {}, slowestCaseMs: 0, slowestCase: -1 };
const chunk = 100_000;
for (let done = 0; done < cases; done += chunk) {
  const s = runFrameFuzz({ cases: Math.min(chunk, cases - done), seed, firstCase: first + done, deviceKinds, stopAtFirstFailure: false });
  for (const key of ['cases', 'casesWithFds', 'wrongFdCount', 'leasesOpened']) total[key] += s[key];
  for (const [k, n] of Object.entries(s.outcomes)) total.outcomes[k] = (total.outcomes[k] ?? 0) + n;
  for (const [k, f] of Object.entries(s.failures)) {
    total.failures[k] ??= { count: 0, first: f.first };
    total.failures[k].count += f.count;
  }
  if (s.slowestCaseMs > total.slowestCaseMs) Object.assign(total, { slowestCaseMs: s.slowestCaseMs, slowestCase: s.slowestCase });
  if (cases > chunk) process.stderr.write(`  ${done + Math.min(chunk, cases - done)} cases...\n`);
}
const seconds = (performance.now() - started) / 1000;
console.log(`cases:           ${total.cases} (${total.casesWithFds} with fds, ${total.wrongFdCount} with a wrong fd count)`);
for (const [k, n] of Object.entries(total.outcomes).sort()) console.log(`  ${k.padEnd(40)}${n}`);
console.log(`leases received: ${total.leasesOpened} (all ended when their values were disposed)`);
console.log(`slowest case:    ${total.slowestCaseMs.toFixed(2)} ms (case ${total.slowestCase})`);
console.log(`time:            ${seconds.toFixed(1)} s (${Math.round(total.cases / seconds)} cases/s)`);
const failures = Object.entries(total.failures);
if (failures.length === 0) {
  console.log('failures:        none');
} else {
  for (const [k, f] of failures) console.error(`FAIL ${k}: ${f.count} cases; first:\n${f.first}`);
  process.exit(1);
}
