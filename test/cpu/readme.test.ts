// The README cannot rot: every TypeScript block in it is type-checked as a new user's project
// would check it (`tsc --init`, strict, skipLibCheck false, the package imported as 'cuda-ipc'),
// and the CPU examples run and print what the README says they print. Here against this
// checkout (dist/); test/cpu/package.test.ts does the same against the packed tarball with the
// newest TypeScript from the registry.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { readmeExamples, strictUserTsconfig, writePrograms } from '../helpers/readme.js';

const root = fileURLToPath(new URL('../../../', import.meta.url));
const tsc = createRequire(import.meta.url).resolve('typescript/bin/tsc');
const { programs, problems } = readmeExamples(join(root, 'README.md'));

test('every TypeScript block of the README is tagged cpu or gpu and belongs to a program', () => {
  assert.deepEqual(problems, []);
  assert.ok(programs.some((p) => p.kind === 'cpu' && p.expectedOutput), 'the README has a CPU example with its output');
});

test('the README examples type-check as a new user\'s strict project, and the CPU ones run and print what the README says', () => {
  const dir = mkdtempSync(join(tmpdir(), 'cuda-ipc-readme-'));
  try {
    // The app: 'cuda-ipc' is this checkout, @types/node the one it develops with.
    mkdirSync(join(dir, 'node_modules', '@types'), { recursive: true });
    symlinkSync(root, join(dir, 'node_modules', 'cuda-ipc'), 'dir');
    symlinkSync(join(root, 'node_modules', '@types', 'node'), join(dir, 'node_modules', '@types', 'node'), 'dir');
    writeFileSync(join(dir, 'package.json'), JSON.stringify({ name: 'readme-app', private: true, type: 'module' }));
    const init = spawnSync(process.execPath, [tsc, '--init'], { cwd: dir, encoding: 'utf8' });
    assert.equal(init.status, 0, init.stdout + init.stderr);
    writeFileSync(join(dir, 'tsconfig.json'), strictUserTsconfig(readFileSync(join(dir, 'tsconfig.json'), 'utf8')));
    const entries = writePrograms(dir, programs);
    console.log(`# ${programs.length} README programs (${programs.filter((p) => p.kind === 'cpu').map((p) => p.name).join(', ')} run here)`);
    const check = spawnSync(process.execPath, [tsc, '-p', dir], { cwd: dir, encoding: 'utf8' });
    assert.equal(check.status, 0, `the README examples do not compile:\n${check.stdout}${check.stderr}`);
    for (const p of programs.filter((q) => q.kind === 'cpu')) {
      const r = spawnSync(process.execPath, [entries.get(p)!], { cwd: join(dir, p.name), encoding: 'utf8', timeout: 60_000 });
      assert.equal(r.status, 0, `README program '${p.name}' (line ${p.line}) failed:\n${r.stdout}${r.stderr}`);
      if (p.expectedOutput !== undefined) assert.equal(r.stdout, p.expectedOutput, `README program '${p.name}' printed something else than the README says`);
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
