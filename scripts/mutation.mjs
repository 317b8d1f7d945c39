#!/usr/bin/env node
// `npm run test:mutation [-- GROUP...]`: StrykerJS over the modules that hold bounds and checks,
// one group of stryker.config.mjs at a time (every group when none is named), then one table of
// mutation scores per module. Fails when a module scores under the floor (80%, or
// CUDA_IPC_MUTATION_FLOOR). Runs at a lower priority (nice 10, or CUDA_IPC_MUTATION_NICE) because
// it is long and machines are shared; concurrency 2 (CUDA_IPC_MUTATION_CONCURRENCY).
import { spawnSync } from 'node:child_process';
import { readFileSync, rmSync } from 'node:fs';
import { setPriority } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const { groups } = await import(join(root, 'stryker.config.mjs'));
const asked = process.argv.slice(2);
for (const g of asked) {
  if (!(g in groups)) {
    console.error(`test:mutation: no group "${g}"; the groups are ${Object.keys(groups).join(', ')}`);
    process.exit(2);
  }
}
const floor = Number(process.env.CUDA_IPC_MUTATION_FLOOR ?? 80);
try {
  setPriority(0, Number(process.env.CUDA_IPC_MUTATION_NICE ?? 10));
} catch {
  // Not allowed to change it here: run at the priority we have.
}

const rows = [];
let failed = false;
const started = Date.now();
for (const name of asked.length ? asked : Object.keys(groups)) {
  const report = join(root, 'reports', 'mutation', `${name}.json`);
  rmSync(report, { force: true });
  const t0 = Date.now();
  console.log(`\ntest:mutation: group ${name} (${groups[name].mutate.join(', ')})`);
  const r = spawnSync(process.execPath, [join(root, 'node_modules', '@stryker-mutator', 'core', 'bin', 'stryker.js'), 'run', 'stryker.config.mjs'], {
    cwd: root, stdio: 'inherit', env: { ...process.env, CUDA_IPC_MUTATION_GROUP: name },
  });
  const seconds = Math.round((Date.now() - t0) / 1000);
  let files;
  try {
    files = JSON.parse(readFileSync(report, 'utf8')).files;
  } catch {
    console.error(`test:mutation: group ${name} wrote no report (stryker exited ${r.status}); its output above says why`);
    failed = true;
    continue;
  }
  for (const [file, { mutants }] of Object.entries(files)) {
    const n = (s) => mutants.filter((m) => m.status === s).length;
    const detected = n('Killed') + n('Timeout');
    const undetected = n('Survived') + n('NoCoverage');
    const score = detected + undetected ? (100 * detected) / (detected + undetected) : 100;
    rows.push({ group: name, file, score, killed: n('Killed'), timeout: n('Timeout'), survived: n('Survived'), noCoverage: n('NoCoverage'), errors: n('RuntimeError') + n('CompileError'), seconds });
    if (score < floor) failed = true;
  }
}

console.log(`\ntest:mutation: mutation score per module (floor ${floor}%), ${Math.round((Date.now() - started) / 1000)} s in all`);
console.log('group       module                              score  killed timeout survived no-cov errors');
for (const r of rows) {
  console.log(`${r.group.padEnd(11)} ${r.file.padEnd(35)} ${r.score.toFixed(1).padStart(6)}% ${String(r.killed).padStart(6)} ${String(r.timeout).padStart(7)} ${String(r.survived).padStart(8)} ${String(r.noCoverage).padStart(6)} ${String(r.errors).padStart(6)}${r.score < floor ? '  UNDER THE FLOOR' : ''}`);
}
console.log('The surviving mutants are listed above, group by group; docs/MUTATION.md says why the known ones are equivalent.');
process.exit(failed ? 1 : 0);
