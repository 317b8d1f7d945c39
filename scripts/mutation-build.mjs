#!/usr/bin/env node
// Stryker's build command, run in its sandbox (stryker.config.mjs): compiles the mutated sources,
// then makes the sandbox directory readable by others (Stryker creates it 0700). Tests that run a
// child as 'nobody' (listener-pending's maxPendingPerUid test, link-uid) check that 'nobody' can
// read the compiled fixtures and skip otherwise; with this they run in the sandbox as they do in
// the checkout, so the mutants they reach are tested, not counted as survivors.
import { spawnSync } from 'node:child_process';
import { chmodSync } from 'node:fs';

const r = spawnSync('npx', ['tsc', '-p', 'tsconfig.json'], { stdio: 'inherit' });
if (r.status !== 0) process.exit(r.status ?? 1);
chmodSync('.', 0o755);
