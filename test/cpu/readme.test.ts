// The README cannot rot: every TypeScript block in it is type-checked as a new user's project
// would check it (`tsc --init`, strict, skipLibCheck false, the package imported as 'cuda-ipc'),
// and the CPU examples run and print what the README says they print; where there is a GPU, the
// GPU examples run too. Here against this checkout (dist/); test/cpu/package.test.ts does the same
// against the packed tarball with the newest TypeScript from the registry.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { readmeExamples, strictUserTsconfig, writePrograms, type ReadmeProgram } from '../helpers/readme.js';
import { noGpu } from '../helpers/gpu.js';
import { Device } from '../../src/index.js';
import { missingPackage } from '../helpers/tools.js';

const root = fileURLToPath(new URL('../../../', import.meta.url));
const noTypescript = missingPackage('typescript');
const tsc = noTypescript ? '' : createRequire(import.meta.url).resolve('typescript/bin/tsc');
const { programs, problems } = readmeExamples(join(root, 'README.md'));

test('every TypeScript block of the README is tagged cpu or gpu and belongs to a program', () => {
  assert.deepEqual(problems, []);
  assert.ok(programs.some((p) => p.kind === 'cpu' && p.expectedOutput), 'the README has a CPU example with its output');
});

/** A new user's app in a temporary directory: 'cuda-ipc' is this checkout, @types/node the one it develops with. */
function userApp(dir: string, overrides: Record<string, unknown> = {}): void {
  mkdirSync(join(dir, 'node_modules', '@types'), { recursive: true });
  symlinkSync(root, join(dir, 'node_modules', 'cuda-ipc'), 'dir');
  symlinkSync(join(root, 'node_modules', '@types', 'node'), join(dir, 'node_modules', '@types', 'node'), 'dir');
  writeFileSync(join(dir, 'package.json'), JSON.stringify({ name: 'readme-app', private: true, type: 'module' }));
  const init = spawnSync(process.execPath, [tsc, '--init'], { cwd: dir, encoding: 'utf8' });
  assert.equal(init.status, 0, init.stdout + init.stderr);
  writeFileSync(join(dir, 'tsconfig.json'), strictUserTsconfig(readFileSync(join(dir, 'tsconfig.json'), 'utf8'), overrides));
}

function compileAndRun(dir: string, chosen: readonly ReadmeProgram[], toRun: readonly ReadmeProgram[]): void {
  const entries = writePrograms(dir, chosen);
  const check = spawnSync(process.execPath, [tsc, '-p', dir], { cwd: dir, encoding: 'utf8' });
  assert.equal(check.status, 0, `the README examples do not compile:\n${check.stdout}${check.stderr}`);
  for (const p of toRun) {
    const r = spawnSync(process.execPath, [entries.get(p)!], { cwd: join(dir, p.name), encoding: 'utf8', timeout: 120_000 });
    console.log(`# README program '${p.name}' (line ${p.line}): exit ${r.status}`);
    assert.equal(r.status, 0, `README program '${p.name}' (line ${p.line}) failed:\n${r.stdout}${r.stderr}`);
    if (p.expectedOutput !== undefined) assert.equal(r.stdout, p.expectedOutput, `README program '${p.name}' printed something else than the README says`);
  }
}

test('the README examples type-check as a new user\'s strict project, and the CPU ones run and print what the README says', { skip: noTypescript }, () => {
  const dir = mkdtempSync(join(tmpdir(), 'cuda-ipc-readme-'));
  try {
    userApp(dir);
    console.log(`# ${programs.length} README programs (${programs.filter((p) => p.kind === 'cpu').map((p) => p.name).join(', ')} run here)`);
    compileAndRun(dir, programs, programs.filter((p) => p.kind === 'cpu'));
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

// The GPU examples use `using`; the README tells GPU users to set target es2022 so that TypeScript
// rewrites it for Node 20 and 22, and so does this test.
test('the GPU examples run and print what the README says, where there is a GPU', { skip: noGpu ?? noTypescript }, () => {
  const dir = mkdtempSync(join(tmpdir(), 'cuda-ipc-readme-gpu-'));
  try {
    userApp(dir, { target: 'es2022' });
    const gpus = Device.all().length;
    const gpu = programs.filter((p) => p.kind === 'gpu');
    const runnable = gpu.filter((p) => !p.twoGpus || gpus >= 2);
    for (const p of gpu.filter((q) => !runnable.includes(q))) console.log(`# README program '${p.name}' needs two GPUs; this machine has ${gpus}: not run`);
    compileAndRun(dir, gpu, runnable);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
