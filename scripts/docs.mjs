#!/usr/bin/env node
// The API reference: TypeDoc (with its markdown plugin, so that the pages read on GitHub) turns
// the doc comments of every export of src/index.ts into docs/api. Settings: typedoc.json; an
// export without a doc comment, or a public signature naming a type that is not exported, is an
// error. docs/api is committed; `--check` regenerates it elsewhere and fails when the committed
// pages differ (test/cpu/docs.test.ts runs that).
//
//   npm run docs               regenerate docs/api
//   node scripts/docs.mjs --check
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readdirSync, readFileSync, rmSync, statSync } from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { dirname, join, relative, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const committed = join(root, 'docs', 'api');
const check = process.argv.includes('--check');
const typedoc = join(dirname(createRequire(join(root, 'package.json')).resolve('typedoc/package.json')), 'bin', 'typedoc');

function files(dir) {
  const out = [];
  const walk = (d) => {
    for (const name of readdirSync(d).sort()) {
      const p = join(d, name);
      if (statSync(p).isDirectory()) walk(p);
      else out.push(relative(dir, p));
    }
  };
  try {
    walk(dir);
  } catch (e) {
    if (e.code !== 'ENOENT') throw e;
  }
  return out;
}

const out = check ? mkdtempSync(join(tmpdir(), 'cuda-ipc-api-')) : committed;
try {
  if (!check) rmSync(committed, { recursive: true, force: true });  // pages of removed exports go too
  const r = spawnSync(process.execPath, [typedoc, '--options', join(root, 'typedoc.json'), '--out', out], { cwd: root, encoding: 'utf8' });
  process.stdout.write(r.stdout);
  process.stderr.write(r.stderr);
  if (r.status !== 0) {
    console.error('docs: TypeDoc failed (above); every export needs a doc comment, and every type a public signature names must be exported');
    process.exit(1);
  }
  if (!check) {
    console.log(`docs: ${files(committed).length} pages in ${relative(root, committed)}`);
    process.exit(0);
  }
  const want = files(out);
  const have = files(committed);
  const differ = [
    ...want.filter((f) => !have.includes(f)).map((f) => `missing: ${f}`),
    ...have.filter((f) => !want.includes(f)).map((f) => `stale: ${f}`),
    ...want.filter((f) => have.includes(f) && readFileSync(join(out, f), 'utf8') !== readFileSync(join(committed, f), 'utf8')).map((f) => `differs: ${f}`),
  ];
  if (differ.length) {
    console.error(`docs: docs/api is out of date with the doc comments (${differ.length} pages):\n  ${differ.slice(0, 20).join('\n  ')}${differ.length > 20 ? '\n  ...' : ''}`);
    console.error('Run `npm run docs` and commit docs/api.');
    process.exit(1);
  }
  console.log(`docs: docs/api matches the doc comments (${want.length} pages)`);
} finally {
  if (check) rmSync(out, { recursive: true, force: true });
}
