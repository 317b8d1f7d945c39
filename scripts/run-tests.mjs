#!/usr/bin/env node
// Runs every compiled test file under dist/test (or the folders given) with Node's test runner.
// A script rather than a glob so that it behaves the same on Node 20 and 22.
import { readdirSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { spawnSync } from 'node:child_process';

const roots = process.argv.slice(2).filter((a) => !a.startsWith('-'));
const flags = process.argv.slice(2).filter((a) => a.startsWith('-'));
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
// A test that hangs fails after 5 minutes, and a file whose tests are done exits even if it left a
// handle open (the failure of that file's tests says which), so a run always ends.
const r = spawnSync(process.execPath, ['--test', '--test-concurrency=1', '--test-timeout=300000', '--test-force-exit', ...flags, ...files], { stdio: 'inherit' });
process.exit(r.status ?? 1);
