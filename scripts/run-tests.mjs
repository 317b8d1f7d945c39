#!/usr/bin/env node
// Runs every compiled test file under dist/test (or the folders given) with Node's test runner.
// A script rather than a glob so that it behaves the same on Node 20 and 22.
import { mkdtempSync, readdirSync, readFileSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, relative } from 'node:path';
import { spawnSync } from 'node:child_process';
import { fileURLToPath, pathToFileURL } from 'node:url';

import { coverageUnavailable, reportCoverage } from './coverage.mjs';

const OWN_FLAGS = ['--coverage', '--no-coverage'];
const roots = process.argv.slice(2).filter((a) => !a.startsWith('-'));
const flags = process.argv.slice(2).filter((a) => a.startsWith('-') && !OWN_FLAGS.includes(a));
// Coverage (scripts/coverage.mjs) for a whole run, or when asked; its floors only for a whole run.
const wholeRun = roots.length === 0;
const wantCoverage = process.argv.includes('--coverage') || (wholeRun && !process.argv.includes('--no-coverage'));
const files = [];
function walk(dir) {
  for (const name of readdirSync(dir).sort()) {
    const p = join(dir, name);
    if (statSync(p).isDirectory()) walk(p);
    else if (name.endsWith('.test.js')) files.push(p);
  }
}
for (const r of roots.length ? roots : ['dist/test']) {
  if (statSync(r).isDirectory()) walk(r);
  else files.push(r);
}
if (files.length === 0) {
  console.error('run-tests: no test files found; did the build (tsc) run?');
  process.exit(1);
}
// Node's summary says "skipped N" counting tests only: a suite skipped where there is no GPU
// (and the tests in it, which never run) is not in it. A second reporter records every skip, and
// the run ends with an honest count and the reasons.
const work = mkdtempSync(join(tmpdir(), 'cuda-ipc-tests-'));
const skipLog = join(work, 'skips.jsonl');
const noCoverage = wantCoverage ? coverageUnavailable() : undefined;
const coverageDir = wantCoverage && !noCoverage ? join(work, 'coverage') : undefined;
const reporters = flags.some((f) => f.startsWith('--test-reporter')) ? [] : [
  `--test-reporter=${process.stdout.isTTY ? 'spec' : 'tap'}`, '--test-reporter-destination=stdout',
  `--test-reporter=${pathToFileURL(join(dirname(fileURLToPath(import.meta.url)), 'skip-reporter.mjs')).href}`,
  `--test-reporter-destination=${skipLog}`,
];
// A test that hangs fails after 5 minutes, and a file whose tests are done exits even if it left a
// handle open (the failure of that file's tests says which), so a run always ends.
const r = spawnSync(
  process.execPath,
  ['--test', '--test-concurrency=1', '--test-timeout=300000', '--test-force-exit', ...reporters, ...flags, ...files],
  { stdio: 'inherit', env: coverageDir ? { ...process.env, NODE_V8_COVERAGE: coverageDir } : process.env },
);
if (reporters.length) printSkips(skipLog);
let covered = true;
if (coverageDir) {
  console.log('\nrun-tests: coverage of src (c8, mapped to the TypeScript sources):');
  covered = reportCoverage(coverageDir, wholeRun);
} else if (noCoverage) {
  console.log(`\nrun-tests: no coverage: ${noCoverage}`);
}
rmSync(work, { recursive: true, force: true });
const status = r.status ?? 1;
process.exit(status !== 0 ? status : covered ? 0 : 1);

function printSkips(file) {
  let lines = [];
  try {
    lines = readFileSync(file, 'utf8').split('\n').filter(Boolean).map((l) => JSON.parse(l));
  } catch {
    // No skip was recorded (or the run died first: its own output says so).
  }
  const count = (kind, n) => `${n} ${kind}${n === 1 ? '' : 's'}`;
  const both = (items) => {
    const suites = items.filter((s) => s.kind === 'suite').length;
    const tests = items.length - suites;
    return [suites && count('suite', suites), tests && count('test', tests)].filter(Boolean).join(' and ');
  };
  if (lines.length === 0) {
    console.log('\nrun-tests: nothing was skipped');
    return;
  }
  const suiteNote = lines.some((s) => s.kind === 'suite') ? ' (a skipped suite\'s tests did not run; Node\'s "skipped" above counts tests only)' : '';
  console.log(`\nrun-tests: skipped ${both(lines)}${suiteNote}:`);
  const byReason = new Map();
  for (const s of lines) byReason.set(s.reason, [...(byReason.get(s.reason) ?? []), s]);
  for (const [reason, items] of byReason) {
    console.log(`  ${both(items)}: ${reason}`);
    for (const s of items) console.log(`    - ${s.kind === 'suite' ? 'suite ' : ''}${s.name}${s.file ? ` (${relative(process.cwd(), s.file)})` : ''}`);
  }
}
