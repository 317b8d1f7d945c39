// The public declarations as a user's project sees them: test/types/api.ts imports 'cuda-ipc' (the
// package's own exports, i.e. dist/src/*.d.ts) and is compiled with a new user's strict tsconfig
// (types: [], skipLibCheck: false), for nodenext and bundler resolution. It holds typed links,
// typed channel metadata, slots narrowed by `memory`, typed events, and lines that must not compile.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { createRequire } from 'node:module';
import { fileURLToPath } from 'node:url';
import { missingPackage } from '../helpers/tools.js';

const root = fileURLToPath(new URL('../../../', import.meta.url));
const skip = missingPackage('typescript');
const tsc = skip ? '' : createRequire(import.meta.url).resolve('typescript/bin/tsc');

function compile(extra: string[]): void {
  const args = [tsc, '-p', 'test/types/tsconfig.json', ...extra];
  console.log(`# ${['tsc', ...args.slice(1)].join(' ')}`);
  const r = spawnSync(process.execPath, args, { cwd: root, encoding: 'utf8' });
  assert.equal(r.status, 0, `test/types/api.ts does not compile:\n${r.stdout}${r.stderr}`);
}

test('the public types compile under a strict new-user tsconfig with nodenext resolution', { skip }, () => {
  compile([]);
});

test('the public types compile under a strict new-user tsconfig with bundler resolution', { skip }, () => {
  compile(['--module', 'esnext', '--moduleResolution', 'bundler']);
});
