// The API reference in docs/api is generated from the doc comments (scripts/docs.mjs, TypeDoc):
// it must document every export, and the committed pages must be what the comments say now.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { missingPackage } from '../helpers/tools.js';

const root = fileURLToPath(new URL('../../../', import.meta.url));

test('docs/api is generated from the current doc comments, and every export has one', { skip: missingPackage('typedoc') ?? missingPackage('typedoc-plugin-markdown') }, () => {
  const r = spawnSync(process.execPath, ['scripts/docs.mjs', '--check'], { cwd: root, encoding: 'utf8' });
  assert.equal(r.status, 0, `${r.stdout}${r.stderr}`);
  assert.match(r.stdout, /docs: docs\/api matches the doc comments \(\d+ pages\)/);
});
